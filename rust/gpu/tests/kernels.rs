//! Every device kernel against the CPU's arithmetic, by normalised error
//! (‖device − reference‖ / ‖reference‖) within a budget stated per kernel.
//! The reference dequantizes with ember-quant (itself checked bit for bit
//! against the `gguf` package's numpy formats) and sums in f64.
//!
//! These run on any Vulkan device, Mesa's lavapipe included. Without one
//! they say so and pass, unless EMBER_REQUIRE_GPU is set (CI sets it after
//! installing lavapipe): then a missing device fails them.

use std::sync::OnceLock;

use ember_gguf::GgmlType;
use ember_gpu::{matmul_supports, Activation, AttentionShape, Gpu, GpuError, KvFormat, Rotation, Routing};
use half::{bf16, f16};

fn gpu() -> Option<&'static Gpu> {
    static GPU: OnceLock<Option<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| match Gpu::open(None) {
        Ok(g) => Some(g),
        Err(e) if std::env::var_os("EMBER_REQUIRE_GPU").is_some() => {
            panic!("EMBER_REQUIRE_GPU is set, and no device opened: {e}")
        }
        Err(e) => {
            eprintln!("no device, so the kernel tests are skipped: {e}");
            None
        }
    })
    .as_ref()
}

/// xorshift64*: the same values on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// `rows` rows of `cols` in `ty`'s file layout, filled at random.
fn random_matrix(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    use GgmlType::*;
    let n = rows * cols;
    match ty {
        F32 => (0..n).flat_map(|_| rng.unit().to_le_bytes()).collect(),
        F16 => (0..n).flat_map(|_| f16::from_f32(rng.unit()).to_le_bytes()).collect(),
        BF16 => (0..n).flat_map(|_| bf16::from_f32(rng.unit()).to_le_bytes()).collect(),
        _ => {
            let mut data = rng.bytes(n / ty.block_size() * ty.type_size());
            // Sane scales, one in eight negative, as a quantizer may write.
            for block in data.chunks_exact_mut(ty.type_size()) {
                for &at in ty.f16_scale_offsets() {
                    let mut d = 1e-3 + 2e-2 * (rng.unit() + 1.0) / 2.0;
                    if rng.next() % 8 == 0 {
                        d = -d;
                    }
                    block[at..at + 2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                }
            }
            data
        }
    }
}

fn normalised_error(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let diff: f64 = got.iter().zip(want).map(|(&g, &w)| (g as f64 - w).powi(2)).sum();
    let norm: f64 = want.iter().map(|w| w * w).sum();
    (diff / norm).sqrt()
}

/// The matrix product's budget: f32 sums of a block's products, against f64 sums.
const MATMUL_BUDGET: f64 = 1e-5;

fn check_matmul(gpu: &Gpu, ty: GgmlType, rows: usize, cols: usize, n: usize, seed: u64) {
    let mut rng = Rng(seed);
    let data = random_matrix(&mut rng, ty, rows, cols);
    let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
    let row_bytes = ty.row_bytes(cols as u64).unwrap() as usize;
    let mut want = vec![0f64; n * rows];
    let mut deq = vec![0f32; cols];
    for r in 0..rows {
        ember_quant::dequantize_row(ty, &data[r * row_bytes..(r + 1) * row_bytes], &mut deq).unwrap();
        for c in 0..n {
            want[c * rows + r] = deq.iter().zip(&x[c * cols..(c + 1) * cols]).map(|(&w, &v)| w as f64 * v as f64).sum();
        }
    }
    let w = gpu.upload_matrix("test", ty, rows, cols, &data).unwrap();
    let xb = gpu.upload("x", &x).unwrap();
    let y = gpu.zeros("y", n * rows).unwrap();
    let mut pass = gpu.pass();
    pass.matmul(&w, &xb, n, &y).unwrap();
    pass.submit().unwrap();
    let got = gpu.read(&y).unwrap();
    let err = normalised_error(&got, &want);
    assert!(err <= MATMUL_BUDGET, "{ty} {rows}x{cols} over {n}: normalised error {err:e} > {MATMUL_BUDGET:e}");
}

const FORMATS: [GgmlType; 15] = {
    use GgmlType::*;
    [F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS]
};

#[test]
fn matmul_of_every_format_matches_the_cpu() {
    let Some(gpu) = gpu() else { return };
    for (i, ty) in FORMATS.into_iter().enumerate() {
        assert!(matmul_supports(ty));
        // Legacy formats: five blocks a row, so rows start at bytes that are
        // not whole words (Q4_0's 90). K formats: two super-blocks. Rows and
        // inputs not multiples of anything the kernel groups by.
        let cols = if ty.block_size() == 256 { 512 } else { 160 };
        check_matmul(gpu, ty, 37, cols, 3, 0x5eed + i as u64);
        // Two workgroups' worth of inputs (8 each), the second short.
        check_matmul(gpu, ty, 5, cols, 11, 0x5eed + 100 + i as u64);
        // Three blocks a row: where the device keeps the scales apart, an
        // odd count of them, padded to a word ahead of the blocks.
        check_matmul(gpu, ty, 7, 3 * ty.block_size(), 2, 0x5eed + 200 + i as u64);
        // A prompt's tiles (of 64 rows by 32 inputs, or 256 by 8 for the
        // 256-element formats): rows past one, inputs past one and ending
        // inside a tile's last group of eight.
        check_matmul(gpu, ty, 70, cols, 37, 0x5eed + 300 + i as u64);
    }
}

/// The gated product against the two products and the activation apart:
/// the same bits, and so the same closeness to the CPU.
fn check_matmul_gated(gpu: &Gpu, ty: GgmlType, act: Activation, rows: usize, cols: usize, n: usize, seed: u64) {
    let mut rng = Rng(seed);
    let (gate, up) = (random_matrix(&mut rng, ty, rows, cols), random_matrix(&mut rng, ty, rows, cols));
    let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
    let pair = gpu.upload_stacked("pair", ty, cols, &[(rows, &gate), (rows, &up)]).unwrap().expect("fits one binding");
    let (gw, uw) = (gpu.upload_matrix("gate", ty, rows, cols, &gate).unwrap(), gpu.upload_matrix("up", ty, rows, cols, &up).unwrap());
    let xb = gpu.upload("x", &x).unwrap();
    let (g, u) = (gpu.zeros("g", n * rows).unwrap(), gpu.zeros("u", n * rows).unwrap());
    let (apart, together) = (gpu.zeros("apart", n * rows).unwrap(), gpu.zeros("together", n * rows).unwrap());
    let mut pass = gpu.pass();
    pass.matmul(&gw, &xb, n, &g).unwrap();
    pass.matmul(&uw, &xb, n, &u).unwrap();
    pass.gated(act, &g, &u, &apart, n * rows).unwrap();
    let before = pass.kernels();
    pass.matmul_gated(&pair, act, &xb, n, &together).unwrap();
    assert_eq!(pass.kernels(), before + 1, "one kernel, the inputs already laid out");
    pass.submit().unwrap();
    let (want, got) = (gpu.read(&apart).unwrap(), gpu.read(&together).unwrap());
    assert!(want.iter().any(|&v| v != 0.0));
    assert_eq!(got, want, "{ty} {act:?} {rows}x{cols} over {n}: the gated product against its parts");
}

#[test]
fn the_gated_product_of_every_format_is_its_parts_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    for (i, ty) in FORMATS.into_iter().enumerate() {
        let cols = if ty.block_size() == 256 { 512 } else { 160 };
        // Rows not a whole number of a workgroup's pairs (one for a decoded
        // token, four for a prompt, four rows a thread); a decoded token,
        // and two workgroups of inputs.
        check_matmul_gated(gpu, ty, Activation::Silu, 37, cols, 1, 0x9a7e + i as u64);
        check_matmul_gated(gpu, ty, Activation::GeluTanh, 37, cols, 11, 0x9a7e + 100 + i as u64);
        // Tiled: rows past a tile's 32 (or 128) pairs.
        check_matmul_gated(gpu, ty, Activation::Silu, 150, cols, 19, 0x9a7e + 200 + i as u64);
    }
    check_matmul_gated(gpu, GgmlType::Q4_0, Activation::Sigmoid, 5, 64, 3, 0x9a7f);
    // A pair past one binding is left to the caller to keep apart.
    let mut small = Gpu::open(None).unwrap();
    small.limit_bindings(4096);
    let mut rng = Rng(0x9a80);
    let half = random_matrix(&mut rng, GgmlType::Q4_0, 120, 32);
    assert!(small.upload_stacked("pair", GgmlType::Q4_0, 32, &[(120, &half), (120, &half)]).unwrap().is_none());
    let pair = small.upload_stacked("pair", GgmlType::Q4_0, 32, &[(100, &half[..1800]), (100, &half[..1800])]).unwrap();
    assert_eq!(pair.unwrap().parts(), [100, 100]);
}

/// A prompt's products are tiled (from 16 inputs) or take four rows a
/// thread, a decoded token's one: each row's terms are added in the same
/// order in every form, so every input of a prompt gets the bits it would
/// get alone, for the plain, gated and split products. That is what lets a
/// conversation's answers not depend on the pass it came in.
fn check_rows_a_thread(gpu: &Gpu, ty: GgmlType, rows: usize, cols: usize, n: usize, seed: u64) {
    let mut rng = Rng(seed);
    let data: Vec<Vec<u8>> = (0..3).map(|_| random_matrix(&mut rng, ty, rows, cols)).collect();
    let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
    let prompt = three_products(gpu, ty, &data, rows, cols, &x);
    for c in 0..n {
        let alone = three_products(gpu, ty, &data, rows, cols, &x[c * cols..(c + 1) * cols]);
        for (i, (all, one)) in prompt.iter().zip(&alone).enumerate() {
            assert!(one.iter().any(|&v| v != 0.0));
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&all[c * rows..(c + 1) * rows]), bits(one), "{ty} {rows}x{cols}: input {c} of {n}, output {i}");
        }
    }
}

#[test]
fn a_prompts_products_give_each_input_a_decoded_tokens_bits() {
    let Some(gpu) = gpu() else { return };
    for (i, ty) in FORMATS.into_iter().enumerate() {
        let cols = if ty.block_size() == 256 { 512 } else { 160 };
        // Rows past a whole number of a prompt's workgroups (8) and of a
        // thread's four; inputs past one workgroup's eight. A decoded token
        // takes one row a thread here, and four where its product has rows
        // enough for 256 workgroups of four (the last case).
        check_rows_a_thread(gpu, ty, 45, cols, 9, 0x4a1 + i as u64);
        check_rows_a_thread(gpu, ty, 2051, cols, 2, 0x4a1 + 100 + i as u64);
        // A prompt of 20, tiled: rows past one tile of 64 (or of 256), a
        // tile's inputs ending inside a group of eight, and for the
        // 32-element formats a group of eight with none.
        check_rows_a_thread(gpu, ty, 300, cols, 20, 0x4a1 + 200 + i as u64);
    }
}

/// The outputs of the three row-parallel products over inputs `x`, each
/// of `cols`: the plain product of `data[0]`, the gated one of `data[0]`
/// and `data[1]`, and the product split three ways over all three (each
/// `rows` rows).
fn three_products(gpu: &Gpu, ty: GgmlType, data: &[Vec<u8>], rows: usize, cols: usize, x: &[f32]) -> Vec<Vec<f32>> {
    let m = x.len() / cols;
    let w = gpu.upload_matrix("w", ty, rows, cols, &data[0]).unwrap();
    let pair = gpu.upload_stacked("pair", ty, cols, &[(rows, &data[0]), (rows, &data[1])]).unwrap().unwrap();
    let three: Vec<(usize, &[u8])> = data.iter().map(|d| (rows, &d[..])).collect();
    let split = gpu.upload_stacked("split", ty, cols, &three).unwrap().unwrap();
    let xb = gpu.upload("x", x).unwrap();
    let ys: Vec<_> = (0..5).map(|_| gpu.zeros("y", m * rows).unwrap()).collect();
    let mut pass = gpu.pass();
    pass.matmul(&w, &xb, m, &ys[0]).unwrap();
    pass.matmul_gated(&pair, Activation::Silu, &xb, m, &ys[1]).unwrap();
    pass.matmul_split(&split, &xb, m, [&ys[2], &ys[3], &ys[4]]).unwrap();
    pass.submit().unwrap();
    ys.iter().map(|y| gpu.read(y).unwrap()).collect()
}

/// The attention of `t` queries at positions `start`.. over a cache of
/// `start + t` random keys and values.
fn attention_outputs(gpu: &Gpu, shape: AttentionShape, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    let (wk, wv) = (shape.n_head_kv * shape.head_dim_k, shape.n_head_kv * shape.head_dim_v);
    let n = shape.start + shape.t;
    let layer = gpu.kv_layer(n, wk, wv, KvFormat::F16).unwrap();
    let k: Vec<f32> = (0..n * wk).map(|_| 2.0 * rng.unit()).collect();
    let v: Vec<f32> = (0..n * wv).map(|_| rng.unit()).collect();
    let q: Vec<f32> = (0..shape.t * shape.n_head * shape.head_dim_k).map(|_| rng.unit()).collect();
    let (kb, vb, qb) = (gpu.upload("k", &k).unwrap(), gpu.upload("v", &v).unwrap(), gpu.upload("q", &q).unwrap());
    let out = gpu.zeros("out", shape.t * shape.n_head * shape.head_dim_v).unwrap();
    let mut pass = gpu.pass();
    pass.kv_store(&layer, &kb, &vb, 0, n, 0).unwrap();
    pass.attention(&shape, &qb, &layer, &out).unwrap();
    pass.submit().unwrap();
    gpu.read(&out).unwrap()
}

/// Where the device has subgroups, the norms add their threads' squares
/// through subgroup shuffles for the tree's closer steps, attention takes
/// each block's maximum a subgroup at a time, and every kernel counts an
/// invocation's place by subgroups (the products' strands among them); a
/// device without takes every step in workgroup memory and counts local
/// indices. The pairs, the strands and their order are the same (and a
/// maximum is one in any order), so the outputs must be too, bit for bit,
/// in every form.
#[test]
fn products_attention_and_norms_give_the_same_bits_with_subgroups_or_without() {
    let Some(gpu) = gpu() else { return };
    let Some(size) = gpu.subgroup_size() else {
        eprintln!("{} offers no subgroups: every product takes the tree in workgroup memory", gpu.info().description);
        return;
    };
    let mut alone = Gpu::open(Some(&gpu.info().name)).unwrap();
    alone.without_subgroups();
    assert_eq!(alone.subgroup_size(), None);
    eprintln!("subgroups of {size} or more");
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for (i, ty) in FORMATS.into_iter().enumerate() {
        let cols = if ty.block_size() == 256 { 512 } else { 160 };
        // A prompt (four rows a thread, eight inputs), a decoded token of one
        // row a thread, and one of four (rows enough for 256 workgroups).
        for (rows, n) in [(45, 9), (45, 1), (2051, 1)] {
            let mut rng = Rng(0x5ab + 10 * i as u64 + n as u64);
            let data: Vec<Vec<u8>> = (0..3).map(|_| random_matrix(&mut rng, ty, rows, cols)).collect();
            let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
            let shuffled = three_products(gpu, ty, &data, rows, cols, &x);
            let in_memory = three_products(&alone, ty, &data, rows, cols, &x);
            for (k, (a, b)) in shuffled.iter().zip(&in_memory).enumerate() {
                assert!(a.iter().any(|&v| v != 0.0));
                assert_eq!(bits(a), bits(b), "{ty} {rows}x{cols} over {n}: output {k}, shuffled against in memory");
            }
        }
    }
    // A prompt over several blocks of positions, a decoded token at depth
    // (cut into spans), in a window, and Gemma 4's widest heads.
    for (i, (sh, start, t)) in [
        (shape(9, 3, 64, 64, None), 0, 150),
        (shape(24, 8, 128, 128, None), 700, 1),
        (shape(4, 2, 32, 48, Some(40)), 100, 11),
        (shape(2, 1, 512, 512, None), 60, 5),
    ]
    .into_iter()
    .enumerate()
    {
        let sh = AttentionShape { t, start, ..sh };
        let (a, b) = (attention_outputs(gpu, sh, 0xa5 + i as u64), attention_outputs(&alone, sh, 0xa5 + i as u64));
        assert_eq!(bits(&a), bits(&b), "attention {sh:?}: by subgroups against in memory");
    }
    // RMS and L2 norms (their sums of squares by the same tree), rows
    // narrower than a workgroup and wider.
    for (rows, width) in [(3, 576), (2, 40), (5, 2048)] {
        let mut rng = Rng(0x2a + width as u64);
        let x: Vec<f32> = (0..rows * width).map(|_| 3.0 * rng.unit()).collect();
        let weight: Vec<f32> = (0..width).map(|_| rng.unit()).collect();
        let norms = |g: &Gpu| -> (Vec<f32>, Vec<f32>) {
            let (xb, wb, out) = (g.upload("x", &x).unwrap(), g.upload("w", &weight).unwrap(), g.zeros("out", rows * width).unwrap());
            let mut pass = g.pass();
            pass.rms_norm(&xb, &wb, &out, rows, 1e-6).unwrap();
            pass.l2_norm_heads(&xb, rows, 1, width, width, 1e-6).unwrap();
            pass.submit().unwrap();
            (g.read(&out).unwrap(), g.read(&xb).unwrap())
        };
        let ((rms_a, l2_a), (rms_b, l2_b)) = (norms(gpu), norms(&alone));
        assert_eq!(bits(&rms_a), bits(&rms_b), "RMS norm of {rows} rows of {width}: by subgroups against in memory");
        assert_eq!(bits(&l2_a), bits(&l2_b), "L2 norm of {rows} rows of {width}: by subgroups against in memory");
    }
}

/// Three products over the same inputs in one kernel against the three
/// apart: the same bits.
fn check_matmul_split(gpu: &Gpu, ty: GgmlType, rows: [usize; 3], cols: usize, n: usize, seed: u64) {
    let mut rng = Rng(seed);
    let data = rows.map(|r| random_matrix(&mut rng, ty, r, cols));
    let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
    let parts: Vec<(usize, &[u8])> = rows.iter().zip(&data).map(|(&r, d)| (r, &d[..])).collect();
    let stacked = gpu.upload_stacked("qkv", ty, cols, &parts).unwrap().expect("fits one binding");
    let xb = gpu.upload("x", &x).unwrap();
    let apart = rows.map(|r| gpu.zeros("apart", n * r).unwrap());
    let together = rows.map(|r| gpu.zeros("together", n * r).unwrap());
    let mut pass = gpu.pass();
    for ((&r, d), y) in rows.iter().zip(&data).zip(&apart) {
        pass.matmul(&gpu.upload_matrix("w", ty, r, cols, d).unwrap(), &xb, n, y).unwrap();
    }
    let before = pass.kernels();
    pass.matmul_split(&stacked, &xb, n, [&together[0], &together[1], &together[2]]).unwrap();
    assert_eq!(pass.kernels(), before + 1, "one kernel, the inputs already laid out");
    pass.submit().unwrap();
    for (i, (a, t)) in apart.iter().zip(&together).enumerate() {
        let (want, got) = (gpu.read(a).unwrap(), gpu.read(t).unwrap());
        assert!(want.iter().any(|&v| v != 0.0));
        assert_eq!(got, want, "{ty} {rows:?}x{cols} over {n}: part {i} against its product alone");
    }
}

#[test]
fn a_product_split_three_ways_is_its_parts_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    for (i, ty) in FORMATS.into_iter().enumerate() {
        let cols = if ty.block_size() == 256 { 512 } else { 160 };
        // Parts that end inside a workgroup's rows (2 for a decoded token, 8
        // for a prompt) and inside a thread's four; a decoded token, and two
        // workgroups of inputs.
        check_matmul_split(gpu, ty, [37, 13, 13], cols, 1, 0x5b1 + i as u64);
        check_matmul_split(gpu, ty, [24, 9, 15], cols, 11, 0x5b1 + 100 + i as u64);
        // Tiled, the parts ending inside a tile.
        check_matmul_split(gpu, ty, [70, 30, 30], cols, 17, 0x5b1 + 200 + i as u64);
    }
    let mut rng = Rng(0x5b2);
    let w = random_matrix(&mut rng, GgmlType::Q4_0, 6, 32);
    let two = gpu.upload_stacked("two", GgmlType::Q4_0, 32, &[(3, &w[..54]), (3, &w[54..])]).unwrap().unwrap();
    let (x, y) = (gpu.zeros("x", 32).unwrap(), gpu.zeros("y", 3).unwrap());
    let err = gpu.upload_stacked("uneven", GgmlType::Q4_0, 32, &[(2, &w[..54]), (4, &w[54..])]).err().unwrap();
    assert!(err.to_string().contains("part 0 gives 54 bytes for 2 rows of 32 Q4_0 (36 bytes)"), "{err}");
    let err = gpu.pass().matmul_split(&two, &x, 1, [&y, &y, &y]).err().unwrap();
    assert!(matches!(err, GpuError::Shape(_)), "two parts are not three: {err}");
    let err = gpu.pass().matmul_gated(&two, Activation::Silu, &x, 2, &y).err().unwrap();
    assert!(matches!(err, GpuError::Shape(_)), "an output too short: {err}");
}

#[test]
fn matmul_of_long_rows_matches_the_cpu() {
    let Some(gpu) = gpu() else { return };
    // A row of SmolLM2's FFN down projection: more blocks than threads.
    check_matmul(gpu, GgmlType::Q4_1, 9, 1536, 2, 11);
    check_matmul(gpu, GgmlType::Q6_K, 9, 2048, 1, 12);
}

#[test]
fn matmul_past_the_dispatch_width_reaches_every_row() {
    let Some(gpu) = gpu() else { return };
    // More workgroups of eight rows (two groups of threads, four rows a
    // thread) than one dimension of a dispatch holds (65535): the rest go
    // to the second dimension, as a vocabulary of 600k rows would.
    check_matmul(gpu, GgmlType::Q8_0, 8 * 65535 + 77, 32, 1, 13);
}

#[test]
fn matmul_of_a_matrix_held_in_runs_of_rows_matches_the_cpu() {
    if gpu().is_none() {
        return;
    }
    // A device of its own with a binding of 4 KiB: 97 rows of 180 bytes go in
    // runs of 22 rows, each writing its own span of the output.
    let mut small = Gpu::open(None).unwrap();
    small.limit_bindings(4096);
    check_matmul(&small, GgmlType::Q4_0, 97, 320, 2, 14);
    let mut rng = Rng(15);
    let data = random_matrix(&mut rng, GgmlType::Q4_0, 97, 320);
    assert_eq!(small.upload_matrix("w", GgmlType::Q4_0, 97, 320, &data).unwrap().runs(), 5);
}

#[test]
fn rms_norm_matches_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng(21);
    // The last: more rows than one dimension of a dispatch holds (a
    // prompt's per-layer inputs, a row per token and layer).
    for (rows, width) in [(5, 576), (3, 7), (2, 2048), (65535 + 3, 4)] {
        let x: Vec<f32> = (0..rows * width).map(|_| 3.0 * rng.unit()).collect();
        let weight: Vec<f32> = (0..width).map(|_| 1.0 + rng.unit() / 2.0).collect();
        let eps = 1e-6f32;
        let mut want = Vec::new();
        for row in x.chunks(width) {
            let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / width as f64;
            let scale = 1.0 / (ms + eps as f64).sqrt();
            want.extend(row.iter().zip(&weight).map(|(&v, &w)| v as f64 * scale * w as f64));
        }
        let (xb, wb, out) =
            (gpu.upload("x", &x).unwrap(), gpu.upload("w", &weight).unwrap(), gpu.zeros("out", rows * width).unwrap());
        let mut pass = gpu.pass();
        pass.rms_norm(&xb, &wb, &out, rows, eps).unwrap();
        pass.submit().unwrap();
        let err = normalised_error(&gpu.read(&out).unwrap(), &want);
        assert!(err <= 1e-6, "rms_norm {rows}x{width}: normalised error {err:e}");
    }
}

#[test]
fn a_residual_add_and_a_norm_are_taken_in_by_the_kernels_after_them_and_kept_in_order_otherwise() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng(22);
    let (rows, width) = (3, 96);
    let n = rows * width;
    let x: Vec<f32> = (0..n).map(|_| 3.0 * rng.unit()).collect();
    let o: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
    let weight: Vec<f32> = (0..width).map(|_| 1.0 + rng.unit() / 2.0).collect();
    let sum: Vec<f32> = x.iter().zip(&o).map(|(a, b)| a + b).collect();
    let normed = |v: &[f32]| -> Vec<f64> {
        v.chunks(width)
            .flat_map(|row| {
                let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / width as f64;
                let scale = 1.0 / (ms + 1e-6).sqrt();
                row.iter().zip(&weight).map(move |(&v, &w)| v as f64 * scale * w as f64).collect::<Vec<_>>()
            })
            .collect()
    };
    let wb = gpu.upload("w", &weight).unwrap();
    let out = gpu.zeros("out", n).unwrap();
    // The norm of the sum takes the add in: one kernel for both.
    let (xb, ob) = (gpu.upload("x", &x).unwrap(), gpu.upload("o", &o).unwrap());
    let mut pass = gpu.pass();
    pass.add_to(&xb, &ob, n).unwrap();
    assert_eq!(pass.kernels(), 0, "the add waits for what comes next");
    pass.rms_norm(&xb, &wb, &out, rows, 1e-6).unwrap();
    assert_eq!(pass.submit().unwrap(), 1, "the norm of the sum took the add in");
    assert_eq!(gpu.read(&xb).unwrap(), sum, "the sum is kept, rounded as the add rounds it");
    let err = normalised_error(&gpu.read(&out).unwrap(), &normed(&sum));
    assert!(err <= 1e-6, "the norm of the sum: normalised error {err:e}");
    // A product of the sum records the add first (the inputs it laid out
    // before the add are stale); so does a norm of another buffer, one
    // writing where the add reads (a post-norm's output) and a copy.
    let (xb, ob) = (gpu.upload("x", &x).unwrap(), gpu.upload("o", &o).unwrap());
    // An exact identity in Q8_0 (scales of one, a quant of one on the
    // diagonal), so that the inputs are laid out in blocks of 32.
    let identity: Vec<u8> = (0..width)
        .flat_map(|r| (0..width / 32).flat_map(move |b| {
            let quants = (0..32).map(move |j| u8::from(b * 32 + j == r));
            f16::from_f32(1.0).to_le_bytes().into_iter().chain(quants)
        }))
        .collect();
    let identity = gpu.upload_matrix("identity", GgmlType::Q8_0, width, width, &identity).unwrap();
    let (copy, product) = (gpu.zeros("copy", n).unwrap(), gpu.zeros("product", n).unwrap());
    let mut pass = gpu.pass();
    pass.matmul(&identity, &xb, rows, &product).unwrap();
    pass.add_to(&xb, &ob, n).unwrap();
    pass.matmul(&identity, &xb, rows, &product).unwrap();
    assert_eq!(pass.kernels(), 5, "laying out and product, add, laying out again and product");
    // x = sum + o, its add recorded before the norm of o.
    pass.add_to(&xb, &ob, n).unwrap();
    pass.rms_norm(&ob, &wb, &out, rows, 1e-6).unwrap();
    assert_eq!(pass.kernels(), 6, "the norm itself held back in turn");
    // x = sum + 2 o, then its norm written over o.
    pass.add_to(&xb, &ob, n).unwrap();
    pass.rms_norm(&xb, &wb, &ob, rows, 1e-6).unwrap();
    assert_eq!(pass.kernels(), 8);
    pass.add_to(&xb, &ob, n).unwrap();
    pass.copy(&xb, 0, &copy, 0, n).unwrap();
    pass.submit().unwrap();
    assert_eq!(gpu.read(&product).unwrap(), sum, "the product read the sum, not the inputs laid out before");
    let plus_o = |v: &[f32]| -> Vec<f32> { v.iter().zip(&o).map(|(a, b)| a + b).collect() };
    let twice = plus_o(&plus_o(&sum));
    let normed_twice: Vec<f64> = normed(&twice);
    let want: Vec<f64> = twice.iter().zip(&normed_twice).map(|(&a, &b)| a as f64 + b).collect();
    let err = normalised_error(&gpu.read(&copy).unwrap(), &want);
    assert!(err <= 1e-6, "the copy after a deferred add: normalised error {err:e}");

    // The add, the norm of its sum and the laying out of the norm's output
    // for the product that reads it: one kernel.
    let (xb, ob) = (gpu.upload("x", &x).unwrap(), gpu.upload("o", &o).unwrap());
    let mut pass = gpu.pass();
    pass.add_to(&xb, &ob, n).unwrap();
    pass.rms_norm(&xb, &wb, &out, rows, 1e-6).unwrap();
    pass.matmul(&identity, &out, rows, &product).unwrap();
    assert_eq!(pass.submit().unwrap(), 2, "add, norm and laying out; the product");
    let normed_sum = gpu.read(&out).unwrap();
    assert_eq!(gpu.read(&product).unwrap(), normed_sum, "the product read the norm's output laid out");
    let err = normalised_error(&normed_sum, &normed(&sum));
    assert!(err <= 1e-6, "the norm laid out: normalised error {err:e}");
    assert_eq!(gpu.read(&xb).unwrap(), sum);
}

#[test]
fn a_type_without_a_kernel_is_refused_by_name() {
    let Some(gpu) = gpu() else { return };
    let err = gpu.upload_matrix("blk.0.ffn_up.weight", GgmlType::Q8_K, 1, 256, &[0; 292]).err().unwrap();
    assert!(matches!(err, GpuError::UnsupportedType { ty: GgmlType::Q8_K }));
    assert_eq!(err.to_string(), "Q8_K has no device kernel");
}

#[test]
fn shapes_that_do_not_fit_are_refused() {
    let Some(gpu) = gpu() else { return };
    let err = gpu.upload_matrix("w", GgmlType::Q4_0, 2, 48, &[0; 36]).err().unwrap();
    assert!(err.to_string().contains("48 columns are not whole blocks of Q4_0"), "{err}");
    let err = gpu.upload_matrix("w", GgmlType::Q4_0, 2, 32, &[0; 35]).err().unwrap();
    assert!(err.to_string().contains("35 bytes given for 2 rows of 32 Q4_0 (36 bytes)"), "{err}");
    let w = gpu.upload_matrix("w", GgmlType::Q4_0, 2, 32, &[0; 36]).unwrap();
    let (x, y) = (gpu.zeros("x", 32).unwrap(), gpu.zeros("y", 2).unwrap());
    let err = gpu.pass().matmul(&w, &x, 2, &y).err().unwrap();
    assert!(matches!(err, GpuError::Shape(_)), "{err}");
}

#[test]
fn an_unknown_device_name_is_refused_with_the_names_there_are() {
    if gpu().is_none() {
        return;
    }
    let err = Gpu::open(Some("Vulkan99")).err().unwrap();
    let text = err.to_string();
    assert!(text.starts_with("no device named \"Vulkan99\"; the devices are: Vulkan0 ("), "{text}");
}

#[test]
fn gated_activations_match_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng(31);
    let n = 1000;
    let g: Vec<f32> = (0..n).map(|_| 12.0 * rng.unit()).collect();
    let u: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
    let (gb, ub, out) = (gpu.upload("g", &g).unwrap(), gpu.upload("u", &u).unwrap(), gpu.zeros("out", n).unwrap());
    let silu = |x: f64| x / (1.0 + (-x).exp());
    let gelu = |x: f64| 0.5 * x * (1.0 + (0.7978845608 * x * (1.0 + 0.044715 * x * x)).tanh());
    let cases: [(Activation, &dyn Fn(f64) -> f64); 2] = [(Activation::Silu, &silu), (Activation::GeluTanh, &gelu)];
    for (act, reference) in cases {
        let mut pass = gpu.pass();
        pass.gated(act, &gb, &ub, &out, n).unwrap();
        pass.submit().unwrap();
        let want: Vec<f64> = g.iter().zip(&u).map(|(&a, &b)| reference(a as f64) * b as f64).collect();
        let err = normalised_error(&gpu.read(&out).unwrap(), &want);
        assert!(err <= 1e-6, "{act:?}: normalised error {err:e}");
        // Rows of 40 gates met by one slice (at 24) of up rows of 100
        // (gemma4's per-layer inputs, one layer's slice of each token's row).
        let (rows, width, stride, at) = (7, 40, 100, 24);
        let mut pass = gpu.pass();
        pass.gated_rows(act, &gb, &ub, stride, at, &out, rows, width).unwrap();
        pass.submit().unwrap();
        let want: Vec<f64> =
            (0..rows * width).map(|i| reference(g[i] as f64) * u[i / width * stride + at + i % width] as f64).collect();
        let err = normalised_error(&gpu.read_first(&out, rows * width).unwrap(), &want);
        assert!(err <= 1e-6, "{act:?} over a slice of wider rows: normalised error {err:e}");
        let err = gpu.pass().gated_rows(act, &gb, &ub, stride, 70, &out, rows, width).err().unwrap();
        assert!(matches!(err, GpuError::Shape(_)), "a slice past its row: {err}");
    }
}

#[test]
fn scales_match_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng(33);
    let x: Vec<f32> = (0..300).map(|_| rng.unit()).collect();
    let xb = gpu.upload("x", &x).unwrap();
    let mut pass = gpu.pass();
    pass.scale(&xb, 0.37, 250).unwrap();
    pass.submit().unwrap();
    let got = gpu.read(&xb).unwrap();
    let want: Vec<f32> = x.iter().enumerate().map(|(i, &v)| if i < 250 { v * 0.37 } else { v }).collect();
    assert_eq!(got, want, "f32 products, each rounded once as the CPU rounds them");
}

#[test]
fn adds_in_place_copies_and_partial_reads_match_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng(32);
    let n = 1000;
    let x: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
    let u: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
    // The residual (as long as x), then a bias of 40 added to each of 25 rows.
    let (xb, ub, bias) =
        (gpu.upload("x", &x).unwrap(), gpu.upload("u", &u).unwrap(), gpu.upload("bias", &u[..40]).unwrap());
    let mut pass = gpu.pass();
    pass.add_to(&xb, &ub, n).unwrap();
    pass.add_to(&xb, &bias, n).unwrap();
    // u's values 10..50 copied to 50..90 of a buffer of 100.
    let copy = gpu.zeros("copy", 100).unwrap();
    pass.copy(&ub, 10, &copy, 50, 40).unwrap();
    pass.submit().unwrap();
    let want: Vec<f64> = (0..n).map(|i| x[i] as f64 + u[i] as f64 + u[i % 40] as f64).collect();
    let err = normalised_error(&gpu.read(&xb).unwrap(), &want);
    assert!(err <= 1e-7, "add_to: normalised error {err:e}");
    assert_eq!(&gpu.read(&copy).unwrap()[50..90], &u[10..50]);
    assert_eq!(gpu.read_first(&copy, 60).unwrap().len(), 60);
    // A bias that does not divide the values is refused.
    let err = gpu.pass().add_to(&xb, &gpu.upload("b", &u[..30]).unwrap(), n).err().unwrap();
    assert!(matches!(err, GpuError::Shape(_)), "{err}");
}

/// A pass's reads come back from one submit and one wait, in the order
/// asked, each as its buffer stood at that point of the pass (a kernel
/// recorded after a read does not change what it reads), however many
/// mappable buffers they fill: the first read past the one kept takes
/// another.
#[test]
fn a_pass_reads_back_what_it_asked_for_with_one_wait() {
    let Some(_) = gpu() else { return };
    // A device of its own, whose counts are this test's alone.
    let gpu = Gpu::open(None).unwrap();
    let mut rng = Rng(0x5eed_4ead);
    let a: Vec<f32> = (0..100).map(|_| rng.unit()).collect();
    // 200 KB, past the first mappable buffer's 64 KB.
    let big: Vec<f32> = (0..50_000).map(|_| rng.unit()).collect();
    let (ab, bigb) = (gpu.upload("a", &a).unwrap(), gpu.upload("big", &big).unwrap());
    let (submits, waits) = (gpu.submits(), gpu.waits());
    let mut pass = gpu.pass();
    pass.read_back(&ab, 10, 20).unwrap();
    pass.scale(&ab, 2.0, 100).unwrap();
    pass.read_back(&ab, 0, 100).unwrap();
    pass.read_back(&bigb, 1, 49_999).unwrap();
    pass.read_back(&ab, 95, 5).unwrap();
    pass.read_back(&ab, 0, 0).unwrap();
    let (kernels, read) = pass.submit_and_read().unwrap();
    assert_eq!((kernels, gpu.submits() - submits, gpu.waits() - waits), (1, 1, 1), "kernels, submits and waits");
    let doubled: Vec<f32> = a.iter().map(|v| 2.0 * v).collect();
    assert_eq!(read, [&a[10..30], &doubled[..], &big[1..], &doubled[95..]].concat());
    // The larger buffer is kept for the reads after.
    assert_eq!(gpu.read(&bigb).unwrap(), big);
    assert_eq!(gpu.read_first(&ab, 3).unwrap(), doubled[..3]);
    // A pass that reads nothing waits for nothing.
    let waits = gpu.waits();
    let mut pass = gpu.pass();
    pass.scale(&ab, 0.5, 100).unwrap();
    assert_eq!(pass.submit_and_read().unwrap(), (1, Vec::new()));
    assert_eq!(gpu.waits(), waits);
    // A read past its buffer is refused, naming the lengths.
    let err = gpu.pass().read_back(&ab, 90, 20).err().unwrap();
    assert!(matches!(&err, GpuError::Shape(m) if m.contains("20 values at 90")), "{err}");
}

#[test]
fn rope_matches_the_cpu_in_both_styles() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng(41);
    // Gemma 3's heads (256, all rotated) and a partial rotation (Qwen3.5's 64 of 256).
    for (rows, heads, head_dim, half) in [(3, 4, 256, 128), (5, 2, 256, 32)] {
        for halves in [false, true] {
            let x: Vec<f32> = (0..rows * heads * head_dim).map(|_| rng.unit()).collect();
            let angles: Vec<f64> = (0..rows * half).map(|_| 10.0 * rng.unit() as f64).collect();
            let cos: Vec<f32> = angles.iter().map(|a| a.cos() as f32).collect();
            let sin: Vec<f32> = angles.iter().map(|a| a.sin() as f32).collect();
            let mut want: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            for r in 0..rows {
                for h in 0..heads {
                    let base = (r * heads + h) * head_dim;
                    for i in 0..half {
                        let (ia, ib) =
                            if halves { (base + i, base + i + half) } else { (base + 2 * i, base + 2 * i + 1) };
                        let (c, s) = (cos[r * half + i] as f64, sin[r * half + i] as f64);
                        let (a, b) = (want[ia], want[ib]);
                        want[ia] = a * c - b * s;
                        want[ib] = a * s + b * c;
                    }
                }
            }
            let xb = gpu.upload("x", &x).unwrap();
            let (cb, sb) = (gpu.upload("cos", &cos).unwrap(), gpu.upload("sin", &sin).unwrap());
            let mut pass = gpu.pass();
            pass.rope(&xb, &cb, &sb, rows, heads, head_dim, half, halves).unwrap();
            pass.submit().unwrap();
            let err = normalised_error(&gpu.read(&xb).unwrap(), &want);
            assert!(err <= 1e-6, "rope {rows}x{heads}x{head_dim} half {half} halves {halves}: {err:e}");
        }
    }
}

/// Attention in f64 over keys and values rounded to f16, as the cache holds
/// them: `keys[p]`, `values[p]` are position p's rows.
/// A sequence's queries rotated and its keys and values stored in one
/// kernel against [`Pass::rope`] twice and [`Pass::kv_store`]: the same
/// bits, wrapping in a ring, in both pair layouts, with heads rotated only
/// in part (rope dimensions below the head's), in both cache formats.
#[test]
fn rotating_and_storing_in_one_kernel_is_its_parts_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng(0x5707e);
    // (query heads, key heads, head width, pairs rotated, value width, halves, format)
    for (n_head, n_head_kv, head_dim, half, width_v, halves, format) in [
        (9, 3, 64, 32, 192, false, KvFormat::F16),
        (4, 2, 10, 3, 14, true, KvFormat::F16),
        (3, 1, 6, 2, 6, false, KvFormat::F16),
        (9, 3, 64, 32, 192, true, KvFormat::Q8_0),
        (4, 2, 128, 24, 64, false, KvFormat::Q8_0),
    ] {
        let (from, rows, ring, start) = (2, 5, 6, 4);
        let (wq, wk) = (n_head * head_dim, n_head_kv * head_dim);
        let end = from + rows;
        let q: Vec<f32> = (0..end * wq).map(|_| rng.unit()).collect();
        let k: Vec<f32> = (0..end * wk).map(|_| rng.unit()).collect();
        let v: Vec<f32> = (0..end * width_v).map(|_| rng.unit()).collect();
        let cos: Vec<f32> = (0..end * half).map(|_| rng.unit()).collect();
        let sin: Vec<f32> = (0..end * half).map(|_| rng.unit()).collect();
        let (cb, sb, vb) = (gpu.upload("cos", &cos).unwrap(), gpu.upload("sin", &sin).unwrap(), gpu.upload("v", &v).unwrap());
        let rotation = Rotation { head_dim, half, halves };
        // Apart: every row of the pass rotated, this sequence's stored.
        let (qa, ka, apart) = (gpu.upload("q", &q).unwrap(), gpu.upload("k", &k).unwrap(), gpu.kv_layer(ring, wk, width_v, format).unwrap());
        let mut pass = gpu.pass();
        pass.rope(&qa, &cb, &sb, end, n_head, head_dim, half, halves).unwrap();
        pass.rope(&ka, &cb, &sb, end, n_head_kv, head_dim, half, halves).unwrap();
        pass.kv_store(&apart, &ka, &vb, from, rows, start).unwrap();
        pass.submit().unwrap();
        let (qt, kt, together) = (gpu.upload("q", &q).unwrap(), gpu.upload("k", &k).unwrap(), gpu.kv_layer(ring, wk, width_v, format).unwrap());
        let mut pass = gpu.pass();
        pass.rope_and_store(&together, &qt, n_head, &kt, &vb, &cb, &sb, rotation, from, rows, start).unwrap();
        assert_eq!(pass.submit().unwrap(), 1);
        let what = format!("{rotation:?}, {n_head}/{n_head_kv} heads, {format:?}");
        assert_eq!(gpu.read_kv(&together, ring).unwrap(), gpu.read_kv(&apart, ring).unwrap(), "the cache, {what}");
        let (rotated, want) = (gpu.read(&qt).unwrap(), gpu.read(&qa).unwrap());
        assert_eq!(rotated[from * wq..], want[from * wq..], "the sequence's queries, {what}");
        assert_eq!(rotated[..from * wq], q[..from * wq], "the rows before the sequence's, {what}");
        assert_eq!(gpu.read(&kt).unwrap(), k, "the keys are read, not rotated in place");
    }
    let layer = gpu.kv_layer(4, 6, 6, KvFormat::F16).unwrap();
    let x = gpu.zeros("x", 64).unwrap();
    let rotation = Rotation { head_dim: 6, half: 2, halves: false };
    let err = gpu.pass().rope_and_store(&layer, &x, 1, &x, &x, &x, &x, rotation, 0, 5, 0).err().unwrap();
    assert!(matches!(err, GpuError::Shape(_)), "more rows than the ring holds: {err}");
}

/// The reference takes `keys` and `values` as the cache holds them
/// ([`held`]).
fn attention_reference(s: &AttentionShape, q: &[f32], keys: &[Vec<f32>], values: &[Vec<f32>]) -> Vec<f64> {
    let group = s.n_head / s.n_head_kv;
    let mut out = vec![0f64; s.t * s.n_head * s.head_dim_v];
    for r in 0..s.t {
        let pos = s.start + r;
        let first = s.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        for h in 0..s.n_head {
            let kvh = h / group;
            let qh = &q[(r * s.n_head + h) * s.head_dim_k..][..s.head_dim_k];
            let scores: Vec<f64> = (first..=pos)
                .map(|j| {
                    let k = &keys[j][kvh * s.head_dim_k..][..s.head_dim_k];
                    qh.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * s.scale as f64
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::MIN, f64::max);
            let weights: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
            let sum: f64 = weights.iter().sum();
            let o = &mut out[(r * s.n_head + h) * s.head_dim_v..][..s.head_dim_v];
            for (j, w) in (first..=pos).zip(&weights) {
                let v = &values[j][kvh * s.head_dim_v..][..s.head_dim_v];
                for (od, &vd) in o.iter_mut().zip(v) {
                    *od += w / sum * vd as f64;
                }
            }
        }
    }
    out
}

/// The budget of attention: f32 scores and sums of the cache's rows against f64.
const ATTENTION_BUDGET: f64 = 1e-5;

/// A row as a cache of `format` holds it: rounded to f16, or quantized to
/// Q8_0 blocks as the CPU's cache quantizes them.
fn held(format: KvFormat, row: &[f32]) -> Vec<f32> {
    match format {
        KvFormat::F16 => row.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
        KvFormat::Q8_0 => {
            let mut blocks = vec![0u8; row.len() / 32 * 34];
            ember_quant::quantize_row_q8_0(row, &mut blocks).unwrap();
            blocks
                .chunks_exact(34)
                .flat_map(|b| {
                    let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                    b[2..].iter().map(move |&q| d * q as i8 as f32)
                })
                .collect()
        }
    }
}

/// Passes of `passes` tokens in turn through one layer's cache (a ring of
/// `ring` rows), each pass's attention against the reference. The passes'
/// rows sit 0, 1 or 2 rows into their buffers, behind rows of another
/// sequence, as a pass over several sequences lays them out.
fn check_attention(gpu: &Gpu, shape: AttentionShape, ring: usize, passes: &[usize], seed: u64) {
    check_attention_in(gpu, KvFormat::F16, shape, ring, passes, seed)
}

fn check_attention_in(gpu: &Gpu, format: KvFormat, shape: AttentionShape, ring: usize, passes: &[usize], seed: u64) {
    let mut rng = Rng(seed);
    let (wk, wv) = (shape.n_head_kv * shape.head_dim_k, shape.n_head_kv * shape.head_dim_v);
    let (wq, wo) = (shape.n_head * shape.head_dim_k, shape.n_head * shape.head_dim_v);
    let layer = gpu.kv_layer(ring, wk, wv, format).unwrap();
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    let mut start = 0;
    for (i, &t) in passes.iter().enumerate() {
        let row0 = i % 3;
        let s = AttentionShape { t, start, row0, ..shape };
        let q: Vec<f32> = (0..t * wq).map(|_| rng.unit()).collect();
        let k: Vec<f32> = (0..t * wk).map(|_| 2.0 * rng.unit()).collect();
        let v: Vec<f32> = (0..t * wv).map(|_| rng.unit()).collect();
        keys.extend(k.chunks(wk).map(|r| held(format, r)));
        values.extend(v.chunks(wv).map(|r| held(format, r)));
        let behind = |x: &[f32], width: usize| -> Vec<f32> { (0..row0 * width).map(|j| j as f32).chain(x.iter().copied()).collect() };
        let (qb, kb, vb) = (
            gpu.upload("q", &behind(&q, wq)).unwrap(),
            gpu.upload("k", &behind(&k, wk)).unwrap(),
            gpu.upload("v", &behind(&v, wv)).unwrap(),
        );
        let out = gpu.zeros("out", (row0 + t) * wo).unwrap();
        let mut pass = gpu.pass();
        pass.kv_store(&layer, &kb, &vb, row0, t, start).unwrap();
        pass.attention(&s, &qb, &layer, &out).unwrap();
        pass.submit().unwrap();
        let want = attention_reference(&s, &q, &keys, &values);
        let got = gpu.read(&out).unwrap();
        assert!(got[..row0 * wo].iter().all(|&x| x == 0.0), "attention {s:?} wrote outside its rows");
        let err = normalised_error(&got[row0 * wo..], &want);
        assert!(err <= ATTENTION_BUDGET, "attention {s:?} over a {format:?} ring of {ring}: normalised error {err:e}");
        start += t;
    }
}

fn shape(
    n_head: usize,
    n_head_kv: usize,
    head_dim_k: usize,
    head_dim_v: usize,
    window: Option<usize>,
) -> AttentionShape {
    let scale = 1.0 / (head_dim_k as f32).sqrt();
    AttentionShape { t: 0, start: 0, row0: 0, n_head, n_head_kv, head_dim_k, head_dim_v, scale, window }
}

#[test]
fn attention_of_prompts_and_decoded_tokens_matches_the_cpu() {
    let Some(gpu) = gpu() else { return };
    // SmolLM2's heads (9 over 3 key-value heads of 64): a prompt that crosses
    // a block of 64 positions, then tokens decoded one at a time.
    check_attention(gpu, shape(9, 3, 64, 64, None), 256, &[70, 1, 1, 60, 1], 51);
    // Gemma 3's (4 over 1, 256 wide) and Gemma 4's global heads (512).
    check_attention(gpu, shape(4, 1, 256, 256, None), 128, &[33, 1], 52);
    check_attention(gpu, shape(2, 1, 512, 512, None), 64, &[5, 1], 53);
    // Keys wider than the values, their queries staged as wide as the keys,
    // and heads of 4k + 2 elements: the last of the keys' chunks staged in
    // workgroup memory is a short one, ending on a lone pair.
    check_attention(gpu, shape(6, 2, 98, 64, None), 160, &[70, 1, 60, 1], 54);
}

/// A Q8_0 cache holds the blocks the CPU's cache would (the same scale and
/// quants, rounded as llama.cpp's x86 quantizer rounds), reads back in the
/// CPU's format, and takes that format back as it gave it.
#[test]
fn a_q8_0_cache_holds_the_cpus_blocks() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng(0x0880);
    let (ring, wk, wv, rows) = (7, 96, 64, 5);
    let layer = gpu.kv_layer(ring, wk, wv, KvFormat::Q8_0).unwrap();
    // Keys of every scale, a block of zeros, and quants exactly halfway
    // between two steps (ties go to even).
    let mut k: Vec<f32> = (0..rows * wk).map(|i| rng.unit() * (1 + i % 7) as f32).collect();
    k[32..64].iter_mut().for_each(|x| *x = 0.0);
    for (j, x) in k[64..96].iter_mut().enumerate() {
        *x = (j as f32 - 16.0) + 0.5;
    }
    k[64] = 127.0;
    let v: Vec<f32> = (0..rows * wv).map(|_| rng.unit()).collect();
    let (kb, vb) = (gpu.upload("k", &k).unwrap(), gpu.upload("v", &v).unwrap());
    let mut pass = gpu.pass();
    pass.kv_store(&layer, &kb, &vb, 0, rows, 3).unwrap();
    pass.submit().unwrap();
    let (got_k, got_v) = gpu.read_kv(&layer, ring).unwrap();
    let cpu = |x: &[f32]| {
        let mut out = vec![0u8; x.len() / 32 * 34];
        ember_quant::quantize_row_q8_0(x, &mut out).unwrap();
        out
    };
    // Positions 3.. wrap the ring of 7: rows 3, 4, 5, 6, 0.
    for (r, slot) in [3, 4, 5, 6, 0].into_iter().enumerate() {
        let (kr, vr) = (wk / 32 * 34, wv / 32 * 34);
        assert_eq!(got_k[slot * kr..(slot + 1) * kr], cpu(&k[r * wk..(r + 1) * wk]), "keys of row {r}");
        assert_eq!(got_v[slot * vr..(slot + 1) * vr], cpu(&v[r * wv..(r + 1) * wv]), "values of row {r}");
    }
    // The CPU's blocks written back are read back as they were.
    let theirs: Vec<u8> = (0..ring * wk / 32).flat_map(|b| cpu(&k[(b % (rows * wk / 32)) * 32..][..32])).collect();
    let (kr, vr) = (wk / 32 * 34, wv / 32 * 34);
    let values: Vec<u8> = got_v.clone();
    gpu.write_kv(&layer, &theirs[..4 * kr], &values[..4 * vr]).unwrap();
    let (back_k, back_v) = gpu.read_kv(&layer, 4).unwrap();
    assert_eq!(back_k, theirs[..4 * kr]);
    assert_eq!(back_v, values[..4 * vr]);
    let err = gpu.write_kv(&layer, &theirs[..kr - 34], &values[..vr]).err().unwrap();
    assert!(matches!(err, GpuError::Shape(_)), "a row that is not whole blocks: {err}");
    let err = gpu.kv_layer(4, 48, 64, KvFormat::Q8_0).err().unwrap();
    assert!(err.to_string().contains("whole units of 32"), "{err}");
    // Rows of whole blocks whose heads are not: refused, not read across heads.
    let halves = gpu.kv_layer(8, 32, 32, KvFormat::Q8_0).unwrap();
    let (q, out) = (gpu.zeros("q", 64).unwrap(), gpu.zeros("out", 64).unwrap());
    let sh = AttentionShape { t: 1, ..shape(2, 2, 16, 16, None) };
    let err = gpu.pass().attention(&sh, &q, &halves, &out).err().unwrap();
    assert!(err.to_string().contains("heads must be whole units of the cache's format (32 elements of Q8_0)"), "{err}");
}

#[test]
fn attention_over_a_q8_0_cache_matches_the_cpu() {
    let Some(gpu) = gpu() else { return };
    // Against the rows the CPU's Q8_0 cache holds: SmolLM2's heads over
    // a prompt and decoded tokens, Gemma 3's 256-wide heads, a sliding
    // window's ring, and a decoded token's positions cut into spans.
    check_attention_in(gpu, KvFormat::Q8_0, shape(9, 3, 64, 64, None), 256, &[70, 1, 1, 60, 1], 81);
    check_attention_in(gpu, KvFormat::Q8_0, shape(4, 1, 256, 256, None), 128, &[33, 1], 82);
    check_attention_in(gpu, KvFormat::Q8_0, shape(4, 2, 32, 32, Some(40)), 56, &[16, 16, 16, 1, 16, 3, 1], 83);
    check_attention_in(gpu, KvFormat::Q8_0, shape(24, 8, 128, 128, None), 700, &[600, 1, 1], 84);
    check_attention_in(gpu, KvFormat::Q8_0, shape(6, 2, 96, 64, None), 160, &[70, 1, 60, 1], 85);
}

#[test]
fn attention_in_a_sliding_window_ring_matches_the_cpu() {
    let Some(gpu) = gpu() else { return };
    // A window of 40 in a ring of 40 + 16 rows: passes of up to 16 tokens
    // wrap the ring several times, and queries see only their window.
    check_attention(gpu, shape(4, 2, 32, 32, Some(40)), 56, &[16, 16, 16, 1, 16, 3, 1, 16, 16], 61);
}

#[test]
fn attention_split_into_spans_matches_the_cpu() {
    if gpu().is_none() {
        return;
    }
    // A device of its own that cuts every query's positions into spans of
    // 64, each a workgroup, folded after. A prompt's first queries see fewer
    // positions than its last: their later spans hold none (every score
    // masked) and must add nothing. Decoded tokens at depth cross several
    // spans; in a window, the spans start at each query's first position.
    let mut split = Gpu::open(None).unwrap();
    split.split_attention_every(64);
    check_attention(&split, shape(9, 3, 64, 64, None), 400, &[200, 1, 1, 37, 1, 130], 71);
    check_attention(&split, shape(4, 2, 128, 128, Some(150)), 200, &[40, 40, 40, 40, 1, 1, 40], 72);
    // Spans as the device chooses them for a decoded token (a workgroup a
    // head is too few), at depth 600 after a prompt read whole.
    let Some(gpu) = gpu() else { return };
    check_attention(gpu, shape(24, 8, 128, 128, None), 700, &[600, 1, 1, 1], 73);
}

/// Each of a prompt's queries gets the attention it gets alone, bit for
/// bit, as a decoded token at its position: the same blocks of positions,
/// the same groups of four, folded in the same order, whatever the other
/// queries of its pass and however the blocks are shared out over
/// workgroups (what a hybrid's checkpoints and the pass-size invariance of
/// the slots stand on). By default a decoded token's blocks are shared out
/// and a long prompt's are not; the tests also force both ways, and
/// workgroups of several neighbouring queries (each key and value row read
/// once for them, the queries' first and last blocks their own).
#[test]
fn a_prompts_queries_get_the_attention_each_gets_alone() {
    if gpu().is_none() {
        return;
    }
    let mut rng = Rng(0xa77e);
    let mut devices: Vec<(Gpu, &str)> = Vec::new();
    for (span, queries, how) in [
        (None, None, "as the device chooses"),
        (Some(1 << 20), None, "whole"),
        (Some(64), None, "a block a workgroup"),
        (Some(1 << 20), Some(4), "whole, four queries a workgroup"),
        (None, Some(3), "three queries a workgroup where not shared out"),
    ] {
        let mut gpu = Gpu::open(None).unwrap();
        if let Some(span) = span {
            gpu.split_attention_every(span);
        }
        if let Some(queries) = queries {
            gpu.attention_queries(queries);
        }
        devices.push((gpu, how));
    }
    // No window, a window reaching back to the start, one that does not
    // (each query's first block partly outside it), a prompt of queries
    // enough (with its four heads) to take a workgroup each, and one in a
    // window of 64 whose workgroups of several queries see three blocks
    // between them where each query sees two.
    for (window, start, t) in [(None, 100, 11), (Some(200), 100, 11), (Some(40), 100, 11), (None, 0, 7), (None, 150, 130), (Some(64), 122, 300)] {
        let sh = AttentionShape { t, start, row0: 0, ..shape(4, 2, 32, 48, window) };
        let (wk, wv, wq, wo) = (2 * 32, 2 * 48, 4 * 32, 4 * 48);
        let n = start + t;
        let k: Vec<f32> = (0..n * wk).map(|_| 2.0 * rng.unit()).collect();
        let v: Vec<f32> = (0..n * wv).map(|_| rng.unit()).collect();
        let q: Vec<f32> = (0..t * wq).map(|_| rng.unit()).collect();
        let mut first: Option<Vec<f32>> = None;
        for (gpu, how) in &devices {
            let layer = gpu.kv_layer(n, wk, wv, KvFormat::F16).unwrap();
            let (kb, vb, qb) = (gpu.upload("k", &k).unwrap(), gpu.upload("v", &v).unwrap(), gpu.upload("q", &q).unwrap());
            let out = gpu.zeros("out", t * wo).unwrap();
            let mut pass = gpu.pass();
            pass.kv_store(&layer, &kb, &vb, 0, n, 0).unwrap();
            pass.attention(&sh, &qb, &layer, &out).unwrap();
            pass.submit().unwrap();
            let together = gpu.read(&out).unwrap();
            let first = first.get_or_insert_with(|| together.clone());
            assert_eq!(&together, first, "{t} queries at {start}, window {window:?}: {how} against as the device chooses");
            for i in 0..t {
                let one = AttentionShape { t: 1, start: start + i, ..sh };
                let qi = gpu.upload("q", &q[i * wq..(i + 1) * wq]).unwrap();
                let oi = gpu.zeros("out", wo).unwrap();
                let mut pass = gpu.pass();
                pass.attention(&one, &qi, &layer, &oi).unwrap();
                pass.submit().unwrap();
                assert_eq!(
                    gpu.read(&oi).unwrap(),
                    together[i * wo..(i + 1) * wo],
                    "query {i} of {t} at {start}, window {window:?}, {how}"
                );
            }
        }
    }
}

/// A workgroup of attention takes several query heads of one key-value
/// head (each key and value element read once for them), each head's
/// arithmetic its own: every head gets the bits it gets in a call of its
/// own, over a cache of its key-value head alone. Both cache formats, a
/// prompt (each query's blocks in one workgroup) and a decoded token at
/// depth (its blocks shared out), heads of 64 (four a workgroup) and of 256
/// (three of six, four value elements a thread); and the same with
/// workgroups of up to four queries.
#[test]
fn heads_taken_together_get_the_bits_each_gets_alone() {
    let Some(alone) = gpu() else { return };
    let mut tiled = Gpu::open(None).unwrap();
    tiled.split_attention_every(1 << 20);
    tiled.attention_queries(4);
    let mut rng = Rng(0x9e4d);
    for (format, gpu) in [(KvFormat::F16, alone), (KvFormat::Q8_0, alone), (KvFormat::F16, &tiled), (KvFormat::Q8_0, &tiled)] {
        for (n_head, n_head_kv, dk, dv, start, t) in [(8, 2, 64, 64, 90, 9), (8, 2, 64, 64, 700, 1), (6, 2, 64, 256, 70, 3)] {
            let sh = AttentionShape { t, start, ..shape(n_head, n_head_kv, dk, dv, None) };
            let (wk, wv) = (n_head_kv * dk, n_head_kv * dv);
            let n = start + t;
            let k: Vec<f32> = (0..n * wk).map(|_| 2.0 * rng.unit()).collect();
            let v: Vec<f32> = (0..n * wv).map(|_| rng.unit()).collect();
            let q: Vec<f32> = (0..t * n_head * dk).map(|_| rng.unit()).collect();
            let layer = gpu.kv_layer(n, wk, wv, format).unwrap();
            let (kb, vb, qb) = (gpu.upload("k", &k).unwrap(), gpu.upload("v", &v).unwrap(), gpu.upload("q", &q).unwrap());
            let out = gpu.zeros("out", t * n_head * dv).unwrap();
            let mut pass = gpu.pass();
            pass.kv_store(&layer, &kb, &vb, 0, n, 0).unwrap();
            pass.attention(&sh, &qb, &layer, &out).unwrap();
            pass.submit().unwrap();
            let together = gpu.read(&out).unwrap();
            for h in 0..n_head {
                let kvh = h / (n_head / n_head_kv);
                let column = |rows: &[f32], width: usize, at: usize, of: usize| -> Vec<f32> {
                    rows.chunks(width).flat_map(|r| r[at * of..(at + 1) * of].to_vec()).collect()
                };
                let one = AttentionShape { n_head: 1, n_head_kv: 1, ..sh };
                let layer = gpu.kv_layer(n, dk, dv, format).unwrap();
                let kb = gpu.upload("k", &column(&k, wk, kvh, dk)).unwrap();
                let vb = gpu.upload("v", &column(&v, wv, kvh, dv)).unwrap();
                let qb = gpu.upload("q", &column(&q, n_head * dk, h, dk)).unwrap();
                let out = gpu.zeros("out", t * dv).unwrap();
                let mut pass = gpu.pass();
                pass.kv_store(&layer, &kb, &vb, 0, n, 0).unwrap();
                pass.attention(&one, &qb, &layer, &out).unwrap();
                pass.submit().unwrap();
                assert_eq!(
                    gpu.read(&out).unwrap(),
                    column(&together, n_head * dv, h, dv),
                    "{format:?}: head {h} of {n_head} over {n_head_kv}, {t} queries at {start}"
                );
            }
        }
    }
}

#[test]
fn a_dropped_cache_layer_is_freed_though_kernels_bound_it() {
    if gpu().is_none() {
        return;
    }
    // A device of its own, so that no other test's buffers come and go.
    let gpu = Gpu::open(None).unwrap();
    let before = gpu.allocated_bytes().expect("Vulkan's allocator keeps a count");
    let layer = gpu.kv_layer(4096, 128, 128, KvFormat::F16).unwrap();
    let (q, out) = (gpu.zeros("q", 256).unwrap(), gpu.zeros("out", 256).unwrap());
    let s = AttentionShape { t: 1, start: 0, ..shape(2, 1, 128, 128, None) };
    let mut pass = gpu.pass();
    pass.attention(&s, &q, &layer, &out).unwrap();
    pass.submit().unwrap();
    gpu.read_first(&out, 1).unwrap();
    let held = gpu.allocated_bytes().unwrap();
    assert!(held >= before + 2 * 4096 * 128 * 2, "{before} -> {held}");
    drop((layer, q, out));
    // The next buffer made (a new session's, say) lets the kept bind groups go.
    let next = gpu.zeros("next", 1).unwrap();
    gpu.read_first(&next, 1).unwrap();
    let after = gpu.allocated_bytes().unwrap();
    assert!(after < before + 4096 * 128 * 2, "the layer's 2 MiB are still held: {before} -> {held} -> {after}");
}

#[test]
fn attention_refuses_a_ring_that_no_longer_holds_its_window() {
    let Some(gpu) = gpu() else { return };
    let layer = gpu.kv_layer(40, 64, 64, KvFormat::F16).unwrap();
    let s = AttentionShape { t: 16, start: 100, ..shape(2, 2, 32, 32, Some(40)) };
    let (q, out) = (gpu.zeros("q", 16 * 64).unwrap(), gpu.zeros("out", 16 * 64).unwrap());
    let err = gpu.pass().attention(&s, &q, &layer, &out).err().unwrap();
    assert!(err.to_string().contains("the ring no longer holds every position the queries see"), "{err}");
}

/// The staged queries are as wide as the widest head the kernel holds: keys
/// wider than that are refused as values are, never read past their stage.
#[test]
fn attention_refuses_heads_wider_than_it_holds() {
    let Some(gpu) = gpu() else { return };
    for (dk, dv, why) in [(576, 64, "key heads are wider"), (64, 576, "value heads are wider")] {
        let layer = gpu.kv_layer(64, dk, dv, KvFormat::F16).unwrap();
        let s = AttentionShape { t: 1, start: 0, ..shape(1, 1, dk, dv, None) };
        let (q, out) = (gpu.zeros("q", dk).unwrap(), gpu.zeros("out", dv).unwrap());
        let err = gpu.pass().attention(&s, &q, &layer, &out).err().unwrap();
        assert!(err.to_string().contains(why), "{dk} x {dv}: {err}");
    }
}

/// The host's routing: each row's softmax, its top `n_used` (ties to the
/// lower expert), normalised and scaled as `Routing` asks.
fn route_reference(logits: &[f32], r: &Routing) -> (Vec<u32>, Vec<f64>) {
    let (mut ids, mut weights) = (Vec::new(), Vec::new());
    for row in logits.chunks(r.n_expert) {
        let top = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
        let sum: f64 = row.iter().map(|&v| (v as f64 - top).exp()).sum();
        let prob: Vec<f64> = row.iter().map(|&v| (v as f64 - top).exp() / sum).collect();
        let mut order: Vec<usize> = (0..r.n_expert).collect();
        order.sort_by(|&a, &b| prob[b].total_cmp(&prob[a]).then(a.cmp(&b)));
        let chosen = &order[..r.n_used];
        let total: f64 = chosen.iter().map(|&i| prob[i]).sum();
        let div = if r.normalise { total } else { 1.0 };
        ids.extend(chosen.iter().map(|&i| i as u32));
        weights.extend(chosen.iter().map(|&i| prob[i] / div * r.scale as f64));
    }
    (ids, weights)
}

fn ids_buffer(gpu: &Gpu, ids: &[u32]) -> ember_gpu::DeviceBuffer {
    let bits: Vec<f32> = ids.iter().map(|&i| f32::from_bits(i)).collect();
    gpu.upload("ids", &bits).unwrap()
}

#[test]
fn routing_chooses_the_cpus_experts_with_their_weights() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng(61);
    for (normalise, scale) in [(true, 1.0), (false, 2.5)] {
        let r = Routing { rows: 70, n_expert: 9, n_used: 3, normalise, scale };
        let mut logits: Vec<f32> = (0..r.rows * r.n_expert).map(|_| 4.0 * rng.unit()).collect();
        // A tie in the first row: the lower expert goes first.
        logits[..r.n_expert].copy_from_slice(&[0.5, 2.0, 1.0, 2.0, -1.0, 0.0, 0.0, 1.5, 0.2]);
        let (want_ids, want_w) = route_reference(&logits, &r);
        assert_eq!(want_ids[..3], [1, 3, 7]);
        let lb = gpu.upload("logits", &logits).unwrap();
        let (ids, weights) = (gpu.zeros("ids", r.rows * r.n_used).unwrap(), gpu.zeros("w", r.rows * r.n_used).unwrap());
        let mut pass = gpu.pass();
        pass.moe_route(&r, &lb, &ids, &weights).unwrap();
        pass.submit().unwrap();
        let got_ids: Vec<u32> = gpu.read(&ids).unwrap().iter().map(|v| v.to_bits()).collect();
        assert_eq!(got_ids, want_ids, "normalise {normalise}");
        let err = normalised_error(&gpu.read(&weights).unwrap(), &want_w);
        assert!(err <= 1e-6, "routing weights: normalised error {err:e}");
    }
    let r = Routing { rows: 2, n_expert: 4, n_used: 5, normalise: true, scale: 1.0 };
    let b = gpu.zeros("b", 20).unwrap();
    assert!(matches!(gpu.pass().moe_route(&r, &b, &b, &b), Err(GpuError::Shape(_))));
}

/// Expert products of every format: `rows` pairs, each row's input met by
/// the `n_used` experts it chose (`x_group`), on a device whose bindings
/// hold `per_binding` bytes (the tensor in runs of whole experts).
fn check_matmul_id(gpu: &Gpu, ty: GgmlType, n_expert: usize, rows: usize, cols: usize, seed: u64) -> usize {
    let (n_inputs, n_used) = (4, 3);
    let n = n_inputs * n_used;
    let mut rng = Rng(seed);
    let experts: Vec<Vec<u8>> = (0..n_expert).map(|_| random_matrix(&mut rng, ty, rows, cols)).collect();
    let x: Vec<f32> = (0..n_inputs * cols).map(|_| rng.unit()).collect();
    // Every expert chosen somewhere, the last one twice in a row's choice
    // of another: ids need not be distinct for the product.
    let ids: Vec<u32> = (0..n).map(|c| ((c * 5 + c / n_used) % n_expert) as u32).collect();
    let row_bytes = ty.row_bytes(cols as u64).unwrap() as usize;
    let mut want = vec![0f64; n * rows];
    let mut deq = vec![0f32; cols];
    for c in 0..n {
        let w = &experts[ids[c] as usize];
        let xc = &x[(c / n_used) * cols..(c / n_used + 1) * cols];
        for r in 0..rows {
            ember_quant::dequantize_row(ty, &w[r * row_bytes..(r + 1) * row_bytes], &mut deq).unwrap();
            want[c * rows + r] = deq.iter().zip(xc).map(|(&a, &b)| a as f64 * b as f64).sum();
        }
    }
    let w = gpu.upload_experts("test", ty, n_expert, rows, cols, |e| &experts[e]).unwrap();
    let (xb, idb, y) = (gpu.upload("x", &x).unwrap(), ids_buffer(gpu, &ids), gpu.zeros("y", n * rows).unwrap());
    let mut pass = gpu.pass();
    pass.matmul_id(&w, &xb, n_used, &idb, n, &y).unwrap();
    pass.submit().unwrap();
    let err = normalised_error(&gpu.read(&y).unwrap(), &want);
    assert!(err <= MATMUL_BUDGET, "{ty} experts: normalised error {err:e} > {MATMUL_BUDGET:e}");
    w.runs()
}

#[test]
fn expert_products_of_every_format_match_the_cpu() {
    let Some(gpu) = gpu() else { return };
    for (i, ty) in FORMATS.into_iter().enumerate() {
        let cols = if ty.block_size() == 256 { 256 } else { 96 };
        assert_eq!(check_matmul_id(gpu, ty, 5, 7, cols, 0x1d + i as u64), 1);
    }
    // Expert tensors past one binding: runs of whole experts, each
    // dispatch answering the pairs whose expert it holds.
    let mut small = Gpu::open(None).unwrap();
    small.limit_bindings(4096);
    // 13 rows of 3 blocks of Q4_0 (54 bytes) an expert: 5 experts a run.
    assert_eq!(check_matmul_id(&small, GgmlType::Q4_0, 12, 13, 96, 0x2d), 3);
    let err = small.upload_experts("big", GgmlType::F32, 2, 64, 32, |_| &[0u8; 8192][..]).err().unwrap();
    assert!(err.to_string().starts_with("big: one expert takes 8192 bytes"), "{err}");
}

#[test]
fn experts_are_summed_by_their_weights_and_scales() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng(62);
    let (rows, n_used, width, n_expert) = (5, 2, 70, 4);
    let y: Vec<f32> = (0..rows * n_used * width).map(|_| rng.unit()).collect();
    let ids: Vec<u32> = (0..rows * n_used).map(|c| (c * 3 % n_expert) as u32).collect();
    let weights: Vec<f32> = (0..rows * n_used).map(|_| (rng.unit() + 1.0) / 2.0).collect();
    let scale: Vec<f32> = (0..n_expert).map(|_| 1.0 + rng.unit()).collect();
    let before: Vec<f32> = (0..rows * width).map(|_| rng.unit()).collect();
    let (yb, idb, wb, sb) =
        (gpu.upload("y", &y).unwrap(), ids_buffer(gpu, &ids), gpu.upload("w", &weights).unwrap(), gpu.upload("s", &scale).unwrap());
    for accumulate in [false, true] {
        let out = gpu.upload("out", &before).unwrap();
        let mut pass = gpu.pass();
        pass.moe_combine(&yb, &idb, &wb, &sb, rows, n_used, width, &out, accumulate).unwrap();
        pass.submit().unwrap();
        let want: Vec<f64> = (0..rows * width)
            .map(|k| {
                let (j, i) = (k / width, k % width);
                let sum: f64 = (0..n_used)
                    .map(|s| {
                        let c = j * n_used + s;
                        y[c * width + i] as f64 * scale[ids[c] as usize] as f64 * weights[c] as f64
                    })
                    .sum();
                if accumulate { before[k] as f64 + sum } else { sum }
            })
            .collect();
        let err = normalised_error(&gpu.read(&out).unwrap(), &want);
        assert!(err <= 1e-6, "accumulate {accumulate}: normalised error {err:e}");
    }
}

#[test]
fn the_top_of_each_row_is_the_cpus_with_ties_to_the_lower_index() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng(71);
    let (rows, n, k) = (3, 5000, 41);
    // Values on a coarse grid, so that ties are many; a -inf in the first row.
    let mut x: Vec<f32> = (0..rows * n).map(|_| (rng.unit() * 200.0).round() / 4.0).collect();
    x[17] = f32::NEG_INFINITY;
    let xb = gpu.upload("x", &x).unwrap();
    let out = gpu.zeros("top", rows * k * 2).unwrap();
    let mut pass = gpu.pass();
    pass.top_k(&xb, n, rows, k, &out).unwrap();
    pass.submit().unwrap();
    let got = gpu.read_top(&out, rows * k).unwrap();
    for (r, row) in x.chunks(n).enumerate() {
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
        let want: Vec<(u32, f32)> = order[..k].iter().map(|&i| (i, row[i as usize])).collect();
        assert_eq!(got[r * k..(r + 1) * k], want[..], "row {r}");
    }
    // A whole row, the -inf last.
    let small = gpu.upload("x", &x[..20]).unwrap();
    let mut pass = gpu.pass();
    pass.top_k(&small, 20, 1, 20, &out).unwrap();
    pass.submit().unwrap();
    assert_eq!(gpu.read_top(&out, 20).unwrap()[19], (17, f32::NEG_INFINITY));
    assert!(matches!(gpu.pass().top_k(&small, 20, 1, 21, &out), Err(GpuError::Shape(_))));
}

/// The attention's and the gated product's outputs written laid out for
/// the product that reads them next: that product reads them in place and
/// gives the same bits as over the outputs as they are, laid out by a
/// kernel of its own. The attention both whole and cut into spans (its
/// merge writes the outputs then).
#[test]
fn outputs_laid_out_for_the_next_product_give_it_the_same_bits() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng(0x1a1d);
    let ty = GgmlType::Q4_0;
    // A gated feed-forward of 64 over inputs of 32, then a product of 24 rows over its 64.
    let (ff, n) = (64, 3);
    let (gate, up) = (random_matrix(&mut rng, ty, ff, 32), random_matrix(&mut rng, ty, ff, 32));
    let pair = gpu.upload_stacked("pair", ty, 32, &[(ff, &gate), (ff, &up)]).unwrap().unwrap();
    let down = gpu.upload_matrix("down", ty, 24, ff, &random_matrix(&mut rng, ty, 24, ff)).unwrap();
    let x = gpu.upload("x", &(0..n * 32).map(|_| rng.unit()).collect::<Vec<_>>()).unwrap();
    let (plain, laid) = (gpu.zeros("act", n * ff).unwrap(), gpu.zeros("act laid out", n * ff).unwrap());
    let (ya, yb) = (gpu.zeros("ya", n * 24).unwrap(), gpu.zeros("yb", n * 24).unwrap());
    let mut pass = gpu.pass();
    pass.matmul_gated(&pair, Activation::Silu, &x, n, &plain).unwrap();
    pass.matmul(&down, &plain, n, &ya).unwrap();
    assert_eq!(pass.submit().unwrap(), 4, "laying out, gated, laying out, product");
    let mut pass = gpu.pass();
    pass.matmul_gated_laid_out(&pair, Activation::Silu, &x, n, &laid, 32).unwrap();
    pass.matmul(&down, &laid, n, &yb).unwrap();
    assert_eq!(pass.submit().unwrap(), 3, "laying out, gated and laid out, product");
    let (want, got) = (gpu.read(&ya).unwrap(), gpu.read(&yb).unwrap());
    assert!(want.iter().any(|&v| v != 0.0));
    assert_eq!(got, want, "the product over the gated outputs laid out");
    let (plain, laid) = (gpu.read(&plain).unwrap(), gpu.read(&laid).unwrap());
    for (c, row) in plain.chunks(ff).enumerate() {
        for (k, &v) in row.iter().enumerate() {
            assert_eq!(laid[c * ff + (k % 32) * 2 + k / 32], v, "element {k} of row {c}, laid out");
        }
    }

    // Attention of 4 heads over 2 of 16 (rows of 64, two blocks of 32), a
    // prompt of 5, then a product of 8 rows over its rows: from an empty
    // cache whole, and at depth 70 in spans of 64.
    let wo_bytes = random_matrix(&mut rng, ty, 8, 64);
    let mut split = Gpu::open(None).unwrap();
    split.split_attention_every(64);
    for (gpu, start) in [(gpu, 0), (&split, 70)] {
        let s = AttentionShape { t: 5, start, ..shape(4, 2, 16, 16, None) };
        let wo = &gpu.upload_matrix("wo", ty, 8, 64, &wo_bytes).unwrap();
        let layer = gpu.kv_layer(80, 32, 32, KvFormat::F16).unwrap();
        let k = gpu.upload("k", &(0..75 * 32).map(|_| rng.unit()).collect::<Vec<_>>()).unwrap();
        let v = gpu.upload("v", &(0..75 * 32).map(|_| rng.unit()).collect::<Vec<_>>()).unwrap();
        let q = gpu.upload("q", &(0..5 * 64).map(|_| rng.unit()).collect::<Vec<_>>()).unwrap();
        let (plain, laid) = (gpu.zeros("att", 5 * 64).unwrap(), gpu.zeros("att laid out", 5 * 64).unwrap());
        let (ya, yb) = (gpu.zeros("ya", 5 * 8).unwrap(), gpu.zeros("yb", 5 * 8).unwrap());
        let mut pass = gpu.pass();
        pass.kv_store(&layer, &k, &v, 0, start + 5, 0).unwrap();
        pass.attention(&s, &q, &layer, &plain).unwrap();
        pass.matmul(wo, &plain, 5, &ya).unwrap();
        pass.attention_laid_out(&s, &q, &layer, &laid, 32).unwrap();
        pass.inputs_laid_out(&laid, 5, 64, 32);
        let before = pass.kernels();
        pass.matmul(wo, &laid, 5, &yb).unwrap();
        assert_eq!(pass.kernels(), before + 1, "the product reads the attention's rows in place");
        pass.submit().unwrap();
        let (want, got) = (gpu.read(&ya).unwrap(), gpu.read(&yb).unwrap());
        assert!(want.iter().any(|&v| v != 0.0));
        assert_eq!(got, want, "the product over the attention's rows laid out");
    }
    let err = gpu.pass().matmul_gated_laid_out(&pair, Activation::Silu, &x, n, &yb, 48).err().unwrap();
    assert!(matches!(err, GpuError::Shape(_)), "64 rows are not whole blocks of 48: {err}");
}
