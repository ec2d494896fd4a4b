//! pp/tg rates of one GGUF file, for profiling the forward pass without Python:
//!
//!     cargo run --profile profiling -p ember-model --example throughput -- FILE [PP] [TG] [THREADS] [REPS] [DEPTH] [KV]
//!
//! DEPTH tokens are in the context before each test (llama-bench's `-d`),
//! read once: each test's tokens are cut off again after it;
//! KV is the cache type (f16, the default, bf16, f32 or q8_0).

use std::time::Instant;

use ember_model::{KvType, LoadOptions, Logits, Model};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).expect("usage: throughput FILE [PP] [TG] [THREADS] [REPS] [DEPTH] [KV]");
    let arg = |i: usize, d: usize| args.get(i).map(|s| s.parse().expect("a number")).unwrap_or(d);
    let (n_pp, n_tg, threads, reps, depth) = (arg(2, 512), arg(3, 128), arg(4, 0), arg(5, 3), arg(6, 0));
    let kv = args.get(7).map(|s| KvType::parse(s).expect("a cache type: f16, bf16, f32 or q8_0")).unwrap_or(KvType::F16);
    let model = Model::load(path, LoadOptions { threads, no_repack: std::env::var_os("EMBER_NO_REPACK").is_some(), ..Default::default() }).expect("model loads");
    let n_vocab = model.config.n_vocab as u32;
    let prompt: Vec<u32> = (0..n_pp as u32).map(|i| (1 + i * 7919) % n_vocab).collect();
    let held: Vec<u32> = (0..depth as u32).map(|i| (2 + i * 7919) % n_vocab).collect();
    let mut s = model.new_session(depth + n_pp.max(n_tg).max(1), 512, kv);
    if depth > 0 {
        model.prefill(&mut s, &held, Logits::Last).expect("depth pass");
    }
    // A sliding window's ring keeps room for a pass beyond the window, so the
    // held positions survive a test's tokens.
    let cut = |s: &mut ember_model::Session| assert_eq!(s.cache.truncate(depth), depth, "the depth is held again");
    for rep in 0..=reps {
        let mut line = format!("rep {rep}:");
        if n_pp > 0 {
            let t0 = Instant::now();
            model.prefill(&mut s, &prompt, Logits::Last).expect("prompt pass");
            line += &format!(" pp{n_pp} {:.1} t/s", n_pp as f64 / t0.elapsed().as_secs_f64());
            cut(&mut s);
        }
        if n_tg > 0 {
            let mut token = 1;
            let t0 = Instant::now();
            for _ in 0..n_tg {
                let logits = model.forward(&mut s, &[token], Logits::Last).expect("decode");
                token = logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32;
            }
            line += &format!(" tg{n_tg} {:.1} t/s", n_tg as f64 / t0.elapsed().as_secs_f64());
            cut(&mut s);
        }
        println!("{line}{}", if rep == 0 { " (warm-up)" } else { "" });
    }
}
