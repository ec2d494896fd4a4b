//! The forward pass on a device against the CPU's, on the same file: a
//! prompt of `-p` tokens (pp) and `-n` tokens decoded one at a time (tg),
//! each after `-d` tokens already in the cache (none by default), in tokens
//! a second, as llama-bench reports them.
//!
//!     cargo run --release -p ember-model --example device_bench -- MODEL.gguf [-p 512] [-n 128] [-d 0] [-ctk f16|q8_0] [--device NAME] [--json] [--device-only] [--no-tiles] [--attention-queries N]
//!
//! `-ctk` is the cache type on both sides, as llama-bench's (f16 by default).
//! `--no-tiles` keeps the prompt's products from the tiled form, and
//! `--attention-queries N` gives a prompt's attention workgroups up to N
//! queries each (by default as many as keep 512 workgroups), so that a card
//! times the forms.
//! `--json` prints one line of the figures instead of the table
//! (`benches/gpu_bench.py` reads it); `--device-only` leaves the CPU's
//! figures out (a large model's take minutes on the CPU).
//! On Mesa's lavapipe (a Vulkan device on the CPU) the figures say only
//! that the path runs; on a card they are the device's speed.

use std::sync::Arc;
use std::time::Instant;

use ember_model::{Gpu, KvType, LoadOptions, Logits, Model};

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut path, mut pp, mut tg, mut depth, mut device, mut json, mut cpu) = (None, 512usize, 128usize, 0usize, None, false, true);
    let mut kv = KvType::F16;
    let mut tiles = true;
    let mut attention_queries = None;
    while let Some(a) = args.next() {
        let mut value = |what: &str| args.next().unwrap_or_else(|| panic!("{what} needs a value"));
        match a.as_str() {
            "-p" => pp = value("-p").parse().expect("-p: a number of tokens"),
            "-n" => tg = value("-n").parse().expect("-n: a number of tokens"),
            "-d" => depth = value("-d").parse().expect("-d: a number of tokens"),
            "--device" => device = Some(value("--device")),
            "-ctk" => kv = KvType::parse(&value("-ctk")).expect("-ctk: f16, f32 or q8_0"),
            "--json" => json = true,
            "--device-only" => cpu = false,
            "--no-tiles" => tiles = false,
            "--attention-queries" => attention_queries = Some(value("--attention-queries").parse().expect("--attention-queries: a number")),
            _ => path = Some(a),
        }
    }
    let path = path.expect("usage: device_bench MODEL.gguf [-p N] [-n N] [--device NAME]");
    let model = Model::load(&path, LoadOptions::default()).expect("the model loads");
    let mut gpu = Gpu::open(device.as_deref()).unwrap_or_else(|e| panic!("{e}"));
    if !tiles {
        gpu.without_tiles();
    }
    if let Some(queries) = attention_queries {
        gpu.attention_queries(queries);
    }
    let gpu = Arc::new(gpu);
    let t0 = Instant::now();
    let mut dm = Model::load(&path, LoadOptions::default()).expect("the model loads");
    dm.place_on(gpu.clone()).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "{} on {} ({}): {:.1} MiB of weights uploaded in {:.2} s",
        model.config.name,
        gpu.info().name,
        gpu.info().description,
        dm.placement().expect("placed").weight_bytes() as f64 / (1 << 20) as f64,
        t0.elapsed().as_secs_f64()
    );
    let n_vocab = model.config.n_vocab;
    let ids: Vec<u32> = (0..(depth + pp + tg) as u32).map(|i| (3 + i * 37) % n_vocab as u32).collect();
    // Untimed passes first, a prompt's and a decoded token's: the device's
    // pipelines are built on first use.
    let mut warm = dm.new_session(9, 8, KvType::F16);
    dm.forward(&mut warm, &ids[..8], Logits::Last).unwrap();
    dm.forward(&mut warm, &ids[8..9], Logits::Last).unwrap();
    let (device_pp, device_tg) = pp_and_tg(&dm, &ids, depth, pp, kv);
    let (cpu_pp, cpu_tg) = if cpu { pp_and_tg(&model, &ids, depth, pp, kv) } else { (f64::NAN, f64::NAN) };
    if json {
        println!(
            "{{\"device\": {:?}, \"description\": {:?}, \"pp\": {pp}, \"tg\": {tg}, \"depth\": {depth}, \"kv\": {:?}, \"device_pp_ts\": {device_pp:.2}, \"device_tg_ts\": {device_tg:.2}, \"cpu_pp_ts\": {cpu_pp:.2}, \"cpu_tg_ts\": {cpu_tg:.2}, \"threads\": {}}}",
            gpu.info().name,
            gpu.info().description,
            kv.name(),
            model.threads()
        );
        return;
    }
    println!("| test | device t/s | CPU t/s ({} threads) |", model.threads());
    let mut at = if depth > 0 { format!(" @ d{depth}") } else { String::new() };
    if kv != KvType::F16 {
        at += &format!(" ({} cache)", kv.name());
    }
    println!("| pp{pp}{at} | {device_pp:.1} | {cpu_pp:.1} |");
    println!("| tg{tg}{at} | {device_tg:.1} | {cpu_tg:.1} |");
}

/// Tokens a second reading `ids[depth..depth + pp]` as one prompt, and
/// decoding the rest one at a time, each after `ids[..depth]` (untimed) as
/// llama-bench's pp and tg are, with a cache of `kv`; on the device or the
/// CPU, as `model` is placed.
fn pp_and_tg(model: &Model, ids: &[u32], depth: usize, pp: usize, kv: KvType) -> (f64, f64) {
    let session = |n_ctx: usize, batch: usize| {
        let mut s = model.new_session(n_ctx, batch, kv);
        if depth > 0 {
            model.prefill(&mut s, &ids[..depth], Logits::Last).unwrap();
        }
        s
    };
    let mut s = session(depth + pp.max(1), pp.max(depth).max(1));
    let t = Instant::now();
    model.prefill(&mut s, &ids[depth..depth + pp], Logits::Last).unwrap();
    let prompt = pp as f64 / t.elapsed().as_secs_f64();
    let decoded = &ids[depth + pp..];
    let mut s = session(depth + decoded.len(), depth.max(1));
    let kernels = model.placement().map(|d| d.kernels());
    let t = Instant::now();
    for &id in decoded {
        model.forward(&mut s, &[id], Logits::Last).unwrap();
    }
    let tg = decoded.len() as f64 / t.elapsed().as_secs_f64();
    if let (Some(before), Some(d)) = (kernels, model.placement()) {
        eprintln!("kernels a decoded token: {}", (d.kernels() - before) / decoded.len().max(1) as u64);
    }
    (prompt, tg)
}
