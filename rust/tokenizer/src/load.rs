//! Reading `tokenizer.ggml.*` metadata into a [`Tokenizer`], with llama.cpp's
//! defaults, overrides and inferences (`llama_vocab::impl::load`): special ids,
//! BOS/EOS flags, end-of-generation tokens and per-token attribute fixes.

use ember_gguf::{GgufHeader, Value};

use crate::pretokenize::{pre_config, PreConfig, PreTokenizer};
use crate::special::Specials;
use crate::vocab::{attr, FxHashMap, TokenType, Vocab};
use crate::{bpe, decode, spm, Algo, SpecialIds, Tokenizer, TokenizerError, TokenizerKind};

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";

fn wrong_type(key: &str, v: &Value, expected: &'static str) -> TokenizerError {
    TokenizerError::WrongType { key: key.into(), expected, found: format!("{} ({v})", v.type_name()) }
}

fn array<'h>(h: &'h GgufHeader, key: &str) -> Result<Option<&'h [Value]>, TokenizerError> {
    match h.get(key) {
        None => Ok(None),
        Some(v) => v.as_array().map(Some).ok_or_else(|| wrong_type(key, v, "an array")),
    }
}

fn entry_error(key: &str, index: usize, v: &Value, expected: &str) -> TokenizerError {
    TokenizerError::BadEntry {
        key: key.into(),
        index,
        problem: format!("is {} ({v}), expected {expected}", v.type_name()),
    }
}

/// `tokenizer.ggml.<name>` read as a bool, or `default`.
fn flag(h: &GgufHeader, name: &str, default: bool) -> Result<bool, TokenizerError> {
    Ok(h.get_bool_opt(&format!("tokenizer.ggml.{name}"))?.unwrap_or(default))
}

const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<\u{FF5C}end\u{2581}of\u{2581}sentence\u{FF5C}>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<\u{FF5C}fim\u{2581}begin\u{FF5C}>",
    "<PRE>",
    "\u{2581}<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<\u{FF5C}fim\u{2581}hole\u{FF5C}>",
    "<SUF>",
    "\u{2581}<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<\u{FF5C}fim\u{2581}end\u{FF5C}>",
    "<MID>",
    "\u{2581}<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Spellings that end generation whatever the metadata says (llama.cpp's list).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{FF5C}end\u{2581}of\u{2581}sentence\u{FF5C}>",
    "[e~[",
];

pub(crate) fn from_gguf(h: &GgufHeader) -> Result<Tokenizer, TokenizerError> {
    let model = match h.get(KEY_MODEL) {
        None => return Err(TokenizerError::Missing { key: KEY_MODEL.into() }),
        Some(v) => v.as_str().ok_or_else(|| wrong_type(KEY_MODEL, v, "a string"))?,
    };
    let kind = match model {
        "gpt2" => TokenizerKind::Bpe,
        "llama" => TokenizerKind::Spm,
        "gemma4" => TokenizerKind::SpmBpe,
        other => return Err(TokenizerError::UnsupportedModel(other.to_owned())),
    };
    // llama.cpp's `gemma4` model always reads its text with the `gemma4`
    // pre-tokenizer; a `gpt2` file that names that pre-tokenizer (or
    // granite-embed-multi's, the same) is SentencePiece-style BPE too.
    let pre_name = match kind {
        TokenizerKind::SpmBpe => "gemma4",
        _ => h.get_str_opt(KEY_PRE)?.unwrap_or(""),
    };
    let kind = match pre_name {
        "gemma4" | "granite-embed-multi-311m" => TokenizerKind::SpmBpe,
        _ => kind,
    };

    // The vocabulary.
    let tokens = array(h, KEY_TOKENS)?.ok_or_else(|| TokenizerError::Missing { key: KEY_TOKENS.into() })?;
    if tokens.is_empty() {
        return Err(TokenizerError::Invalid { key: KEY_TOKENS.into(), problem: "holds no tokens".into() });
    }
    if tokens.len() >= u32::MAX as usize {
        return Err(TokenizerError::Invalid { key: KEY_TOKENS.into(), problem: format!("{} tokens", tokens.len()) });
    }
    let n = tokens.len();
    let texts: Vec<&str> = tokens
        .iter()
        .enumerate()
        .map(|(i, v)| v.as_str().ok_or_else(|| entry_error(KEY_TOKENS, i, v, "a string")))
        .collect::<Result<_, _>>()?;
    let scores = match array(h, KEY_SCORES)? {
        None => vec![0.0; n],
        Some(a) => {
            if a.len() < n {
                return Err(TokenizerError::Invalid {
                    key: KEY_SCORES.into(),
                    problem: format!("has {} scores for {n} tokens", a.len()),
                });
            }
            a[..n]
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::F32(x) => Ok(*x),
                    Value::I32(x) => Ok(*x as f32),
                    _ => Err(entry_error(KEY_SCORES, i, v, "an f32 or i32 score")),
                })
                .collect::<Result<_, _>>()?
        }
    };
    let attrs = match array(h, KEY_TYPES)? {
        None => vec![attr::NORMAL; n],
        Some(a) => {
            if a.len() < n {
                return Err(TokenizerError::Invalid {
                    key: KEY_TYPES.into(),
                    problem: format!("has {} token types for {n} tokens", a.len()),
                });
            }
            a[..n]
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::I32(t) => Ok(TokenType::attr_of_gguf_type(*t as i64)),
                    _ => Err(entry_error(KEY_TYPES, i, v, "an i32 token type")),
                })
                .collect::<Result<_, _>>()?
        }
    };
    let mut vocab = Vocab::new(texts.iter().copied(), scores, attrs)
        .map_err(|(text, first, second)| TokenizerError::DuplicateToken { text, first, second })?;

    // Defaults per model, then per pre-tokenizer, then the file's overrides.
    let mut ids = SpecialIds::default();
    let (mut add_bos, mut add_eos, add_space_prefix_default, clean_spaces);
    let algo_pre;
    match kind {
        TokenizerKind::Spm => {
            ids.bos = Some(1);
            ids.eos = Some(2);
            ids.unk = Some(0);
            add_bos = true;
            add_eos = false;
            add_space_prefix_default = true;
            clean_spaces = false;
            algo_pre = None;
        }
        TokenizerKind::SpmBpe => {
            // No default ids: the file names them.
            add_bos = true;
            add_eos = false;
            add_space_prefix_default = false;
            clean_spaces = true;
            algo_pre = Some(PreConfig::spm_bpe());
        }
        TokenizerKind::Bpe => {
            let cfg = pre_config(pre_name)?;
            ids.bos = if cfg.no_default_bos { None } else { Some(11) };
            ids.eos = Some(11);
            add_bos = cfg.add_bos;
            add_eos = false;
            add_space_prefix_default = false;
            clean_spaces = cfg.clean_spaces;
            algo_pre = Some(cfg);
        }
    }
    let add_space_prefix = flag(h, "add_space_prefix", add_space_prefix_default)?;

    let read_id = |name: &str, slot: &mut Option<u32>| -> Result<(), TokenizerError> {
        *slot = slot.filter(|&i| (i as usize) < n);
        if let Some(v) = h.get_u64_opt(&format!("tokenizer.ggml.{name}"))? {
            // llama.cpp keeps the default when the file's id is out of range.
            if v < n as u64 {
                *slot = Some(v as u32);
            }
        }
        Ok(())
    };
    read_id("bos_token_id", &mut ids.bos)?;
    read_id("eos_token_id", &mut ids.eos)?;
    read_id("eot_token_id", &mut ids.eot)?;
    read_id("eom_token_id", &mut ids.eom)?;
    read_id("unknown_token_id", &mut ids.unk)?;
    read_id("seperator_token_id", &mut ids.sep)?;
    read_id("padding_token_id", &mut ids.pad)?;
    read_id("mask_token_id", &mut ids.mask)?;
    read_id("fim_pre_token_id", &mut ids.fim_pre)?;
    read_id("fim_suf_token_id", &mut ids.fim_suf)?;
    read_id("fim_mid_token_id", &mut ids.fim_mid)?;
    read_id("fim_pad_token_id", &mut ids.fim_pad)?;
    read_id("fim_rep_token_id", &mut ids.fim_rep)?;
    read_id("fim_sep_token_id", &mut ids.fim_sep)?;
    // Older names of the first three FIM ids.
    read_id("prefix_token_id", &mut ids.fim_pre)?;
    read_id("suffix_token_id", &mut ids.fim_suf)?;
    read_id("middle_token_id", &mut ids.fim_mid)?;
    add_bos = flag(h, "add_bos_token", add_bos)?;
    add_eos = flag(h, "add_eos_token", add_eos)?;
    if kind == TokenizerKind::SpmBpe {
        // llama.cpp overrides the flag for Gemma 4, whose files say false.
        add_bos = ids.bos.is_some();
    }
    if add_bos && ids.bos.is_none() {
        return Err(TokenizerError::Invalid {
            key: "tokenizer.ggml.add_bos_token".into(),
            problem: "is true, but tokenizer.ggml.bos_token_id is not set".into(),
        });
    }
    if add_eos && ids.eos.is_none() {
        return Err(TokenizerError::Invalid {
            key: "tokenizer.ggml.add_eos_token".into(),
            problem: "is true, but tokenizer.ggml.eos_token_id is not set".into(),
        });
    }

    // Special tokens the metadata does not name, found by spelling. Where
    // several spellings match, llama.cpp takes whichever its hash map yields
    // first; the lowest id is the deterministic stand-in (it agrees on
    // SmolLM2, whose `<|endoftext|>` llama.cpp picks over `<|im_end|>`).
    // Whatever is found is made a control token.
    fn force_control(vocab: &mut Vocab, id: u32) {
        vocab.attrs[id as usize] |= attr::CONTROL;
    }
    for (slot, texts) in [
        (&mut ids.eot, EOT_TEXTS),
        (&mut ids.eom, EOM_TEXTS),
        (&mut ids.fim_pre, FIM_PRE_TEXTS),
        (&mut ids.fim_suf, FIM_SUF_TEXTS),
        (&mut ids.fim_mid, FIM_MID_TEXTS),
        (&mut ids.fim_pad, FIM_PAD_TEXTS),
        (&mut ids.fim_rep, FIM_REP_TEXTS),
        (&mut ids.fim_sep, FIM_SEP_TEXTS),
    ] {
        if slot.is_none() {
            if let Some(id) = texts.iter().filter_map(|t| vocab.find(t)).min() {
                *slot = Some(id);
                force_control(&mut vocab, id);
            }
        }
    }

    // Control tokens spelled with "unused" are unused.
    for id in 0..n {
        let a = vocab.attrs[id];
        if a & attr::CONTROL != 0 && a & attr::UNUSED == 0 && vocab.text(id as u32).contains("unused") {
            vocab.attrs[id] |= attr::UNUSED;
        }
    }

    // End of generation.
    let mut eog: Vec<u32> = [ids.fim_pad, ids.fim_rep, ids.fim_sep].into_iter().flatten().collect();
    for t in EOG_TEXTS {
        if let Some(id) = vocab.find(t) {
            eog.push(id);
            force_control(&mut vocab, id);
        }
    }
    // gpt-oss: these structure tokens always render.
    for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(id) = vocab.find(t) {
            vocab.attrs[id as usize] = attr::USER_DEFINED;
        }
    }
    eog.extend([ids.eos, ids.eot, ids.eom].into_iter().flatten());
    eog.sort_unstable();
    eog.dedup();
    let find_eog = |vocab: &Vocab, eog: &[u32], text: &str| eog.iter().copied().find(|&id| vocab.text(id) == text);
    // o200k_harmony and solar-open: with `<|return|>` and `<|call|>` (or
    // `<|calls|>` and `<|flush|>`), `<|end|>` ends a message, not generation.
    if let Some(end) = find_eog(&vocab, &eog, "<|end|>") {
        let call = find_eog(&vocab, &eog, "<|call|>").is_some() || find_eog(&vocab, &eog, "<|calls|>").is_some();
        let ret = find_eog(&vocab, &eog, "<|return|>").is_some();
        let flush = find_eog(&vocab, &eog, "<|flush|>").is_some();
        if call && (ret || flush) {
            eog.retain(|&id| id != end);
            vocab.attrs[end as usize] = attr::USER_DEFINED;
        }
    }
    // Gemma 4 and PaddleOCR: `</s>` is an ordinary token there.
    if find_eog(&vocab, &eog, "<|tool_response>").is_some() {
        if let Some(s) = find_eog(&vocab, &eog, "</s>") {
            eog.retain(|&id| id != s);
            vocab.attrs[s as usize] = attr::NORMAL;
        }
    }

    // Per-model strip attributes llama.cpp sets by name.
    let model_name = h.get_str_opt("general.name")?.unwrap_or("").to_lowercase();
    let arch = h.get_str_opt("general.architecture")?.unwrap_or("");
    fn set_attr(vocab: &mut Vocab, text: &str, bit: u16, on: bool) {
        if let Some(id) = vocab.find(text) {
            let a = &mut vocab.attrs[id as usize];
            *a = if on { *a | bit } else { *a & !bit };
        }
    }
    if ["jina-v2-de", "jina-v2-es", "jina-v2-code"].iter().any(|p| pre_name.contains(p))
        || ["nomic-bert-moe", "jina-bert-v3"].iter().any(|a| arch.contains(a))
    {
        set_attr(&mut vocab, "<mask>", attr::LSTRIP, true);
    } else if model_name.contains("phi-3") || model_name.contains("phi3") {
        for a in vocab.attrs.iter_mut() {
            if *a & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0 {
                *a |= attr::RSTRIP;
            }
        }
        set_attr(&mut vocab, "</s>", attr::RSTRIP, true);
        for t in ["<unk>", "<s>", "<|endoftext|>"] {
            set_attr(&mut vocab, t, attr::RSTRIP, false);
        }
    } else if model_name.contains("modern-bert") {
        set_attr(&mut vocab, "[MASK]", attr::LSTRIP, true);
    }

    // The tokenizer proper.
    let algo = match algo_pre {
        None => Algo::Spm { byte_ids: Box::new(spm::byte_fallback_ids(&vocab, ids.unk)) },
        Some(cfg) => {
            let merges_v = array(h, KEY_MERGES)?.ok_or_else(|| TokenizerError::Missing { key: KEY_MERGES.into() })?;
            let mut pairs = Vec::with_capacity(merges_v.len());
            for (i, v) in merges_v.iter().enumerate() {
                let s = v.as_str().ok_or_else(|| entry_error(KEY_MERGES, i, v, "a string"))?;
                // The first space after the first byte separates the parts.
                let Some(sp) = s.as_bytes().iter().skip(1).position(|&b| b == b' ').map(|p| p + 1) else {
                    return Err(TokenizerError::BadEntry {
                        key: KEY_MERGES.into(),
                        index: i,
                        problem: format!("{s:?} has no space between its two parts"),
                    });
                };
                pairs.push((&s[..sp], &s[sp + 1..]));
            }
            let spm_style = kind == TokenizerKind::SpmBpe;
            let merges = bpe::Merges::new(&vocab, pairs.into_iter(), cfg.ignore_merges, !spm_style);
            Algo::Bpe { merges: Box::new(merges), pre: PreTokenizer::new(cfg.patterns)?, escape_spaces: spm_style }
        }
    };

    let specials = Specials::new(&vocab);
    let mut pieces = Vec::with_capacity(vocab.text_bytes() + 64);
    let mut piece_offsets = Vec::with_capacity(n + 1);
    piece_offsets.push(0u32);
    for id in 0..n as u32 {
        decode::piece_bytes(kind, vocab.text(id), vocab.attrs[id as usize], &mut pieces);
        piece_offsets.push(pieces.len() as u32);
    }

    Ok(Tokenizer {
        vocab,
        algo,
        kind,
        model: model.to_owned(),
        pre: pre_name.to_owned(),
        pieces,
        piece_offsets,
        specials,
        ids,
        eog,
        add_bos,
        add_eos,
        add_space_prefix,
        clean_spaces,
        word_cache: std::sync::Mutex::new(FxHashMap::default()),
    })
}
