use std::time::Instant;
#[test]
fn t() {
    let dir = std::path::PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/ember/models");
    let g: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/golden/inputs-smollm2.json")).unwrap()).unwrap();
    let mut text = String::new();
    for s in g["strings"].as_array().unwrap().iter().chain(g["prompts"].as_array().unwrap()) { text.push_str(s.as_str().unwrap()); text.push('\n'); }
    let big = text.repeat(100);
    for name in ["gemma-3-270m-q4_k_m.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"] {
        let f = ember_gguf::GgufFile::open(dir.join(name)).unwrap();
        let mut best = f64::MAX;
        let mut bh = f64::MAX;
        for _ in 0..7 {
            let t = Instant::now();
            let _f2 = ember_gguf::GgufFile::open(dir.join(name)).unwrap();
            bh = bh.min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            let tok = ember_tokenizer::Tokenizer::from_gguf(&f).unwrap();
            best = best.min(t.elapsed().as_secs_f64());
            std::hint::black_box(tok);
        }
        eprintln!("{name}: header min {:.1} ms, tokenizer min {:.1} ms", bh * 1e3, best * 1e3);
        let tok = ember_tokenizer::Tokenizer::from_gguf(&f).unwrap();
        for ps in [false, true] {
            let t = Instant::now();
            let ids = tok.tokenize(&big, false, ps);
            let dt = t.elapsed().as_secs_f64();
            eprintln!("  tokenize {} KB parse_special={ps}: {:.1} ms ({} ids, {:.1} MB/s)", big.len()/1024, dt*1e3, ids.len(), big.len() as f64 / dt / 1e6);
            let t = Instant::now();
            let s = tok.detokenize(&ids, ps);
            eprintln!("  detokenize: {:.1} ms, equal={}", t.elapsed().as_secs_f64()*1e3, s == big);
        }
    }
}
