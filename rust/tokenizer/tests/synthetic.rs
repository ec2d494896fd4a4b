//! Tokenizers built from tiny GGUF images written here: special-token
//! parsing, BOS/EOS rules, SentencePiece merges and byte fallback, streaming,
//! and the errors malformed metadata must produce.

use ember_gguf::GgufHeader;
use ember_tokenizer::{StreamDecoder, TokenType, Tokenizer, TokenizerError};

const T_U32: u32 = 4;
const T_I32: u32 = 5;
const T_F32: u32 = 6;
const T_BOOL: u32 = 7;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;

/// A GGUF v3 image with metadata only.
#[derive(Default)]
struct Gguf {
    kvs: Vec<u8>,
    n: u64,
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

impl Gguf {
    fn key(mut self, key: &str, ty: u32) -> Self {
        put_str(&mut self.kvs, key);
        self.kvs.extend_from_slice(&ty.to_le_bytes());
        self.n += 1;
        self
    }
    fn str(self, key: &str, v: &str) -> Self {
        let mut g = self.key(key, T_STRING);
        put_str(&mut g.kvs, v);
        g
    }
    fn u32(self, key: &str, v: u32) -> Self {
        let mut g = self.key(key, T_U32);
        g.kvs.extend_from_slice(&v.to_le_bytes());
        g
    }
    fn bool(self, key: &str, v: bool) -> Self {
        let mut g = self.key(key, T_BOOL);
        g.kvs.push(v as u8);
        g
    }
    fn array_header(self, key: &str, elem: u32, n: usize) -> Self {
        let mut g = self.key(key, T_ARRAY);
        g.kvs.extend_from_slice(&elem.to_le_bytes());
        g.kvs.extend_from_slice(&(n as u64).to_le_bytes());
        g
    }
    fn strs(self, key: &str, v: &[String]) -> Self {
        let mut g = self.array_header(key, T_STRING, v.len());
        for s in v {
            put_str(&mut g.kvs, s);
        }
        g
    }
    fn f32s(self, key: &str, v: &[f32]) -> Self {
        let mut g = self.array_header(key, T_F32, v.len());
        for x in v {
            g.kvs.extend_from_slice(&x.to_le_bytes());
        }
        g
    }
    fn i32s(self, key: &str, v: &[i32]) -> Self {
        let mut g = self.array_header(key, T_I32, v.len());
        for x in v {
            g.kvs.extend_from_slice(&x.to_le_bytes());
        }
        g
    }
    fn u32s(self, key: &str, v: &[u32]) -> Self {
        let mut g = self.array_header(key, T_U32, v.len());
        for x in v {
            g.kvs.extend_from_slice(&x.to_le_bytes());
        }
        g
    }
    fn header(&self) -> GgufHeader {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&self.n.to_le_bytes());
        b.extend_from_slice(&self.kvs);
        GgufHeader::parse(&b).unwrap()
    }
}

/// GPT-2's byte-to-character table.
fn byte_chars() -> Vec<char> {
    let mut out = Vec::new();
    let mut next = 256u32;
    for b in 0..256u32 {
        let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        out.push(if printable {
            char::from_u32(b).unwrap()
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap()
        });
    }
    out
}

const CTL: u32 = 256 + 6;
const UD: u32 = 256 + 7;
const EOS: u32 = 256 + 8;

/// A byte-level BPE vocabulary: the 256 byte characters, "hello" and " world"
/// by merges, a control token, a user-defined token and an end token.
fn bpe_parts() -> (Vec<String>, Vec<i32>, Vec<String>) {
    let mut tokens: Vec<String> = byte_chars().into_iter().map(String::from).collect();
    for t in ["he", "ll", "hell", "hello", "Ġw", "Ġworld"] {
        tokens.push(t.into());
    }
    tokens.push("<|ctl|>".into());
    tokens.push("<ud>".into());
    tokens.push("<|endoftext|>".into());
    let mut types = vec![1; tokens.len()];
    types[CTL as usize] = 3;
    types[UD as usize] = 4;
    types[EOS as usize] = 3;
    let merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "Ġwo r", "Ġwor l", "Ġworl d"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    (tokens, types, merges)
}

fn bpe(pre: &str) -> Gguf {
    let (tokens, types, merges) = bpe_parts();
    Gguf::default()
        .str("tokenizer.ggml.model", "gpt2")
        .str("tokenizer.ggml.pre", pre)
        .strs("tokenizer.ggml.tokens", &tokens)
        .i32s("tokenizer.ggml.token_type", &types)
        .strs("tokenizer.ggml.merges", &merges)
        .u32("tokenizer.ggml.bos_token_id", CTL)
        .u32("tokenizer.ggml.eos_token_id", EOS)
}

fn bpe_tok() -> Tokenizer {
    Tokenizer::from_gguf(&bpe("gpt-2").header()).unwrap()
}

fn ids_of(tok: &Tokenizer, pieces: &[&str]) -> Vec<u32> {
    pieces.iter().map(|p| tok.token_id(p).unwrap_or_else(|| panic!("{p:?} not a token"))).collect()
}

#[test]
fn bpe_merges_words() {
    let tok = bpe_tok();
    assert_eq!(tok.tokenize("hello world", false, false), ids_of(&tok, &["hello", "Ġworld"]));
    // Partial merges stop where the table does.
    assert_eq!(tok.tokenize("help", false, false), ids_of(&tok, &["he", "l", "p"]));
    assert_eq!(tok.detokenize(&tok.tokenize("hello world", false, false), false), "hello world");
}

#[test]
fn parse_special_off_and_on() {
    let tok = bpe_tok();
    let text = "hello<|ctl|>hello";
    let plain = tok.tokenize(text, false, false);
    assert_eq!(plain, ids_of(&tok, &["hello", "<", "|", "c", "t", "l", "|", ">", "hello"]));
    let parsed = tok.tokenize(text, false, true);
    let hello = tok.token_id("hello").unwrap();
    assert_eq!(parsed, [hello, CTL, hello]);
    // User-defined tokens are matched either way, as in llama.cpp.
    assert_eq!(tok.tokenize("hello<ud>hello", false, false), [hello, UD, hello]);
    // Control tokens render only when asked.
    assert_eq!(tok.detokenize(&parsed, false), "hellohello");
    assert_eq!(tok.detokenize(&parsed, true), text);
    assert_eq!(tok.detokenize(&plain, false), text);
    assert_eq!(tok.token_type(CTL), TokenType::Control);
    assert_eq!(tok.token_type(UD), TokenType::UserDefined);
}

/// A rendered chat prompt: the template's markup is special, the client's
/// words in it (byte ranges marked literal) are text even where they spell
/// a control token; user-defined tokens are matched there as anywhere.
#[test]
fn literal_ranges_keep_control_spellings_as_text() {
    let tok = bpe_tok();
    let text = "<|ctl|>hello<|ctl|>hello<ud>";
    let hello = tok.token_id("hello").unwrap();
    let client = (7, text.len()); // "hello<|ctl|>hello<ud>"
    let guarded = tok.tokenize_guarded(text, false, true, &[client]);
    let mut want = vec![CTL];
    want.extend(tok.tokenize("hello<|ctl|>hello", false, false));
    want.push(UD);
    assert_eq!(guarded, want);
    // A range touching only part of the spelling guards it too; none changes nothing.
    assert_eq!(tok.tokenize_guarded(text, false, true, &[(13, 14)])[..2], [CTL, hello]);
    assert_eq!(tok.tokenize_guarded(text, false, true, &[]), tok.tokenize(text, false, true));
    assert!(tok.control_spellings().contains(&"<|ctl|>".to_string()));
    assert!(!tok.control_spellings().contains(&"<ud>".to_string()), "a user-defined token is matched anyway");
}

#[test]
fn longer_special_spellings_win() {
    let (mut tokens, mut types, merges) = bpe_parts();
    tokens.push("<|ctl|><ud>".into());
    types.push(3);
    let long = tokens.len() as u32 - 1;
    let g = Gguf::default()
        .str("tokenizer.ggml.model", "gpt2")
        .str("tokenizer.ggml.pre", "gpt-2")
        .strs("tokenizer.ggml.tokens", &tokens)
        .i32s("tokenizer.ggml.token_type", &types)
        .strs("tokenizer.ggml.merges", &merges);
    let tok = Tokenizer::from_gguf(&g.header()).unwrap();
    assert_eq!(tok.tokenize("<|ctl|><ud><|ctl|>", false, true), [long, CTL]);
}

#[test]
fn bos_and_eos_follow_the_flags() {
    // gpt2 models add no BOS unless the file says so.
    let tok = bpe_tok();
    let hello = tok.token_id("hello").unwrap();
    assert_eq!(tok.tokenize("hello", true, false), [hello]);
    let tok = Tokenizer::from_gguf(
        &bpe("gpt-2").bool("tokenizer.ggml.add_bos_token", true).bool("tokenizer.ggml.add_eos_token", true).header(),
    )
    .unwrap();
    assert_eq!(tok.tokenize("hello", true, false), [CTL, hello, EOS]);
    assert_eq!(tok.tokenize("hello", false, false), [hello]);
    // llama3-style pre-tokenizers add BOS by default.
    let tok = Tokenizer::from_gguf(&bpe("llama-bpe").header()).unwrap();
    assert!(tok.add_bos());
    assert!(tok.is_eog(EOS));
    assert!(!tok.is_eog(CTL));
}

#[test]
fn stream_decoder_waits_for_whole_characters() {
    let tok = bpe_tok();
    // "é" has no token: it comes out as its two bytes' tokens.
    let ids = tok.tokenize("é!", false, false);
    assert_eq!(ids.len(), 3);
    let mut d = StreamDecoder::new(false);
    assert_eq!(d.push(&tok, ids[0]), "");
    assert_eq!(d.push(&tok, ids[1]), "é");
    assert_eq!(d.push(&tok, ids[2]), "!");
    // A stream cut inside a character flushes lossily.
    assert_eq!(d.push(&tok, ids[0]), "");
    assert_eq!(d.flush(), "\u{FFFD}");
    // Control tokens stream as nothing unless asked.
    assert_eq!(d.push(&tok, CTL), "");
    assert_eq!(StreamDecoder::new(true).push(&tok, CTL), "<|ctl|>");
}

/// A SentencePiece vocabulary: unknown, BOS, EOS, byte tokens, and pieces
/// whose scores decide the merge order.
fn spm(extra: impl FnOnce(Gguf) -> Gguf) -> Tokenizer {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    let pieces =
        [("▁", -1.0), ("a", -2.0), ("b", -2.0), ("c", -2.0), ("ab", -3.0), ("bc", -1.5), ("▁a", -4.0), ("▁abc", -0.5)];
    let mut scores = vec![0.0; tokens.len()];
    for (p, s) in pieces {
        tokens.push(p.into());
        types.push(1);
        scores.push(s);
    }
    let g = Gguf::default()
        .str("tokenizer.ggml.model", "llama")
        .strs("tokenizer.ggml.tokens", &tokens)
        .f32s("tokenizer.ggml.scores", &scores)
        .i32s("tokenizer.ggml.token_type", &types);
    Tokenizer::from_gguf(&extra(g).header()).unwrap()
}

#[test]
fn spm_merges_by_score_with_byte_fallback() {
    let tok = spm(|g| g);
    assert!(tok.add_bos() && tok.add_space_prefix());
    let id = |s: &str| tok.token_id(s).unwrap();
    // "▁abc": "bc" (-1.5) beats "ab" (-3), so "ab" never forms; "▁a" (-4)
    // joins next, and "▁a" + "bc" is a token of its own.
    let ids = tok.tokenize("abc", true, false);
    assert_eq!(ids, [1, id("▁abc")]);
    // Without "b" taken by "bc", "ab" forms and "▁a" never does.
    assert_eq!(tok.tokenize("ab", false, false), [id("▁"), id("ab")]);
    // The prefixed space is dropped from the first token only; after BOS it
    // stays, as in llama.cpp's detokenize.
    assert_eq!(tok.detokenize(&ids[1..], false), "abc");
    assert_eq!(tok.detokenize(&ids, false), " abc");
    // Characters without a token fall back to their UTF-8 bytes.
    let ids = tok.tokenize("aé", false, false);
    assert_eq!(ids, [id("▁a"), id("<0xC3>"), id("<0xA9>")]);
    assert_eq!(tok.detokenize(&ids, false), "aé");
    assert!(tok.is_eog(2));
}

#[test]
fn spm_without_space_prefix() {
    let tok = spm(|g| g.bool("tokenizer.ggml.add_space_prefix", false).bool("tokenizer.ggml.add_bos_token", false));
    let id = |s: &str| tok.token_id(s).unwrap();
    assert_eq!(tok.tokenize("ab c", true, false), [id("ab"), id("▁"), id("c")]);
    assert_eq!(tok.detokenize(&tok.tokenize("ab c", false, false), false), "ab c");
}

fn err(g: Gguf) -> TokenizerError {
    Tokenizer::from_gguf(&g.header()).expect_err("metadata should be refused")
}

fn base() -> Gguf {
    Gguf::default().str("tokenizer.ggml.model", "gpt2").str("tokenizer.ggml.pre", "gpt-2")
}

#[test]
fn malformed_metadata_is_refused_with_the_key() {
    let (tokens, types, merges) = bpe_parts();

    let e = err(base().strs("tokenizer.ggml.merges", &merges));
    assert!(matches!(&e, TokenizerError::Missing { key } if key == "tokenizer.ggml.tokens"), "{e}");

    let e = err(base().u32s("tokenizer.ggml.tokens", &[1, 2, 3]).strs("tokenizer.ggml.merges", &merges));
    assert!(matches!(&e, TokenizerError::BadEntry { key, index: 0, .. } if key == "tokenizer.ggml.tokens"), "{e}");

    let e = err(base().strs("tokenizer.ggml.tokens", &tokens));
    assert!(matches!(&e, TokenizerError::Missing { key } if key == "tokenizer.ggml.merges"), "{e}");

    let e = err(base().strs("tokenizer.ggml.tokens", &tokens).u32s("tokenizer.ggml.merges", &[7]));
    assert!(matches!(&e, TokenizerError::BadEntry { key, .. } if key == "tokenizer.ggml.merges"), "{e}");

    let mut bad = merges.clone();
    bad[3] = "hello".into();
    let e = err(base().strs("tokenizer.ggml.tokens", &tokens).strs("tokenizer.ggml.merges", &bad));
    assert!(matches!(&e, TokenizerError::BadEntry { key, index: 3, .. } if key == "tokenizer.ggml.merges"), "{e}");

    let e = err(base().strs("tokenizer.ggml.tokens", &tokens).str("tokenizer.ggml.merges", "h e"));
    assert!(matches!(&e, TokenizerError::WrongType { key, .. } if key == "tokenizer.ggml.merges"), "{e}");

    let e = err(base()
        .strs("tokenizer.ggml.tokens", &tokens)
        .strs("tokenizer.ggml.merges", &merges)
        .i32s("tokenizer.ggml.token_type", &types[..10]));
    assert!(matches!(&e, TokenizerError::Invalid { key, .. } if key == "tokenizer.ggml.token_type"), "{e}");

    let e = err(base()
        .strs("tokenizer.ggml.tokens", &tokens)
        .strs("tokenizer.ggml.merges", &merges)
        .f32s("tokenizer.ggml.scores", &[0.0; 3]));
    assert!(matches!(&e, TokenizerError::Invalid { key, .. } if key == "tokenizer.ggml.scores"), "{e}");

    let mut dup = tokens.clone();
    dup[EOS as usize] = "hello".into();
    let e = err(base().strs("tokenizer.ggml.tokens", &dup).strs("tokenizer.ggml.merges", &merges));
    assert!(matches!(&e, TokenizerError::DuplicateToken { first: 259, second: EOS, .. }), "{e}");

    // BOS asked for, but there is none (chatglm-bpe has no default BOS id).
    let e = err(Gguf::default()
        .str("tokenizer.ggml.model", "gpt2")
        .str("tokenizer.ggml.pre", "chatglm-bpe")
        .strs("tokenizer.ggml.tokens", &tokens)
        .strs("tokenizer.ggml.merges", &merges)
        .bool("tokenizer.ggml.add_bos_token", true));
    assert!(matches!(&e, TokenizerError::Invalid { key, .. } if key == "tokenizer.ggml.add_bos_token"), "{e}");
}

#[test]
fn unknown_models_and_pre_tokenizers_are_named() {
    let (tokens, _, merges) = bpe_parts();
    let e = err(Gguf::default().str("tokenizer.ggml.model", "t5").strs("tokenizer.ggml.tokens", &tokens));
    assert!(matches!(&e, TokenizerError::UnsupportedModel(m) if m == "t5"));
    assert!(e.to_string().contains("\"t5\""), "{e}");

    let e = err(Gguf::default()
        .str("tokenizer.ggml.model", "gpt2")
        .str("tokenizer.ggml.pre", "no-such-pre")
        .strs("tokenizer.ggml.tokens", &tokens)
        .strs("tokenizer.ggml.merges", &merges));
    assert!(matches!(&e, TokenizerError::UnknownPre(p) if p == "no-such-pre"));
    assert!(e.to_string().contains("no-such-pre"), "{e}");

    let e = err(Gguf::default()
        .str("tokenizer.ggml.model", "gpt2")
        .str("tokenizer.ggml.pre", "kimi-k2")
        .strs("tokenizer.ggml.tokens", &tokens)
        .strs("tokenizer.ggml.merges", &merges));
    assert!(matches!(&e, TokenizerError::UnsupportedPre(p) if p == "kimi-k2"), "{e}");

    let e = err(Gguf::default().strs("tokenizer.ggml.tokens", &tokens));
    assert!(matches!(&e, TokenizerError::Missing { key } if key == "tokenizer.ggml.model"), "{e}");
}

#[test]
fn every_listed_pre_tokenizer_loads() {
    for pre in [
        "default",
        "llama-bpe",
        "llama3",
        "qwen2",
        "smollm",
        "starcoder",
        "gpt-2",
        "falcon",
        "deepseek-llm",
        "deepseek-coder",
        "deepseek-v3",
        "gpt-4o",
        "tekken",
        "command-r",
        "stablelm2",
        "bloom",
        "chameleon",
        "seed-coder",
        "bailingmoe",
        "exaone-moe",
        "jais-2",
        "viking",
        "qwen35",
        "dbrx",
        "youtu",
        "afmoe",
        "tiny_aya",
        "laguna",
        "minicpm5",
        "glm5",
        "ufakzeka",
        "granite-embed-multi-97m",
        "spark2_5",
    ] {
        let tok = Tokenizer::from_gguf(&bpe(pre).header()).unwrap_or_else(|e| panic!("{pre}: {e}"));
        let text = "hello world <|ctl|> 123, naïve 日本!";
        assert_eq!(tok.detokenize(&tok.tokenize(text, false, false), false), text, "{pre}");
    }
}
