//! Throughput measured the way llama-bench measures it, so ember's figures sit
//! beside llama.cpp's: `pp` reads a prompt of n tokens in passes of up to
//! `max_batch` (logits for the last position only); `tg` decodes n tokens one
//! at a time, no sampling. Both start from a context that already holds
//! `depth` tokens (llama-bench's `-d`), read before the clock starts.

use std::time::Instant;

use crate::config::KvSource;
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

/// A session of room for `extra` tokens after `depth`, holding `depth` already.
fn session_at(model: &Model, depth: &[u32], extra: usize, max_batch: usize, kv: KvType) -> Result<crate::forward::Session> {
    let mut s = model.try_new_session((depth.len() + extra).max(1), max_batch, kv)?;
    if !depth.is_empty() {
        model.prefill(&mut s, depth, Logits::Last)?;
    }
    Ok(s)
}

/// Prompt processing: `prompt` read after `depth` tokens.
pub fn prompt_processing(model: &Model, depth: &[u32], prompt: &[u32], max_batch: usize, kv: KvType) -> Result<Throughput> {
    let mut s = session_at(model, depth, prompt.len(), max_batch, kv)?;
    let t0 = Instant::now();
    model.prefill(&mut s, prompt, Logits::Last)?;
    Ok(Throughput { tokens: prompt.len(), seconds: t0.elapsed().as_secs_f64() })
}

/// Text generation: `n` single-token passes after `depth` tokens, each token
/// the argmax of the last logits (the first is `first`).
pub fn text_generation(model: &Model, depth: &[u32], first: u32, n: usize, max_batch: usize, kv: KvType) -> Result<Throughput> {
    let mut s = session_at(model, depth, n, max_batch, kv)?;
    let mut token = first;
    let t0 = Instant::now();
    for _ in 0..n {
        let logits = model.forward(&mut s, &[token], Logits::Last)?;
        token = logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32;
    }
    Ok(Throughput { tokens: n, seconds: t0.elapsed().as_secs_f64() })
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
            // Eight independent sums, so the adds keep up with the loads.
            let mut lanes = [0u64; 8];
            for c in part.chunks_exact(8) {
                for (l, &w) in lanes.iter_mut().zip(c) {
                    *l = l.wrapping_add(w);
                }
            }
            std::hint::black_box(lanes);
        });
        if sweep > 0 {
            best = best.max((words.len() * 8) as f64 / t0.elapsed().as_secs_f64());
        }
    }
    best
}
