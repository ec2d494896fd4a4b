//! Token-by-token generation over one session: prefill, then draw, decode and
//! feed back one token at a time, with text handed out only as whole UTF-8.
//!
//! Stop strings are the caller's: they need the text as the user sees it, and
//! the Python layer that owns the API manners decides what a stop means.

use std::sync::Arc;

use ember_sample::{Sampler, SamplingParams};
use ember_tokenizer::StreamDecoder;

use crate::error::{ModelError, Result};
use crate::forward::{Logits, Session};
use crate::Model;

#[derive(Clone, Debug)]
pub struct GenerateParams {
    pub max_tokens: usize,
    /// Keep going past end-of-generation tokens (they are masked out of the draw).
    pub ignore_eos: bool,
    /// Report the log-probabilities of the `n_probs` most likely tokens at each draw (0: none).
    pub n_probs: usize,
    pub sampling: SamplingParams,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model ended its turn (an end-of-generation token).
    EndOfGeneration,
    /// `max_tokens` reached.
    Length,
    /// The context is full.
    ContextFull,
}

#[derive(Clone, Debug)]
pub struct Step {
    pub token: u32,
    /// Text that became whole with this token (may be empty).
    pub text: String,
    /// Set on the last step.
    pub stop: Option<StopReason>,
    /// Log-probability of the drawn token under the model (before sampling
    /// transforms), when `n_probs` > 0.
    pub logprob: Option<f32>,
    /// The `n_probs` most likely tokens with their log-probabilities.
    pub top: Vec<(u32, f32)>,
}

/// A session with the tokens its cache holds, in order: what the next request
/// can reuse the prefix of.
pub struct Slot {
    pub session: Session,
    pub tokens: Vec<u32>,
}

impl Slot {
    pub fn new(session: Session) -> Slot {
        Slot { session, tokens: Vec::new() }
    }

    /// Cuts the cache back to the longest prefix it shares with `prompt` that
    /// it can resume from, leaving at least the prompt's last token to read
    /// (its logits start the generation). Returns the positions kept. A
    /// sliding-window ring that no longer holds what the cut point needs
    /// gives 0: the prompt is read again from the start.
    pub fn reuse_prefix(&mut self, prompt: &[u32]) -> usize {
        let common = self.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let want = common.min(prompt.len().saturating_sub(1));
        let kept = self.session.cache.truncate(want);
        self.tokens.truncate(kept);
        kept
    }
}

pub struct Generation {
    model: Arc<Model>,
    session: Session,
    /// The tokens whose keys and values the session holds.
    fed: Vec<u32>,
    n_cached: usize,
    sampler: Sampler,
    decoder: StreamDecoder,
    params: GenerateParams,
    logits: Vec<f32>,
    n_prompt: usize,
    n_generated: usize,
    done: bool,
}

impl Generation {
    /// Reads `prompt` into a fresh session and readies the first draw.
    pub fn new(model: Arc<Model>, mut session: Session, prompt: &[u32], params: GenerateParams) -> Result<Generation> {
        session.cache.clear();
        Generation::resume(model, Slot::new(session), prompt, params)
    }

    /// Reads `prompt` into the slot, reusing the prefix its cache shares with
    /// the prompt, and readies the first draw.
    pub fn resume(model: Arc<Model>, mut slot: Slot, prompt: &[u32], params: GenerateParams) -> Result<Generation> {
        if prompt.is_empty() {
            return Err(ModelError::Invalid("the prompt is empty".into()));
        }
        let sampler = Sampler::new(params.sampling.clone(), model.config.n_vocab)?;
        let n_cached = slot.reuse_prefix(prompt);
        let mut session = slot.session;
        let logits = model.prefill(&mut session, &prompt[n_cached..], Logits::Last)?;
        let decoder = model.tokenizer.stream_decoder();
        Ok(Generation {
            model,
            session,
            fed: prompt.to_vec(),
            n_cached,
            sampler,
            decoder,
            params,
            logits,
            n_prompt: prompt.len(),
            n_generated: 0,
            done: false,
        })
    }

    /// Prompt positions taken from the cache instead of read.
    pub fn n_cached(&self) -> usize {
        self.n_cached
    }

    pub fn n_prompt(&self) -> usize {
        self.n_prompt
    }
    pub fn n_generated(&self) -> usize {
        self.n_generated
    }

    /// Draws the next token; `None` once generation has stopped.
    pub fn next_step(&mut self) -> Result<Option<Step>> {
        if self.done {
            return Ok(None);
        }
        if self.params.max_tokens == 0 {
            self.done = true;
            return Ok(None);
        }
        let tok = &self.model.tokenizer;
        if self.params.ignore_eos {
            for &id in tok.eog_ids() {
                self.logits[id as usize] = f32::NEG_INFINITY;
            }
        }
        // Probabilities are the model's own softmax, before the samplers' transforms.
        let top = if self.params.n_probs > 0 { ember_sample::top_logprobs(&self.logits, self.params.n_probs) } else { Vec::new() };
        let token = self.sampler.sample(&self.logits);
        let logprob = (self.params.n_probs > 0).then(|| ember_sample::token_logprob(&self.logits, token));
        self.sampler.accept(token);
        self.n_generated += 1;
        let mut stop = None;
        let mut text;
        if tok.is_eog(token) && !self.params.ignore_eos {
            stop = Some(StopReason::EndOfGeneration);
            text = String::new();
        } else {
            text = self.decoder.push(tok, token);
            if self.n_generated >= self.params.max_tokens {
                stop = Some(StopReason::Length);
            } else if self.session.len() >= self.session.cache.n_ctx() {
                stop = Some(StopReason::ContextFull);
            }
        }
        if stop.is_some() {
            text.push_str(&self.decoder.flush());
            self.done = true;
        } else {
            let out = self.model.forward(&mut self.session, &[token], Logits::Last)?;
            self.fed.push(token);
            self.logits.clear();
            self.logits.extend_from_slice(out);
        }
        Ok(Some(Step { token, text, stop, logprob, top }))
    }

    /// Gives the session back (its cache holds prompt and output).
    pub fn into_session(self) -> Session {
        self.session
    }

    /// Gives the session back with the tokens its cache holds, for the next
    /// request to reuse.
    pub fn into_slot(self) -> Slot {
        Slot { session: self.session, tokens: self.fed }
    }
}
