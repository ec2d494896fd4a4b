//! Throughput measured the way llama-bench measures it, so ember's figures sit
//! beside llama.cpp's: `pp` reads a prompt of n tokens in passes of up to
//! `max_batch` (logits for the last position only); `tg` decodes n tokens one
//! at a time, no sampling. Both start from a context that already holds
//! `depth` tokens (llama-bench's `-d`), read before the clock starts.

use std::time::Instant;

use crate::config::{KvSource, LayerConfig};
use crate::error::Result;
use crate::forward::Logits;
use crate::{KvType, Model};

#[derive(Clone, Copy, Debug)]
pub struct Throughput {
    pub tokens: usize,
    pub seconds: f64,
}

impl Throughput {
    pub fn tokens_per_second(&self) -> f64 {
        self.tokens as f64 / self.seconds
    }
}

/// One test's context, kept from run to run as llama-bench keeps its
/// context: the held tokens read once, each run's tokens cut off again after
/// it, so that every run after the first meets cache rows already in
/// memory, as llama-bench's runs do.
pub struct Context {
    held: Vec<u32>,
    room: usize,
    max_batch: usize,
    kv: KvType,
    session: crate::forward::Session,
    runs: usize,
}

impl Context {
    /// The positions the context holds between runs.
    pub fn positions(&self) -> usize {
        self.session.cache.len()
    }

    /// The runs this context has served.
    pub fn runs(&self) -> usize {
        self.runs
    }

    /// The context `kept` if it holds `depth` with room for `extra` tokens
    /// more (in the same batch size and cache type), else a new one holding
    /// `depth`, kept there instead.
    fn for_test<'c>(kept: &'c mut Option<Context>, model: &Model, depth: &[u32], extra: usize, max_batch: usize,
                    kv: KvType) -> Result<&'c mut crate::forward::Session> {
        let fits = |c: &Context| {
            c.held == depth && c.room >= depth.len() + extra && c.max_batch == max_batch && c.kv == kv
        };
        if !kept.as_ref().is_some_and(fits) {
            *kept = None;
            let room = (depth.len() + extra).max(1);
            let mut session = model.try_new_session(room, max_batch, kv)?;
            if !depth.is_empty() {
                model.prefill(&mut session, depth, Logits::Last)?;
            }
            *kept = Some(Context { held: depth.to_vec(), room, max_batch, kv, session, runs: 0 });
        }
        Ok(&mut kept.as_mut().expect("kept above").session)
    }

    /// Seconds `run` takes in the test's context, the run's tokens cut off
    /// after it. Where the cache cannot give back only those (a recurrent
    /// state holds every position), or the run fails, the context is dropped
    /// and the next run reads the held tokens afresh.
    #[allow(clippy::too_many_arguments)]
    fn timed(kept: &mut Option<Context>, model: &Model, depth: &[u32], extra: usize, max_batch: usize, kv: KvType,
             run: impl FnOnce(&mut crate::forward::Session) -> Result<()>) -> Result<f64> {
        let s = Self::for_test(kept, model, depth, extra, max_batch, kv)?;
        let t0 = Instant::now();
        let ran = run(s);
        let seconds = t0.elapsed().as_secs_f64();
        let cut_back = match (&ran, kept.as_mut()) {
            (Ok(()), Some(c)) => {
                c.runs += 1;
                c.session.cache.truncate(depth.len()) == depth.len()
            }
            _ => false,
        };
        if !cut_back {
            *kept = None;
        }
        ran.map(|()| seconds)
    }
}

/// Prompt processing: `prompt` read after `depth` tokens, in the context
/// `kept` holds where it fits (see [`Context`]).
pub fn prompt_processing(model: &Model, kept: &mut Option<Context>, depth: &[u32], prompt: &[u32], max_batch: usize,
                         kv: KvType) -> Result<Throughput> {
    let read = |s: &mut crate::forward::Session| model.prefill(s, prompt, Logits::Last).map(|_| ());
    let seconds = Context::timed(kept, model, depth, prompt.len(), max_batch, kv, read)?;
    Ok(Throughput { tokens: prompt.len(), seconds })
}

/// Text generation: `n` single-token passes after `depth` tokens, each token
/// the argmax of the last logits (the first is `first`), in the context
/// `kept` holds where it fits.
pub fn text_generation(model: &Model, kept: &mut Option<Context>, depth: &[u32], first: u32, n: usize,
                       max_batch: usize, kv: KvType) -> Result<Throughput> {
    let decode = |s: &mut crate::forward::Session| {
        let mut token = first;
        for _ in 0..n {
            let logits = model.forward(s, &[token], Logits::Last)?;
            token = logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0
                as u32;
        }
        Ok(())
    };
    let seconds = Context::timed(kept, model, depth, n, max_batch, kv, decode)?;
    Ok(Throughput { tokens: n, seconds })
}

/// What decoding one token reads: the weights and the cache, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBytes {
    pub weights: u64,
    pub cache: u64,
}

/// Bytes a token decoded after `depth` held positions reads: every weight
/// once (the token table only where it is the output head too, a row
/// otherwise; a mixture's experts in the share a token uses), and the keys
/// and values each layer's query sees (a sliding window's at most) in the
/// cache type's bytes. At the memory's streaming rate these give the
/// fastest decode the machine allows.
pub fn token_bytes(model: &Model, depth: usize, kv: KvType) -> TokenBytes {
    let header = model.file().header();
    let tied = header.tensor("output.weight").is_none();
    let mut weights = 0u64;
    for t in &header.tensors {
        let per_token_rows = (t.name == "token_embd.weight" && !tied) || t.name.starts_with("per_layer_token_embd");
        if per_token_rows {
            continue;
        }
        weights += match &model.config.moe {
            Some(moe) if t.name.contains("_exps") && moe.n_expert > 0 => t.n_bytes * moe.n_used as u64 / moe.n_expert as u64,
            _ => t.n_bytes,
        };
    }
    let cache = model
        .config
        .layers
        .iter()
        .filter(|l| matches!(l.kv, KvSource::Own(_)))
        .map(|l| {
            let seen = l.window.map_or(depth + 1, |w| w.min(depth + 1));
            (seen * (kv.bytes(l.k_width()) + kv.bytes(l.v_width()))) as u64
        })
        .sum();
    TokenBytes { weights, cache }
}

/// Multiply-adds of the products a pass of `n` tokens after `depth` held
/// positions takes in attention: each query head of each attention layer
/// meets every position its row sees (a sliding window's at most) once in
/// its scores (a key's length) and once in its weighing of the values (a
/// value's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionWork {
    pub scores: u64,
    pub values: u64,
}

pub fn attention_work(model: &Model, depth: usize, n: usize) -> AttentionWork {
    attention_work_of(&model.config.layers, depth, n)
}

/// [`attention_work`] of these layers: a layer that reads another's keys
/// and values attends as its own do; a recurrent one takes no attention.
fn attention_work_of(layers: &[LayerConfig], depth: usize, n: usize) -> AttentionWork {
    let mut work = AttentionWork { scores: 0, values: 0 };
    for l in layers.iter().filter(|l| !matches!(l.kv, KvSource::Recurrent(_))) {
        // Row j sits at position depth + j and sees the positions up to it.
        let seen: u64 = (depth + 1..=depth + n).map(|p| l.window.map_or(p, |w| w.min(p)) as u64).sum();
        work.scores += seen * (l.n_head * l.head_dim_k) as u64;
        work.values += seen * (l.n_head * l.head_dim_v) as u64;
    }
    work
}

/// Multiply-adds of the weights' products in a pass of `n` tokens that asks
/// for the last one's logits: every element of a tensor of two or more
/// dimensions meets each token once (a mixture's experts in the share a
/// token uses), the output head the last token alone; a table read a row
/// per token (the token table where it is not the head too) takes none.
pub fn weight_work(model: &Model, n: usize) -> u64 {
    let header = model.file().header();
    let head = if header.tensor("output.weight").is_some() { "output.weight" } else { "token_embd.weight" };
    let experts = model.config.moe.as_ref().map(|m| (m.n_used, m.n_expert));
    weight_work_of(header.tensors.iter().map(|t| (t.name.as_str(), t.dims.as_slice())), head, experts, n)
}

/// [`weight_work`] of these tensors (name, dims), `head` the output head's
/// name and `experts` a mixture's (used, all).
fn weight_work_of<'t>(tensors: impl Iterator<Item = (&'t str, &'t [u64])>, head: &str,
                      experts: Option<(usize, usize)>, n: usize) -> u64 {
    let lookups = ["token_embd.weight", "per_layer_token_embd.weight"];
    let mut macs = 0u64;
    for (name, dims) in tensors.filter(|(_, dims)| dims.len() >= 2) {
        let elements: u64 = dims.iter().product();
        let per_token = match experts {
            Some((used, all)) if name.contains("_exps") && all > 0 => elements * used as u64 / all as u64,
            _ => elements,
        };
        macs += if name == head {
            elements * u64::from(n > 0)
        } else if lookups.contains(&name) {
            0
        } else {
            per_token * n as u64
        };
    }
    macs
}

/// Multiply-adds a second the model's threads issue at best in the
/// instruction a prompt's attention meets a `kv` cache with at the kernel
/// level ember runs at: AVX-512 BF16's paired product for a bf16 cache
/// where the level has it, the widest fused multiply-add of floats
/// otherwise (f16 and f32 caches; bf16 below that level). `None` for a
/// Q8_0 cache, whose scores are byte dots and whose values are floats.
pub fn product_rate(model: &Model, kv: KvType) -> Option<f64> {
    // (kernel, rounds): a few milliseconds of each at full rate.
    let (kernel, rounds): (unsafe fn(u64) -> u64, u64) = match (kv, ember_quant::level()) {
        (KvType::Q8_0, _) => return None,
        #[cfg(target_arch = "x86_64")]
        (KvType::BF16, ember_quant::SimdLevel::Avx512Bf16) => (x86::paired_bf16_products, 1 << 22),
        #[cfg(target_arch = "x86_64")]
        (_, ember_quant::SimdLevel::Avx512Vnni | ember_quant::SimdLevel::Avx512Bf16) => {
            (x86::float_products_avx512, 1 << 22)
        }
        #[cfg(target_arch = "x86_64")]
        (_, ember_quant::SimdLevel::Avx2) => (x86::float_products_avx2, 1 << 22),
        _ => (float_products_scalar, 1 << 18),
    };
    Some(peak_rate(model, kernel, rounds))
}

/// Multiply-adds a second the model's threads issue at best in the
/// instruction the kernel level's weight products take their 8-bit
/// activations with: AVX-512 VNNI's `dpbusd` (64 an instruction), AVX2's
/// `maddubs` (32, its widening adds not counted), a scalar fused
/// multiply-add below them. Weights held as floats take slower ones, so
/// time at this rate is the least a pass's weights can take.
pub fn byte_product_rate(model: &Model) -> f64 {
    let (kernel, rounds): (unsafe fn(u64) -> u64, u64) = match ember_quant::level() {
        #[cfg(target_arch = "x86_64")]
        ember_quant::SimdLevel::Avx512Vnni | ember_quant::SimdLevel::Avx512Bf16 => (x86::byte_products_avx512, 1 << 22),
        #[cfg(target_arch = "x86_64")]
        ember_quant::SimdLevel::Avx2 => (x86::byte_products_avx2, 1 << 22),
        _ => (float_products_scalar, 1 << 18),
    };
    peak_rate(model, kernel, rounds)
}

/// The multiply-adds a second of `kernel` run once on every thread at the
/// same time (as a pass's products run), the best of a few runs. Each
/// kernel keeps independent chains in registers and reads no memory: no
/// kernel of its instruction can issue more.
fn peak_rate(model: &Model, kernel: unsafe fn(u64) -> u64, rounds: u64) -> f64 {
    let mut best = 0.0f64;
    for _ in 0..4 {
        let t0 = Instant::now();
        let done = std::sync::atomic::AtomicU64::new(0);
        model.pool.run(|_| {
            // SAFETY: the kernel is the level's, and ember runs at a level only where the CPU has it.
            let macs = unsafe { kernel(rounds) };
            done.fetch_add(std::hint::black_box(macs), std::sync::atomic::Ordering::Relaxed);
        });
        best = best.max(done.into_inner() as f64 / t0.elapsed().as_secs_f64());
    }
    best
}

/// Twelve independent chains of scalar fused multiply-adds, `rounds` times
/// each: the multiply-adds done. (Unsafe only to share the vector forms' type.)
unsafe fn float_products_scalar(rounds: u64) -> u64 {
    let mut acc = [0.0f32; 12];
    let mut x = std::hint::black_box(0.5f32);
    for _ in 0..rounds {
        for a in acc.iter_mut() {
            *a = a.mul_add(x, x);
        }
        x = std::hint::black_box(x);
    }
    std::hint::black_box(acc);
    12 * rounds
}

/// The wrapping sum of `words`, read with the widest loads the CPU has: the
/// decode's kernels read weights 32 or 64 bytes at a time, and from a
/// last-level cache a loop of narrower loads is bound by its loads, not by
/// the cache (two threads re-reading 240 MB: 20-21 GB/s with 16-byte loads,
/// 31-32 with 64-byte ones, on a Xeon whose 480 MB cache holds it), so it
/// would set the limit below what decode reaches.
fn sum_words(words: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F.
            return unsafe { x86::sum_words_avx512(words) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { x86::sum_words_avx2(words) };
        }
    }
    sum_words_scalar(words)
}

/// [`sum_words`] without SIMD: eight independent sums, so the adds keep up
/// with the loads.
fn sum_words_scalar(words: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    let chunks = words.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (l, &w) in lanes.iter_mut().zip(c) {
            *l = l.wrapping_add(w);
        }
    }
    lanes.iter().chain(rest).fold(0u64, |a, &l| a.wrapping_add(l))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Twelve independent chains of one instruction, `$step(acc, x)`, run
    /// `rounds` times from `$acc(i)` and the operand `$x`: the multiply-adds
    /// done, `$macs` an instruction. The operand passes through an empty
    /// `asm` each round, so the compiler can neither fold the chains nor
    /// hoist them.
    macro_rules! chains {
        ($rounds:expr, $acc:expr, $x:expr, $reg:ident, $macs:expr, $step:expr) => {{
            let mut acc: [_; 12] = std::array::from_fn($acc);
            let mut x = $x;
            for _ in 0..$rounds {
                for a in acc.iter_mut() {
                    *a = $step(*a, x);
                }
                std::arch::asm!("/* {0} */", inout($reg) x, options(pure, nomem, nostack));
            }
            std::hint::black_box(acc);
            12 * $macs * $rounds
        }};
    }

    /// `vfmadd` on sixteen floats, the attention loops' form at the AVX-512 levels.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn float_products_avx512(rounds: u64) -> u64 {
        chains!(rounds, |i| _mm512_set1_ps(i as f32), _mm512_set1_ps(0.5), zmm_reg, 16,
                |a, x| _mm512_fmadd_ps(a, x, x))
    }

    /// `vdpbf16ps`: thirty-two multiply-adds an instruction.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn paired_bf16_products(rounds: u64) -> u64 {
        chains!(rounds, |i| _mm512_set1_ps(i as f32), _mm512_set1_epi32(0x3f00_3f00), zmm_reg, 32, |a, x| {
            let pairs = std::mem::transmute::<__m512i, __m512bh>(x);
            _mm512_dpbf16_ps(a, pairs, pairs)
        })
    }

    /// `vfmadd` on eight floats, AVX2's form.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn float_products_avx2(rounds: u64) -> u64 {
        chains!(rounds, |i| _mm256_set1_ps(i as f32), _mm256_set1_ps(0.5), ymm_reg, 8,
                |a, x| _mm256_fmadd_ps(a, x, x))
    }

    /// `vpdpbusd` on 64 byte pairs, the weight products' form at the AVX-512 VNNI levels.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(super) unsafe fn byte_products_avx512(rounds: u64) -> u64 {
        chains!(rounds, |i| _mm512_set1_epi32(i as i32), _mm512_set1_epi8(1), zmm_reg, 64,
                |a, x| _mm512_dpbusd_epi32(a, x, x))
    }

    /// `vpmaddubsw` on 32 byte pairs, AVX2's form: each product is the next
    /// one's bytes, as it has no sum to chain through.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn byte_products_avx2(rounds: u64) -> u64 {
        chains!(rounds, |i| _mm256_set1_epi8(i as i8), _mm256_set1_epi8(1), ymm_reg, 32,
                |a, x| _mm256_maddubs_epi16(a, x))
    }

    /// Four registers of sums, so the adds keep up with the loads.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn sum_words_avx512(words: &[u64]) -> u64 {
        let p = words.as_ptr();
        let mut acc = [_mm512_setzero_si512(); 4];
        let mut i = 0;
        while i + 32 <= words.len() {
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm512_add_epi64(*a, _mm512_loadu_si512(p.add(i + 8 * r).cast()));
            }
            i += 32;
        }
        let sum = _mm512_add_epi64(_mm512_add_epi64(acc[0], acc[1]), _mm512_add_epi64(acc[2], acc[3]));
        words[i..].iter().fold(_mm512_reduce_add_epi64(sum) as u64, |a, &w| a.wrapping_add(w))
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn sum_words_avx2(words: &[u64]) -> u64 {
        let p = words.as_ptr();
        let mut acc = [_mm256_setzero_si256(); 4];
        let mut i = 0;
        while i + 16 <= words.len() {
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm256_add_epi64(*a, _mm256_loadu_si256(p.add(i + 4 * r).cast()));
            }
            i += 16;
        }
        let sum = _mm256_add_epi64(_mm256_add_epi64(acc[0], acc[1]), _mm256_add_epi64(acc[2], acc[3]));
        let mut lanes = [0u64; 4];
        _mm256_storeu_si256(lanes.as_mut_ptr().cast(), sum);
        lanes.iter().chain(&words[i..]).fold(0u64, |a, &l| a.wrapping_add(l))
    }
}

/// Bytes a second the model's threads re-read a buffer of `bytes` (what a
/// token reads, [`token_bytes`]) at best: each thread sums its share, the
/// best of several sweeps after one that brings it in (as weights are
/// streamed: sequentially, every thread at once, the same bytes token after
/// token). Where the bytes exceed the caches this is the memory's streaming
/// rate; where they fit the last level (a CPU with hundreds of MB of L3),
/// that cache's, and decode can outrun the memory.
pub fn stream_rate(model: &Model, bytes: u64) -> f64 {
    // No cache holds a gigabyte: past it, a larger model's buffer would only
    // take memory beside the model to measure the same rate.
    let bytes = bytes.clamp(1 << 20, 1 << 30);
    let words = vec![1u64; (bytes / 8) as usize];
    let threads = model.pool.threads().max(1);
    let share = words.len().div_ceil(threads);
    // At least 2 GB read in all, so a buffer that fits a cache is timed over
    // many sweeps rather than a few microseconds.
    let sweeps = (2u64 << 30).div_ceil(bytes).clamp(4, 2048);
    let mut best = 0.0f64;
    for sweep in 0..=sweeps {
        let t0 = Instant::now();
        model.pool.for_each(threads, |i| {
            let part = &words[(i * share).min(words.len())..((i + 1) * share).min(words.len())];
            std::hint::black_box(sum_words(part));
        });
        if sweep > 0 {
            best = best.max((words.len() * 8) as f64 / t0.elapsed().as_secs_f64());
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prompt's attention products counted by hand: rows 6-9 of a pass of
    /// four after five held positions see 6, 7, 8 and 9 positions in a
    /// global layer, 6, 7, 7 and 7 in a window of 7 (rows on both sides of
    /// its edge); a layer reading another's cache attends as its own do, a
    /// recurrent one takes none.
    #[test]
    fn attention_work_counts_the_positions_each_row_sees() {
        use crate::config::FfnShape;
        let layer = |window, kv| LayerConfig {
            n_head: 4, n_head_kv: 2, head_dim_k: 16, head_dim_v: 8, window, rope: 0, kv,
            ffn: FfnShape::Dense { n_ff: 8 }, attn_scale: 1.0, attn_gate: false, delta: None,
        };
        let layers = [layer(None, KvSource::Own(0)), layer(Some(7), KvSource::Own(1)), layer(None, KvSource::Shared(0)),
                      layer(None, KvSource::Recurrent(0))];
        let seen = 30 + 27 + 30;
        assert_eq!(attention_work_of(&layers, 5, 4), AttentionWork { scores: seen * 4 * 16, values: seen * 4 * 8 });
        assert_eq!(attention_work_of(&layers, 0, 0), AttentionWork { scores: 0, values: 0 });
    }

    /// A pass's weight products counted by hand: a block's matrices meet
    /// every token, the experts two of eight, the head (tied to the token
    /// table, or its own) the last token alone, a norm and a lookup table none.
    #[test]
    fn weight_work_counts_each_weight_once_a_token() {
        let tensors: [(&str, &[u64]); 6] = [
            ("token_embd.weight", &[16, 100]),
            ("blk.0.attn_norm.weight", &[16]),
            ("blk.0.attn_q.weight", &[16, 32]),
            ("blk.0.ffn_up_exps.weight", &[16, 24, 8]),
            ("per_layer_token_embd.weight", &[64, 100]),
            ("output.weight", &[16, 100]),
        ];
        let work = |head, experts, n| weight_work_of(tensors.iter().copied(), head, experts, n);
        assert_eq!(work("output.weight", Some((2, 8)), 5), 5 * (16 * 32 + 16 * 24 * 2) + 16 * 100);
        // Tied: the token table is the head, and a dense reading takes every expert.
        assert_eq!(work("token_embd.weight", None, 5), 5 * (16 * 32 + 16 * 24 * 8 + 16 * 100) + 16 * 100);
        assert_eq!(work("output.weight", None, 0), 0);
    }

    /// Every form of the probe's sum reads every word once, the tail past
    /// its last whole step included: a form that skipped words would time
    /// fewer bytes than it counts.
    #[test]
    fn every_form_of_the_probe_sums_every_word() {
        for len in [0usize, 7, 8, 31, 32, 33, 1000, 4099] {
            let words: Vec<u64> = (0..len as u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
            let want = words.iter().fold(0u64, |a, &w| a.wrapping_add(w));
            assert_eq!(sum_words_scalar(&words), want, "scalar, {len} words");
            assert_eq!(sum_words(&words), want, "{len} words");
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx2") {
                    assert_eq!(unsafe { x86::sum_words_avx2(&words) }, want, "AVX2, {len} words");
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    assert_eq!(unsafe { x86::sum_words_avx512(&words) }, want, "AVX-512, {len} words");
                }
            }
        }
    }
}
