//! Pre-tokenization for byte-level BPE: the regex lists that
//! `tokenizer.ggml.pre` names, applied the way llama.cpp's `unicode_regex_split`
//! does, including its hand-written GPT-2 and Llama-3 splitters and its
//! "collapsed text" trick for Unicode classes.

use fancy_regex::Regex;

use crate::unicode::{self, Cat, Flags};
use crate::TokenizerError;

/// The GPT-2 regex. llama.cpp recognises this exact string and runs a
/// hand-written splitter instead, whose edge cases are the reference.
const GPT2_RE: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// The Llama-3 regex, likewise replaced by a hand-written splitter.
const LLAMA3_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const JAIS2_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}";
/// CJK ideographs, U+0800..U+4E00 and Hangul, as deepseek-coder writes them.
const DEEPSEEK_CJK_RE: &str = "[\u{4E00}-\u{9FA5}\u{0800}-\u{4E00}\u{AC00}-\u{D7FF}]+";
/// CJK ideographs, hiragana and katakana (deepseek-v3).
const DEEPSEEK3_CJK_RE: &str = "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+";
const DEEPSEEK3_RE: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;
const SPARK_RE: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"##;
const PORO_RE: &str = " ?[^(\\s|.,!?\u{2026}\u{3002}\u{FF0C}\u{3001}\u{0964}\u{06D4}\u{060C})]+";
const TEKKEN_RE: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_RE: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const BAILING_RE: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
const SEED_CODER_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
const EXAONE_MOE_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+";
const UFAKZEKA_RE: &str = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const MINICPM5_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TINY_AYA_RE: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const YOUTU_RE: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Hangul, CJK punctuation, bopomofo and CJK ideographs with kana (youtu).
const YOUTU_CJK_RE: &str = "[\u{AC00}-\u{D7A3}\u{3131}-\u{318E}]+|[\u{FF01}\u{2026}\u{201C}\u{201D}\u{2018}\u{2019}\u{2014}\u{FF1A}\u{FF1B}\u{FF0C}\u{3001}-\u{303F}\u{FE30}-\u{FE4F}]+|[\u{3105}-\u{312F}]+|[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+";
const GRANITE_EMB_MULTI_RE: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// CJK, kana, Thai, Lao, Khmer, Myanmar and Hangul blocks (afmoe).
const AFMOE_CJK_RE: &str = "[\u{4E00}-\u{9FFF}\u{3400}-\u{4DBF}\u{8C48}-\u{FAFF}\u{3040}-\u{309F}\u{30A0}-\u{30FF}\u{FF65}-\u{FF9F}\u{2F00}-\u{2FDF}\u{E40}-\u{E7F}\u{E80}-\u{EFF}\u{1780}-\u{17FF}\u{1000}-\u{109F}\u{AA60}-\u{AA7F}\u{A9E0}-\u{A9FF}\u{AC00}-\u{D7AF}\u{1100}-\u{11FF}]+";
/// Latin, Greek, Cyrillic and other cased scripts as deepseek-llm lists them.
const DEEPSEEK_LLM_LETTERS_RE: &str = "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+";
/// ASCII and full-width punctuation (deepseek-llm).
const DEEPSEEK_LLM_PUNCT_RE: &str = "\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+";
/// Names llama.cpp gives hand-written splitters instead of a regex.
const NEWLINES_RE: &str = r"[^\n]+|[\n]+";
const AFMOE_DIGITS_RE: &str = r"\p{AFMoE_digits}";
const TINY_AYA_DIGITS_RE: &str = r"\d{1,3}(?=(?:\d{3})*\b)";

/// How a pre-tokenizer name configures the BPE tokenizer, beyond its regexes.
pub(crate) struct PreConfig {
    pub patterns: &'static [&'static str],
    /// A word that is itself a token skips the merges (llama.cpp's `ignore_merges`).
    pub ignore_merges: bool,
    /// llama.cpp's `clean_spaces`: detokenize removes spaces before punctuation.
    pub clean_spaces: bool,
    /// The BOS default for this pre-tokenizer, before `add_bos_token` overrides it.
    pub add_bos: bool,
    /// Pre-tokenizers whose models have no BOS unless the metadata names one.
    pub no_default_bos: bool,
}

const fn pre(patterns: &'static [&'static str]) -> PreConfig {
    PreConfig { patterns, ignore_merges: false, clean_spaces: true, add_bos: false, no_default_bos: false }
}

/// Gemma 4's split: runs of newlines and runs of anything else, the merges
/// then running over each whole run (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_GEMMA4`).
const SPM_BPE: &[&str] = &["[^\n]+|[\n]+"];

impl PreConfig {
    /// SentencePiece-style BPE (Gemma 4).
    pub(crate) const fn spm_bpe() -> PreConfig {
        pre(SPM_BPE)
    }

    const fn keep_spaces(mut self) -> PreConfig {
        self.clean_spaces = false;
        self
    }
    const fn ignore_merges(mut self) -> PreConfig {
        self.ignore_merges = true;
        self
    }
    const fn bos(mut self) -> PreConfig {
        self.add_bos = true;
        self
    }
}

const DEFAULT: &[&str] = &[r"[\p{P}\$\+<=>\^~\|]+", GPT2_RE, r"\p{N}+", "[0-9][0-9][0-9]"];
const LLAMA3: &[&str] = &[LLAMA3_RE];
const GPT2: &[&str] = &[GPT2_RE];
const STARCODER: &[&str] = &[r"\p{N}", GPT2_RE];
const QWEN2: &[&str] = &[QWEN2_RE];
const QWEN35: &[&str] = &[QWEN35_RE];
const FALCON: &[&str] = &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2_RE, "[0-9][0-9][0-9]"];
const DEEPSEEK_CODER: &[&str] = &["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", DEEPSEEK_CJK_RE, r"\p{N}"];
const DEEPSEEK3: &[&str] = &[r"\p{N}{1,3}", DEEPSEEK3_CJK_RE, DEEPSEEK3_RE];
const SPARK: &[&str] = &[r"\p{N}{1,3}", DEEPSEEK3_CJK_RE, SPARK_RE, r"\p{N}"];
const PORO: &[&str] = &[PORO_RE];
const VIKING: &[&str] = &[PORO_RE, r"\p{N}"];
const TEKKEN: &[&str] = &[TEKKEN_RE];
const CHAMELEON: &[&str] = &[
    "<sentinel:[0-9]+>",
    "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    "([\\t\\n]|    |  )",
    r"\p{N}",
    r"[\p{P}!-/:-@\[-`{-~]",
    GPT2_RE,
];
const GPT4O: &[&str] = &[GPT4O_RE];
const BAILING: &[&str] = &[BAILING_RE];
const SEED_CODER: &[&str] = &[SEED_CODER_RE];
const EXAONE_MOE: &[&str] = &[EXAONE_MOE_RE];
const JAIS2: &[&str] = &[JAIS2_RE];
const UFAKZEKA: &[&str] = &[UFAKZEKA_RE];
const LAGUNA: &[&str] = &[NEWLINES_RE, QWEN2_RE];
const MINICPM5: &[&str] = &[r"\p{N}{1,3}", MINICPM5_RE];
const TINY_AYA: &[&str] = &[TINY_AYA_DIGITS_RE, TINY_AYA_RE];
const YOUTU: &[&str] = &[YOUTU_CJK_RE, YOUTU_RE];
const GRANITE_EMB_MULTI: &[&str] = &[GRANITE_EMB_MULTI_RE];
const AFMOE: &[&str] = &[AFMOE_DIGITS_RE, AFMOE_CJK_RE, DEEPSEEK3_RE];
const DEEPSEEK_LLM: &[&str] =
    &["[\r\n]", DEEPSEEK_LLM_LETTERS_RE, DEEPSEEK_LLM_PUNCT_RE, r"\s+$", DEEPSEEK_CJK_RE, r"\p{N}+"];

/// Pre-tokenizer names llama.cpp knows but ember does not implement:
/// sarvam-moe (SentencePiece-style BPE with its own space and EOS rules),
/// Kimi-K2's hand-written splitter, and superbpe's empty-match regex.
const UNSUPPORTED: &[&str] = &["sarvam-moe", "whitespace", "superbpe", "kimi-k2"];

/// llama.cpp's table from `tokenizer.ggml.pre` to pre-tokenizer (`llama_vocab::impl::load`).
pub(crate) fn pre_config(name: &str) -> Result<PreConfig, TokenizerError> {
    Ok(match name {
        "" | "default" => pre(DEFAULT),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
        | "jina-v5-nano" => pre(LLAMA3).ignore_merges().bos(),
        "dbrx" | "smaug-bpe" => pre(LLAMA3),
        "glm4" | "chatglm-bpe" => {
            let mut p = pre(LLAMA3);
            p.no_default_bos = true;
            p
        }
        "glm5" => {
            let mut p = pre(LLAMA3).ignore_merges();
            p.no_default_bos = true;
            p
        }
        "deepseek-llm" => pre(DEEPSEEK_LLM).keep_spaces(),
        "youtu" => pre(YOUTU).keep_spaces().ignore_merges(),
        "minicpm5" => pre(MINICPM5).ignore_merges(),
        "granite-embed-multi-97m" => pre(GRANITE_EMB_MULTI).keep_spaces().ignore_merges(),
        "tiny_aya" | "cohere2moe" => pre(TINY_AYA).keep_spaces(),
        "ufakzeka" => pre(UFAKZEKA).keep_spaces(),
        "afmoe" => pre(AFMOE).keep_spaces(),
        "laguna" => pre(LAGUNA).keep_spaces(),
        "deepseek-coder" => pre(DEEPSEEK_CODER).keep_spaces(),
        "deepseek-v3" | "hunyuan-dense" | "hy_v4" | "joyai-llm" => pre(DEEPSEEK3).keep_spaces(),
        "spark2_5" => pre(SPARK).keep_spaces(),
        "falcon" => pre(FALCON),
        "mpt" | "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0"
        | "mellum" | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" | "olmo" | "jais" | "exaone4" => {
            pre(GPT2)
        }
        "trillion" | "granite-docling" => pre(GPT2).keep_spaces(),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => pre(STARCODER),
        "command-r" | "smollm" => pre(STARCODER).keep_spaces(),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open" | "grok-2" => {
            pre(QWEN2).keep_spaces()
        }
        "stablelm2" | "megrez" => pre(QWEN2),
        "qwen35" => pre(QWEN35).keep_spaces(),
        "poro-chat" => pre(PORO).keep_spaces(),
        "bloom" | "gpt3-finnish" => pre(PORO),
        "viking" => pre(VIKING).keep_spaces(),
        "jais-2" => pre(JAIS2),
        "tekken" => pre(TEKKEN).keep_spaces().ignore_merges().bos(),
        "chameleon" => pre(CHAMELEON).keep_spaces().bos(),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => pre(GPT4O).keep_spaces(),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => pre(BAILING).keep_spaces(),
        "seed-coder" => pre(SEED_CODER).keep_spaces(),
        "exaone-moe" => pre(EXAONE_MOE),
        other if UNSUPPORTED.contains(&other) => return Err(TokenizerError::UnsupportedPre(other.to_owned())),
        other => return Err(TokenizerError::UnknownPre(other.to_owned())),
    })
}

enum Splitter {
    Gpt2,
    /// The Llama-3 (up to 3 digits), Qwen2 (1 digit) and Qwen3.5 (1 digit,
    /// marks join letters) splitters, one hand-written routine in llama.cpp.
    Words {
        max_digits: usize,
        marks: bool,
    },
    /// Runs of newlines and runs of everything else.
    Newlines,
    /// Digit runs cut into groups of three from the right.
    DigitGroups,
    /// A general regex. `collapsed` regexes use Unicode classes and run on
    /// llama.cpp's one-character-per-class stand-in text; the others run on
    /// the text itself with non-ASCII whitespace replaced by U+000B.
    Regex {
        re: Regex,
        collapsed: bool,
    },
}

/// A compiled pre-tokenizer: the regexes applied in turn, each splitting the
/// pieces the previous ones left.
pub(crate) struct PreTokenizer {
    splitters: Vec<Splitter>,
}

/// The stand-in characters llama.cpp gives non-ASCII codepoints per class.
const COLLAPSED_OTHER: char = '\u{D0}';
fn collapsed_char(cat: Cat) -> char {
    match cat {
        Cat::Number => '\u{D1}',
        Cat::Letter => '\u{D2}',
        Cat::Punct => '\u{D3}',
        Cat::Mark => '\u{D4}',
        Cat::Symbol => '\u{D5}',
        Cat::Other => COLLAPSED_OTHER,
    }
}

/// `\p{..}` classes llama.cpp rewrites, with the stand-in character and the
/// ASCII members of each class.
fn unicode_class(pat: &str) -> Option<(char, &'static str)> {
    let cat = match pat {
        r"\p{N}" => Cat::Number,
        r"\p{L}" | r"\p{Lu}" | r"\p{Ll}" | r"\p{Lt}" | r"\p{Lm}" | r"\p{Lo}" => Cat::Letter,
        r"\p{P}" => Cat::Punct,
        r"\p{M}" => Cat::Mark,
        r"\p{S}" => Cat::Symbol,
        _ => return None,
    };
    let ascii = match cat {
        Cat::Number => "0-9",
        Cat::Letter => "A-Za-z",
        Cat::Punct => r"!-#%-*,-/:-;?-@\[-\]_\{\}",
        Cat::Mark => "",
        Cat::Symbol => r"\$\+<->\^`\|\x7E",
        Cat::Other => unreachable!(),
    };
    Some((collapsed_char(cat), ascii))
}

fn uses_unicode_classes(pattern: &str) -> bool {
    [r"\p{N}", r"\p{L}", r"\p{P}", r"\p{M}", r"\p{S}", r"\p{Lu}", r"\p{Ll}", r"\p{Lt}", r"\p{Lm}", r"\p{Lo}"]
        .iter()
        .any(|c| pattern.contains(c))
}

/// Rewrites `\p{X}` into a class of the stand-in character plus the ASCII
/// members, as llama.cpp does (bracketed unless already inside a class).
fn collapse_pattern(pattern: &str) -> String {
    let b = pattern.as_bytes();
    let mut out = String::with_capacity(pattern.len() * 2);
    let mut inside = false;
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'[' && (i == 0 || b[i - 1] != b'\\') {
            out.push('[');
            inside = true;
            i += 1;
            continue;
        }
        if inside && b[i] == b']' && b[i - 1] != b'\\' {
            out.push(']');
            inside = false;
            i += 1;
            continue;
        }
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1] == b'p' && b[i + 2] == b'{' {
            if let Some(close) = pattern[i + 3..].find('}').map(|p| p + i + 3) {
                if close <= i + 10 {
                    if let Some((c, ascii)) = unicode_class(&pattern[i..=close]) {
                        if !inside {
                            out.push('[');
                        }
                        out.push(c);
                        out.push_str(ascii);
                        if !inside {
                            out.push(']');
                        }
                        i = close + 1;
                        continue;
                    }
                }
            }
        }
        // Collapsed patterns are ASCII (checked by the caller), so bytes are chars.
        out.push(b[i] as char);
        i += 1;
    }
    out
}

fn compile(pattern: &str) -> Result<Splitter, TokenizerError> {
    // llama.cpp picks its hand-written splitters by the exact pattern text.
    match pattern {
        GPT2_RE => return Ok(Splitter::Gpt2),
        LLAMA3_RE => return Ok(Splitter::Words { max_digits: 3, marks: false }),
        QWEN2_RE => return Ok(Splitter::Words { max_digits: 1, marks: false }),
        QWEN35_RE => return Ok(Splitter::Words { max_digits: 1, marks: true }),
        NEWLINES_RE => return Ok(Splitter::Newlines),
        AFMOE_DIGITS_RE | TINY_AYA_DIGITS_RE => return Ok(Splitter::DigitGroups),
        _ => {}
    }
    let collapsed = uses_unicode_classes(pattern);
    let source = if collapsed {
        if !pattern.is_ascii() {
            return Err(TokenizerError::Regex {
                pattern: pattern.to_owned(),
                problem: "mixes Unicode classes and non-ASCII characters".into(),
            });
        }
        collapse_pattern(pattern)
    } else {
        pattern.to_owned()
    };
    let re = fancy_regex::RegexBuilder::new(&source)
        .backtrack_limit(10_000_000)
        .build()
        .map_err(|e| TokenizerError::Regex { pattern: pattern.to_owned(), problem: e.to_string() })?;
    Ok(Splitter::Regex { re, collapsed })
}

impl PreTokenizer {
    pub fn new(patterns: &[&str]) -> Result<PreTokenizer, TokenizerError> {
        Ok(PreTokenizer { splitters: patterns.iter().map(|p| compile(p)).collect::<Result<_, _>>()? })
    }

    /// Splits `text` into words; the pieces cover the text exactly, in order.
    pub fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let cpts: Vec<char> = text.chars().collect();
        if cpts.is_empty() {
            return Vec::new();
        }
        let mut lens = vec![cpts.len()];
        let mut collapsed: Option<Haystack> = None;
        let mut plain: Option<Haystack> = None;
        for s in &self.splitters {
            lens = match s {
                Splitter::Gpt2 => split_gpt2(&cpts, &lens),
                &Splitter::Words { max_digits, marks } => split_words(&cpts, &lens, max_digits, marks),
                Splitter::Newlines => split_newlines(&cpts, &lens),
                Splitter::DigitGroups => split_digit_groups(&cpts, &lens),
                Splitter::Regex { re, collapsed: true } => {
                    split_regex(re, collapsed.get_or_insert_with(|| Haystack::collapsed(&cpts)), &lens)
                }
                Splitter::Regex { re, collapsed: false } => {
                    split_regex(re, plain.get_or_insert_with(|| Haystack::plain(&cpts)), &lens)
                }
            };
        }
        let mut words = Vec::with_capacity(lens.len());
        let mut iter = text.char_indices().map(|(i, _)| i).chain(std::iter::once(text.len()));
        let mut start = iter.next().unwrap_or(0);
        for &n in &lens {
            let mut end = start;
            for _ in 0..n {
                end = iter.next().unwrap_or(text.len());
            }
            words.push(&text[start..end]);
            start = end;
        }
        words
    }
}

/// A one-character-per-codepoint stand-in for the text, and where each
/// codepoint starts in it.
struct Haystack {
    text: String,
    starts: Vec<usize>,
}

impl Haystack {
    fn build(cpts: &[char], map: impl Fn(char) -> char) -> Haystack {
        let mut text = String::with_capacity(cpts.len() * 2);
        let mut starts = Vec::with_capacity(cpts.len() + 1);
        for &c in cpts {
            starts.push(text.len());
            text.push(map(c));
        }
        starts.push(text.len());
        Haystack { text, starts }
    }

    fn collapsed(cpts: &[char]) -> Haystack {
        Haystack::build(cpts, |c| {
            if c.is_ascii() {
                c
            } else if unicode::is_whitespace(c) {
                '\u{0B}'
            } else {
                collapsed_char(unicode::category(c))
            }
        })
    }

    fn plain(cpts: &[char]) -> Haystack {
        Haystack::build(cpts, |c| if !c.is_ascii() && unicode::is_whitespace(c) { '\u{0B}' } else { c })
    }
}

/// llama.cpp's `unicode_regex_split_stl`: within each piece, matches become
/// words and the text between matches becomes words of its own.
fn split_regex(re: &Regex, hay: &Haystack, lens: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(lens.len());
    let mut start = 0usize;
    for &len in lens {
        let (a, b) = (hay.starts[start], hay.starts[start + len]);
        let piece = &hay.text[a..b];
        let mut prev = 0usize;
        let mut pos = 0usize;
        while pos <= piece.len() {
            let m = match re.find_from_pos(piece, pos) {
                Ok(Some(m)) => m,
                // No match, or a backtracking blow-up: leave the rest whole.
                _ => break,
            };
            if m.start() > prev {
                out.push(piece[prev..m.start()].chars().count());
            }
            if m.end() > m.start() {
                out.push(piece[m.start()..m.end()].chars().count());
                prev = m.end();
                pos = m.end();
            } else {
                // An empty match: step past one character, as regex iterators do.
                pos = m.end() + piece[m.end()..].chars().next().map_or(1, |c| c.len_utf8());
            }
        }
        if prev < piece.len() {
            out.push(piece[prev..].chars().count());
        }
        start += len;
    }
    out
}

/// Shared scaffolding of llama.cpp's hand-written splitters: positions past
/// the current piece read as "no character".
struct Piece<'a> {
    cpts: &'a [char],
    ini: usize,
    end: usize,
    prev_end: usize,
    out: &'a mut Vec<usize>,
}

const OUT_OF_RANGE: u32 = u32::MAX;

impl Piece<'_> {
    #[inline]
    fn cpt(&self, pos: usize) -> u32 {
        if self.ini <= pos && pos < self.end {
            self.cpts[pos] as u32
        } else {
            OUT_OF_RANGE
        }
    }
    #[inline]
    fn flags(&self, pos: usize) -> Flags {
        if self.ini <= pos && pos < self.end {
            unicode::flags(self.cpts[pos])
        } else {
            Flags::default()
        }
    }
    #[inline]
    fn add(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.out.push(len);
        }
        self.prev_end = end;
        len
    }
}

fn is_char(c: u32, ch: char) -> bool {
    c == ch as u32
}

fn lower_ascii(c: u32) -> u32 {
    if (b'A' as u32..=b'Z' as u32).contains(&c) {
        c + 32
    } else {
        c
    }
}

/// Contractions `'s 't 'm 'd 're 've 'll` at `pos`: the length matched, or 0.
fn contraction(p: &Piece, pos: usize, fold_case: bool) -> usize {
    if !is_char(p.cpt(pos), '\'') || pos + 1 >= p.end {
        return 0;
    }
    let f = |c: u32| if fold_case { lower_ascii(c) } else { c };
    let next = f(p.cpt(pos + 1));
    if [b's', b't', b'm', b'd'].iter().any(|&c| next == c as u32) {
        return 2;
    }
    if pos + 2 < p.end {
        let nn = f(p.cpt(pos + 2));
        let pair = |a: u8, b: u8| next == a as u32 && nn == b as u32;
        if pair(b'r', b'e') || pair(b'v', b'e') || pair(b'l', b'l') {
            return 3;
        }
    }
    0
}

/// llama.cpp's `unicode_regex_split_custom_gpt2`.
fn split_gpt2(cpts: &[char], lens: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(lens.len());
    let mut start = 0;
    for &len in lens {
        let mut p = Piece { cpts, ini: start, end: start + len, prev_end: start, out: &mut out };
        start += len;
        let mut pos = p.ini;
        while pos < p.end {
            let cpt = p.cpt(pos);
            let flags = p.flags(pos);
            let n = contraction(&p, pos, false);
            if n > 0 {
                pos += p.add(pos + n);
                continue;
            }
            let space = is_char(cpt, ' ');
            let mut f2 = if space { p.flags(pos + 1) } else { flags };
            if f2.letter {
                pos += space as usize;
                while f2.letter {
                    pos += 1;
                    f2 = p.flags(pos);
                }
                p.add(pos);
                continue;
            }
            if f2.number {
                pos += space as usize;
                while f2.number {
                    pos += 1;
                    f2 = p.flags(pos);
                }
                p.add(pos);
                continue;
            }
            if !(f2.whitespace || f2.letter || f2.number) && f2.defined {
                pos += space as usize;
                while !(f2.whitespace || f2.letter || f2.number) && f2.defined {
                    pos += 1;
                    f2 = p.flags(pos);
                }
                p.add(pos);
                continue;
            }
            let mut n_ws = 0;
            while p.flags(pos + n_ws).whitespace {
                n_ws += 1;
            }
            if n_ws > 1 && p.cpt(pos + n_ws) != OUT_OF_RANGE {
                pos += n_ws - 1;
                p.add(pos);
                continue;
            }
            if n_ws > 0 {
                pos += n_ws;
                p.add(pos);
                continue;
            }
            pos += 1;
            p.add(pos);
        }
    }
    out
}

/// llama.cpp's `unicode_regex_split_custom_llama3`, `_qwen2` and `_qwen35`:
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`, with `\p{M}`
/// counted as letter when `marks`.
fn split_words(cpts: &[char], lens: &[usize], max_digits: usize, marks: bool) -> Vec<usize> {
    let mut out = Vec::with_capacity(lens.len());
    let mut start = 0;
    let letter = |f: Flags| f.letter || (marks && f.mark);
    for &len in lens {
        let mut p = Piece { cpts, ini: start, end: start + len, prev_end: start, out: &mut out };
        start += len;
        let mut pos = p.ini;
        while pos < p.end {
            let cpt = p.cpt(pos);
            let flags = p.flags(pos);
            let n = contraction(&p, pos, true);
            if n > 0 {
                pos += p.add(pos + n);
                continue;
            }
            let newline = is_char(cpt, '\r') || is_char(cpt, '\n');
            // [^\r\n\p{L}\p{N}]?\p{L}+
            if !(newline || flags.number) && (letter(flags) || letter(p.flags(pos + 1))) {
                pos += 1;
                while letter(p.flags(pos)) {
                    pos += 1;
                }
                p.add(pos);
                continue;
            }
            // \p{N}{1,max}
            if flags.number {
                let mut ini = pos;
                while p.flags(pos).number {
                    pos += 1;
                    if pos - ini >= max_digits {
                        p.add(pos);
                        ini = pos;
                    }
                }
                p.add(pos);
                continue;
            }
            // <space>?[^\s\p{L}\p{N}]+[\r\n]*  (llama.cpp tests the first
            // character's own flags for definedness, not the lookahead's)
            let space = is_char(cpt, ' ');
            let mut f2 = if space { p.flags(pos + 1) } else { flags };
            if !(f2.whitespace || letter(f2) || f2.number) && flags.defined {
                pos += space as usize;
                while !(f2.whitespace || letter(f2) || f2.number) && f2.defined {
                    pos += 1;
                    f2 = p.flags(pos);
                }
                let mut c2 = p.cpt(pos);
                while is_char(c2, '\r') || is_char(c2, '\n') {
                    pos += 1;
                    c2 = p.cpt(pos);
                }
                p.add(pos);
                continue;
            }
            let mut n_ws = 0;
            let mut last_newline_end = 0;
            while p.flags(pos + n_ws).whitespace {
                let c2 = p.cpt(pos + n_ws);
                if is_char(c2, '\r') || is_char(c2, '\n') {
                    last_newline_end = pos + n_ws + 1;
                }
                n_ws += 1;
            }
            // \s*[\r\n]+
            if last_newline_end > 0 {
                pos = last_newline_end;
                p.add(pos);
                continue;
            }
            // \s+(?!\S)
            if n_ws > 1 && p.cpt(pos + n_ws) != OUT_OF_RANGE {
                pos += n_ws - 1;
                p.add(pos);
                continue;
            }
            if n_ws > 0 {
                pos += n_ws;
                p.add(pos);
                continue;
            }
            pos += 1;
            p.add(pos);
        }
    }
    out
}

/// llama.cpp's `unicode_regex_split_custom_newlines` (`[^\n]+|[\n]+`).
fn split_newlines(cpts: &[char], lens: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(lens.len());
    let mut pos = 0;
    for &len in lens {
        let end = pos + len;
        while pos < end {
            let nl = cpts[pos] == '\n';
            let run = pos;
            while pos < end && (cpts[pos] == '\n') == nl {
                pos += 1;
            }
            out.push(pos - run);
        }
    }
    out
}

/// llama.cpp's `unicode_regex_split_custom_afmoe`: each digit run is cut
/// into a leading group of 1-2 digits and groups of three. Text before a run
/// is not cut off on its own; it joins the run's first group, and the
/// regexes that follow split it again.
fn split_digit_groups(cpts: &[char], lens: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(lens.len());
    let mut start = 0;
    for &len in lens {
        let mut p = Piece { cpts, ini: start, end: start + len, prev_end: start, out: &mut out };
        start += len;
        let mut pos = p.ini;
        while pos < p.end {
            if p.flags(pos).number {
                let first = pos;
                while pos < p.end && p.flags(pos).number {
                    pos += 1;
                }
                let count = pos - first;
                let lead = count % 3;
                let mut cur = first;
                if lead != 0 {
                    cur += lead;
                    p.add(cur);
                }
                while cur < first + count {
                    cur += 3;
                    p.add(cur);
                }
                continue;
            }
            pos += 1;
        }
        if p.prev_end < p.end {
            let end = p.end;
            p.add(end);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(patterns: &[&str], text: &str) -> Vec<String> {
        PreTokenizer::new(patterns).unwrap().split(text).into_iter().map(str::to_owned).collect()
    }

    #[test]
    fn gpt2_words() {
        assert_eq!(split(GPT2, "Hello world"), ["Hello", " world"]);
        assert_eq!(split(GPT2, "Hello  world"), ["Hello", " ", " world"]);
        assert_eq!(split(GPT2, "don't stop"), ["don", "'t", " stop"]);
        assert_eq!(split(GPT2, "x   "), ["x", "   "]);
        assert_eq!(split(GPT2, "a1b"), ["a", "1", "b"]);
    }

    #[test]
    fn starcoder_splits_digits_first() {
        assert_eq!(split(STARCODER, "abc 123"), ["abc", " ", "1", "2", "3"]);
    }

    #[test]
    fn llama3_words() {
        assert_eq!(split(LLAMA3, "Hello world 12345"), ["Hello", " world", " ", "123", "45"]);
        assert_eq!(split(LLAMA3, "I'M here\n\n"), ["I", "'M", " here", "\n\n"]);
        assert_eq!(split(QWEN2, "x 123"), ["x", " ", "1", "2", "3"]);
    }

    #[test]
    fn digit_groups_and_newlines() {
        assert_eq!(split(&[AFMOE_DIGITS_RE], "ab1234567c"), ["ab1", "234", "567", "c"]);
        assert_eq!(split(&[NEWLINES_RE], "a b\n\nc\n"), ["a b", "\n\n", "c", "\n"]);
    }

    #[test]
    fn qwen2_collapsed_regex() {
        assert_eq!(split(QWEN2, "Hello 日本 123!"), ["Hello", " 日本", " ", "1", "2", "3", "!"]);
        assert_eq!(split(&[UFAKZEKA_RE], "Hello 日本 123!"), ["Hello", " 日本", " ", "1", "2", "3", "!"]);
    }

    #[test]
    fn collapsing_rewrites_classes() {
        assert_eq!(collapse_pattern(r"\p{N}+"), "[\u{D1}0-9]+");
        assert_eq!(collapse_pattern(r"[^\s\p{L}]"), "[^\\s\u{D2}A-Za-z]");
    }

    #[test]
    fn every_supported_pre_compiles() {
        for p in [DEFAULT, LLAMA3, GPT2, STARCODER, QWEN2, QWEN35, FALCON, DEEPSEEK_CODER, DEEPSEEK3, SPARK, PORO]
            .into_iter()
            .chain([VIKING, TEKKEN, CHAMELEON, GPT4O, BAILING, SEED_CODER, EXAONE_MOE, JAIS2, UFAKZEKA, LAGUNA])
            .chain([MINICPM5, TINY_AYA, YOUTU, GRANITE_EMB_MULTI, AFMOE, DEEPSEEK_LLM])
        {
            let pt = PreTokenizer::new(p).unwrap();
            let text = "Hello, World! It's 2024: naïve café 日本語 ½ x²  \n\tend";
            assert_eq!(pt.split(text).concat(), text, "{p:?}");
        }
    }
}
