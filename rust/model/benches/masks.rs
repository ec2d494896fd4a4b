//! What a grammar mask costs over a real vocabulary: computing it for a new
//! parse state (a walk of the sorted vocabulary), finding it again in the
//! cache, and applying it to a row of logits.
//!
//!     cargo bench -p ember-model --bench masks [-- MODEL.gguf ...]
//!
//! Without arguments it runs on the two test models.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use ember_grammar::{Automaton, Matcher};
use ember_model::{LoadOptions, Model};

/// (grammar, prefixes whose states are measured)
const CASES: &[(&str, &str, &[&str])] = &[
    ("free string", r#"root ::= "\"" ([^"\\] | "\\" ["\\/bfnrt])* "\"""#, &["\"", "\"some words"]),
    (
        "object keys",
        r#"root ::= "{\"name\": \"" [a-z]{1,10} "\", \"age\": " [0-9]{1,3} "}""#,
        &["", "{\"na", "{\"name\": \"ab", "{\"name\": \"ab\", \"age\": 4"],
    ),
];

fn default_models() -> Vec<PathBuf> {
    let dir = std::env::var_os("EMBER_TEST_MODELS").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ember/models")
    });
    ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"].iter().map(|f| dir.join(f)).collect()
}

fn micros(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let args: Vec<PathBuf> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).map(PathBuf::from).collect();
    let files = if args.is_empty() { default_models() } else { args };
    for file in files {
        let model = Model::load(&file, LoadOptions { threads: 1, ..Default::default() }).expect("model loads");
        let t = Instant::now();
        let index = model.token_index();
        println!("\n{}: {} tokens, vocabulary indexed in {:.1} ms", file.display(), model.config.n_vocab, micros(t.elapsed()) / 1e3);
        println!("  {:12} {:>28} {:>9} {:>12} {:>10} {:>10}", "grammar", "after", "allowed", "compute µs", "cached µs", "apply µs");
        let mut logits = vec![0.5f32; model.config.n_vocab];
        for (name, gbnf, prefixes) in CASES {
            let a = Arc::new(Automaton::from_gbnf(gbnf).expect("grammar compiles"));
            for prefix in *prefixes {
                let mut m = Matcher::new(a.clone());
                assert!(m.advance(prefix.as_bytes()).unwrap());
                let t = Instant::now();
                let mask = m.mask(index).unwrap();
                let compute = t.elapsed();
                let reps = 1000;
                let t = Instant::now();
                for _ in 0..reps {
                    std::hint::black_box(m.mask(index).unwrap());
                }
                let cached = t.elapsed() / reps;
                let t = Instant::now();
                for _ in 0..100 {
                    mask.apply(std::hint::black_box(&mut logits));
                }
                let apply = t.elapsed() / 100;
                println!(
                    "  {name:12} {:>28} {:>9} {:>12.1} {:>10.2} {:>10.1}",
                    format!("{prefix:?}"),
                    mask.count(),
                    micros(compute),
                    micros(cached),
                    micros(apply)
                );
            }
        }
    }
}
