//! pp/tg rates of one GGUF file, for profiling the forward pass without Python:
//!
//!     cargo run --profile profiling -p ember-model --example throughput -- FILE [PP] [TG] [THREADS] [REPS] [DEPTH] [KV]
//!
//! DEPTH tokens are in the context before each test (llama-bench's `-d`);
//! KV is the cache type (f16, the default, f32 or q8_0).

use ember_model::{bench, KvType, LoadOptions, Model};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).expect("usage: throughput FILE [PP] [TG] [THREADS] [REPS] [DEPTH] [KV]");
    let arg = |i: usize, d: usize| args.get(i).map(|s| s.parse().expect("a number")).unwrap_or(d);
    let (n_pp, n_tg, threads, reps, depth) = (arg(2, 512), arg(3, 128), arg(4, 0), arg(5, 3), arg(6, 0));
    let kv = args.get(7).map(|s| KvType::parse(s).expect("a cache type: f16, f32 or q8_0")).unwrap_or(KvType::F16);
    let model = Model::load(path, LoadOptions { threads, no_repack: std::env::var_os("EMBER_NO_REPACK").is_some() }).expect("model loads");
    let n_vocab = model.config.n_vocab as u32;
    let prompt: Vec<u32> = (0..n_pp as u32).map(|i| (1 + i * 7919) % n_vocab).collect();
    let held: Vec<u32> = (0..depth as u32).map(|i| (2 + i * 7919) % n_vocab).collect();
    for rep in 0..=reps {
        let mut line = format!("rep {rep}:");
        if n_pp > 0 {
            let t = bench::prompt_processing(&model, &held, &prompt, 512, kv).expect("prompt pass");
            line += &format!(" pp{n_pp} {:.1} t/s", t.tokens_per_second());
        }
        if n_tg > 0 {
            let t = bench::text_generation(&model, &held, 1, n_tg, 512, kv).expect("decode");
            line += &format!(" tg{n_tg} {:.1} t/s", t.tokens_per_second());
        }
        println!("{line}{}", if rep == 0 { " (warm-up)" } else { "" });
    }
}
