//! The device's matrix products a format at a time, against the card's own
//! limits: a decoded token's product (one input) in GB/s of weights read,
//! a prompt's (`-n` inputs) in GFLOP/s, and what one recorded kernel costs
//! when it does almost nothing (recording, submitting and running it), and
//! a decoded token's round trip without its arithmetic (its inputs
//! written, one pass submitted, a row read back), and a decoded token's
//! attention at depth for a small and a 3B model's heads.
//!
//!     cargo run --release -p ember-gpu --example matmul_bench -- [--rows 14336] [--cols 4096] [-n 512] [--device NAME] [--no-subgroups] [--no-tiles]
//!
//! `--no-subgroups` keeps the attention and the norms from subgroup
//! operations, as on a device without them, and `--no-tiles` a prompt's
//! products from the tiled form (the row-parallel form takes them), so that
//! one card times both forms of each.
//!
//! Several matrices take turns, together larger than a card's last-level
//! cache, so the decode figure is the memory's and not the cache's.

use std::time::Instant;

use ember_gguf::GgmlType;
use ember_gpu::{matmul_supports, AttentionShape, Gpu};

/// Matrices that take turns, and the most products timed per figure.
const MATRICES: usize = 4;
const PRODUCTS: usize = 48;

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut rows, mut cols, mut n, mut device, mut subgroups, mut tiles) = (14336usize, 4096usize, 512usize, None, true, true);
    while let Some(a) = args.next() {
        let mut value = |what: &str| args.next().unwrap_or_else(|| panic!("{what} needs a value"));
        match a.as_str() {
            "--rows" => rows = value("--rows").parse().expect("--rows: a number"),
            "--cols" => cols = value("--cols").parse().expect("--cols: a number"),
            "-n" => n = value("-n").parse().expect("-n: a number of inputs"),
            "--device" => device = Some(value("--device")),
            "--no-subgroups" => subgroups = false,
            "--no-tiles" => tiles = false,
            other => panic!("unknown argument {other}"),
        }
    }
    let mut gpu = Gpu::open(device.as_deref()).unwrap_or_else(|e| panic!("{e}"));
    if !subgroups {
        gpu.without_subgroups();
    }
    if !tiles {
        gpu.without_tiles();
    }
    let shuffles = match gpu.subgroup_size() {
        Some(size) => format!("subgroup shuffles (subgroups of {size} or more)"),
        None => "no subgroup shuffles".to_string(),
    };
    let form = if tiles { "tiled" } else { "row-parallel" };
    println!("{} ({}), {rows} x {cols}, prompts of {n} ({form}), {shuffles}", gpu.info().name, gpu.info().description);
    println!("| format | decode GB/s | decode µs | prompt GFLOP/s | prompt ms |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    let x = gpu.upload("x", &(0..n * cols).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect::<Vec<_>>()).unwrap();
    let y = gpu.zeros("y", n * rows).unwrap();
    use GgmlType::*;
    for ty in [Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, F16] {
        assert!(matmul_supports(ty));
        let mats: Vec<_> = (0..MATRICES)
            .map(|m| gpu.upload_matrix("w", ty, rows, cols, &random_matrix(ty, rows, cols, m as u64 + 1)).unwrap())
            .collect();
        let bytes = mats[0].bytes() as f64;
        let time = |inputs: usize| {
            let run = |count: usize| {
                let t = Instant::now();
                let mut pass = gpu.pass();
                for i in 0..count {
                    pass.matmul(&mats[i % MATRICES], &x, inputs, &y).unwrap();
                }
                pass.submit().unwrap();
                gpu.read_first(&y, 1).unwrap();
                t.elapsed().as_secs_f64()
            };
            // Warm, and how many products fill a quarter of a second or so.
            let each = run(MATRICES) / MATRICES as f64;
            let count = ((0.25 / each) as usize).clamp(MATRICES, PRODUCTS);
            // The difference of two runs leaves out the submit and the read back.
            (run(2 * count) - run(count)) / count as f64
        };
        let decode = time(1);
        let prompt = time(n);
        println!(
            "| {ty} | {:.0} | {:.1} | {:.0} | {:.2} |",
            bytes / decode / 1e9,
            decode * 1e6,
            2.0 * (rows * cols * n) as f64 / prompt / 1e9,
            prompt * 1e3
        );
    }
    // A kernel that does almost nothing: what each one recorded costs.
    let small = gpu.zeros("small", 64).unwrap();
    for count in [1000usize, 2000] {
        let t = Instant::now();
        let mut pass = gpu.pass();
        for _ in 0..count {
            pass.scale(&small, 1.0, 64).unwrap();
        }
        let recorded = t.elapsed().as_secs_f64();
        pass.submit().unwrap();
        gpu.read_first(&small, 1).unwrap();
        let total = t.elapsed().as_secs_f64();
        println!(
            "{count} tiny kernels: {:.2} µs each recorded, {:.2} µs each recorded and run",
            recorded / count as f64 * 1e6,
            total / count as f64 * 1e6
        );
    }
    for (n_head, n_head_kv, dim, name) in [(9, 3, 64, "SmolLM2"), (24, 8, 128, "Llama 3.2 3B")] {
        for depth in [512usize, 4096] {
            println!(
                "a decoded token's attention, {name}'s heads at depth {depth}: {:.1} µs a layer",
                attention_time(&gpu, n_head, n_head_kv, dim, depth)
            );
        }
    }
    round_trip(&gpu, 0);
    println!(
        "a round trip: {:.0} µs, {:.0} µs with 3072 floats written first",
        round_trip(&gpu, 0),
        round_trip(&gpu, 3072)
    );
}

/// Microseconds a round trip as a decoded token makes it: `inputs` floats
/// written (none: no write), a pass of one small kernel, 64 floats read back.
fn round_trip(gpu: &Gpu, inputs: usize) -> f64 {
    let x = gpu.zeros("x", inputs.max(64)).unwrap();
    let values = vec![1.0f32; inputs];
    let trips = 200;
    let t = Instant::now();
    for _ in 0..trips {
        if inputs > 0 {
            gpu.write(&x, &values).unwrap();
        }
        let mut pass = gpu.pass();
        pass.scale(&x, 1.0, 64).unwrap();
        pass.submit().unwrap();
        gpu.read_first(&x, 64).unwrap();
    }
    t.elapsed().as_secs_f64() / trips as f64 * 1e6
}

/// Microseconds one decoded token's attention takes over a cache of
/// `depth` positions (random keys and values), `n_head` heads of `dim`.
fn attention_time(gpu: &Gpu, n_head: usize, n_head_kv: usize, dim: usize, depth: usize) -> f64 {
    let ring = depth + 1;
    let layer = gpu.kv_layer(ring, n_head_kv * dim, n_head_kv * dim, ember_gpu::KvFormat::F16).unwrap();
    let mut state = 0x1234_5678_9abc_def1u64;
    let mut halves = |n: usize| -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                half::f16::from_f32((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5).to_le_bytes()
            })
            .collect()
    };
    let (k, v) = (halves(ring * n_head_kv * dim), halves(ring * n_head_kv * dim));
    gpu.write_kv(&layer, &k, &v).unwrap();
    let q = gpu.upload("q", &(0..n_head * dim).map(|i| (i % 13) as f32 / 13.0 - 0.5).collect::<Vec<_>>()).unwrap();
    let out = gpu.zeros("out", n_head * dim).unwrap();
    let shape = AttentionShape {
        t: 1,
        start: depth,
        row0: 0,
        n_head,
        n_head_kv,
        head_dim_k: dim,
        head_dim_v: dim,
        scale: 1.0 / (dim as f32).sqrt(),
        window: None,
    };
    let run = |count: usize| {
        let t = Instant::now();
        let mut pass = gpu.pass();
        for _ in 0..count {
            pass.attention(&shape, &q, &layer, &out).unwrap();
        }
        pass.submit().unwrap();
        gpu.read_first(&out, 1).unwrap();
        t.elapsed().as_secs_f64()
    };
    run(4);
    (run(40) - run(20)) / 20.0 * 1e6
}

/// Random quants under sane f16 scales (random bytes there would make
/// infinities and NaNs).
fn random_matrix(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    use GgmlType::*;
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let scale = half::f16::from_f32(0.004).to_le_bytes();
    if ty == F16 {
        return (0..rows * cols).flat_map(|_| half::f16::from_f32((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5).to_le_bytes()).collect();
    }
    let mut data: Vec<u8> = (0..rows * cols / ty.block_size() * ty.type_size()).map(|_| next() as u8).collect();
    for block in data.chunks_exact_mut(ty.type_size()) {
        for &at in ty.f16_scale_offsets() {
            block[at..at + 2].copy_from_slice(&scale);
        }
    }
    data
}
