//! The tokenizers of the two test models against llama.cpp's own output
//! (tests/golden): every string, with and without special-token parsing, and
//! every prompt with BOS by the model's rule, must come out id for id.

mod common;

use std::time::Instant;

use common::{golden, ids, model, GEMMA3, SMOLLM2};
use ember_gguf::GgufFile;
use ember_tokenizer::{StreamDecoder, Tokenizer};

fn load(name: &str) -> Option<Tokenizer> {
    let path = model(name)?;
    let t0 = Instant::now();
    let file = GgufFile::open(&path).unwrap();
    let t1 = Instant::now();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    // Well under a second in release (about 60 ms for Gemma's 262k tokens);
    // the bound only catches a blow-up, with room for a busy test machine.
    assert!(t1.elapsed().as_secs_f64() < 3.0, "{name}: tokenizer took {:?} to load", t1.elapsed());
    eprintln!(
        "{name}: {} tokens; GGUF header {:.1} ms, tokenizer {:.1} ms",
        tok.n_vocab(),
        (t1 - t0).as_secs_f64() * 1e3,
        t1.elapsed().as_secs_f64() * 1e3
    );
    Some(tok)
}

/// Checks one model against its golden file, reporting every difference
/// before failing.
fn check(model_file: &str, golden_file: &str) {
    let Some(tok) = load(model_file) else { return };
    let g = golden(golden_file);
    let mut failures = Vec::new();
    let mut checked = 0;

    for t in g["tokenize"].as_array().unwrap() {
        let text = t["text"].as_str().unwrap();
        for (parse_special, key) in [(false, "ids"), (true, "ids_parse_special")] {
            checked += 1;
            let want = ids(&t[key]);
            let got = tok.tokenize(text, false, parse_special);
            if got != want {
                failures.push(format!("{text:?} parse_special={parse_special}:\n  want {want:?}\n  got  {got:?}"));
                continue;
            }
            // Decoding gives the text back: control tokens only appear when
            // parsed, and then render by their spelling.
            let back = tok.detokenize(&got, parse_special);
            if back != text {
                failures.push(format!("{text:?} parse_special={parse_special}: detokenizes to {back:?}"));
            }
            let mut stream = StreamDecoder::new(parse_special);
            let mut streamed: String = got.iter().map(|&id| stream.push(&tok, id)).collect();
            streamed.push_str(&stream.flush());
            if streamed != text {
                failures.push(format!("{text:?} parse_special={parse_special}: streams to {streamed:?}"));
            }
        }
    }

    for c in g["cases"].as_array().unwrap() {
        checked += 1;
        let prompt = c["prompt"].as_str().unwrap();
        let want = ids(&c["prompt_ids"]);
        let got = tok.tokenize(prompt, true, true);
        if got != want {
            failures.push(format!("prompt {prompt:?}:\n  want {want:?}\n  got  {got:?}"));
            continue;
        }
        let bos = if tok.add_bos() { tok.token_text(tok.bos().unwrap()) } else { "" };
        let back = tok.detokenize(&got, true);
        if back != format!("{bos}{prompt}") {
            failures.push(format!("prompt {prompt:?}: detokenizes to {back:?}"));
        }
    }

    eprintln!("{model_file}: {}/{checked} tokenizations equal llama.cpp's", checked - failures.len());
    assert!(failures.is_empty(), "{} of {checked} differ from llama.cpp:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn smollm2_matches_llama_cpp() {
    check(SMOLLM2, "smollm2-135m-instruct-q4_1.json");
}

#[test]
fn gemma3_matches_llama_cpp() {
    check(GEMMA3, "gemma-3-270m-q4_k_m.json");
}

#[test]
fn smollm2_metadata() {
    let Some(tok) = load(SMOLLM2) else { return };
    assert_eq!(tok.model_name(), "gpt2");
    assert_eq!(tok.pre_name(), "smollm");
    assert_eq!(tok.n_vocab(), 49152);
    assert_eq!((tok.bos(), tok.eos()), (Some(1), Some(2)));
    assert!(!tok.add_bos());
    let im_end = tok.token_id("<|im_end|>").unwrap();
    let endoftext = tok.token_id("<|endoftext|>").unwrap();
    assert!(tok.is_eog(im_end) && tok.is_eog(endoftext));
    assert!(!tok.is_eog(tok.token_id("<|im_start|>").unwrap()));
    // llama.cpp's choice when several spellings could be EOT.
    assert_eq!(tok.eot(), Some(endoftext));
    // Control tokens render only when asked.
    assert_eq!(tok.token_to_piece(im_end, false), b"");
    assert_eq!(tok.token_to_piece(im_end, true), b"<|im_end|>");
    assert_eq!(tok.token_bytes(tok.token_id("Ġworld").unwrap()), b" world");
}

#[test]
fn gemma3_metadata() {
    let Some(tok) = load(GEMMA3) else { return };
    assert_eq!(tok.model_name(), "llama");
    assert_eq!(tok.n_vocab(), 262144);
    assert_eq!((tok.bos(), tok.eos()), (Some(2), Some(1)));
    assert!(tok.add_bos() && !tok.add_space_prefix());
    let eot = tok.token_id("<end_of_turn>").unwrap();
    assert!(tok.is_eog(eot) && tok.is_eog(1));
    assert!(tok.is_unused(tok.token_id("<unused0>").unwrap()));
    // Byte fallback: a character with no token of its own comes out as bytes
    // that decode back to it.
    let text = "\u{10FFFD}";
    let ids = tok.tokenize(text, false, false);
    assert!(ids.len() > 1 && ids.iter().all(|&id| tok.token_type(id) == ember_tokenizer::TokenType::Byte), "{ids:?}");
    assert_eq!(tok.detokenize(&ids, false), text);
    // A character split across tokens streams out once whole.
    let mut d = tok.stream_decoder();
    let parts: Vec<String> = ids.iter().map(|&id| d.push(&tok, id)).collect();
    assert!(parts[..parts.len() - 1].iter().all(|p| p.is_empty()));
    assert_eq!(parts.last().unwrap(), text);
}
