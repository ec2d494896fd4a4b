//! Throughput measured the way llama-bench measures it, so ember's figures sit
//! beside llama.cpp's: `pp` reads a prompt of n tokens in passes of up to
//! `max_batch` into an empty context (logits for the last position only);
//! `tg` decodes n tokens one at a time from an empty context, no sampling.

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

/// Prompt processing: `prompt` read into a fresh session.
pub fn prompt_processing(model: &Model, prompt: &[u32], max_batch: usize) -> Result<Throughput> {
    let mut s = model.new_session(prompt.len(), max_batch, KvType::F16);
    let t0 = Instant::now();
    model.prefill(&mut s, prompt, Logits::Last)?;
    Ok(Throughput { tokens: prompt.len(), seconds: t0.elapsed().as_secs_f64() })
}

/// Text generation: `n` single-token passes from an empty context, each token
/// the argmax of the last logits (the first is `first`).
pub fn text_generation(model: &Model, first: u32, n: usize) -> Result<Throughput> {
    let mut s = model.new_session(n.max(1), 1, KvType::F16);
    let mut token = first;
    let t0 = Instant::now();
    for _ in 0..n {
        let logits = model.forward(&mut s, &[token], Logits::Last)?;
        token = logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32;
    }
    Ok(Throughput { tokens: n, seconds: t0.elapsed().as_secs_f64() })
}
