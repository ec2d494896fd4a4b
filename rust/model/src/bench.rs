//! Throughput measured the way llama-bench measures it, so ember's figures sit
//! beside llama.cpp's: `pp` reads a prompt of n tokens in passes of up to
//! `max_batch` (logits for the last position only); `tg` decodes n tokens one
//! at a time, no sampling. Both start from a context that already holds
//! `depth` tokens (llama-bench's `-d`), read before the clock starts.

use std::time::Instant;

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
    let mut s = model.new_session((depth.len() + extra).max(1), max_batch, kv);
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
