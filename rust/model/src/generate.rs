//! Token-by-token generation over one session: prefill, then draw, decode and
//! feed back one token at a time, with text handed out only as whole UTF-8.
//!
//! Stop strings are the caller's: they need the text as the user sees it, and
//! the Python layer that owns the API manners decides what a stop means.

use std::collections::VecDeque;
use std::sync::Arc;

use ember_grammar::{Automaton, Matcher};
use ember_sample::{InfillVocab, Sampler, SamplingParams, Stage};
use ember_tokenizer::{StreamDecoder, Tokenizer};

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
    /// Report them from the distribution the token was drawn from, after the
    /// samplers (llama-server's `post_sampling_probs`), not the model's own.
    pub post_sampling_probs: bool,
    pub sampling: SamplingParams,
    /// Holds the output to a grammar: refused tokens are masked before the
    /// draw, and the turn ends only where the document may end.
    pub grammar: Option<Arc<Automaton>>,
    /// Holds the grammar back until the output writes this text (a tool
    /// call's opener), from which the grammar's document starts: the text
    /// before it is free, the call after it always whole.
    pub grammar_trigger: Option<Vec<u8>>,
    /// Ends a thought the model is taking too long over.
    pub thought_budget: Option<ThoughtBudget>,
}

/// llama-server's `reasoning_budget`: after `budget` generated tokens of
/// thought, the close is forced (`close_ids`, the closer with the newlines
/// the template writes around it). A thought starts where the prompt left
/// one open (`in_thought`) or where the output writes `opener`; it ends when
/// the output writes `closer`.
#[derive(Clone, Debug)]
pub struct ThoughtBudget {
    pub budget: usize,
    pub opener: Vec<u8>,
    pub closer: Vec<u8>,
    pub close_ids: Vec<u32>,
    pub in_thought: bool,
}

/// Where a generation stands against its thought budget.
struct ThoughtWatch {
    cfg: ThoughtBudget,
    in_thought: bool,
    /// The budget no longer applies: the thought closed, or was closed.
    spent: bool,
    /// Tokens generated inside the thought.
    count: usize,
    /// The latest output bytes, enough to see a marker split across tokens.
    tail: Vec<u8>,
}

impl ThoughtWatch {
    fn new(cfg: ThoughtBudget) -> ThoughtWatch {
        ThoughtWatch { in_thought: cfg.in_thought, cfg, spent: false, count: 0, tail: Vec::new() }
    }

    fn saw(&mut self, piece: &[u8]) {
        if self.spent {
            return;
        }
        self.tail.extend_from_slice(piece);
        let contains = |hay: &[u8], needle: &[u8]| !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle);
        if !self.in_thought {
            if contains(&self.tail, &self.cfg.opener) {
                // Counting starts after the token that completes the opener.
                self.in_thought = true;
                self.tail.clear();
            }
        } else if contains(&self.tail, &self.cfg.closer) {
            self.spent = true;
        } else {
            self.count += 1;
        }
        let keep = self.cfg.opener.len().max(self.cfg.closer.len());
        if self.tail.len() > keep {
            self.tail.drain(..self.tail.len() - keep);
        }
    }

    /// Makes the close due now, where a thought is under way (or may still
    /// open); false once it is over.
    fn end_now(&mut self) -> bool {
        self.cfg.budget = 0;
        !self.spent
    }

    /// The close to force now, once.
    fn due(&mut self) -> Option<Vec<u32>> {
        if self.spent || !self.in_thought || self.count < self.cfg.budget {
            return None;
        }
        self.spent = true;
        Some(self.cfg.close_ids.clone())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model ended its turn (an end-of-generation token), or the
    /// grammar's document is complete and nothing may follow it.
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

/// Longest run of grammar-forced tokens fed in one pass.
pub const MAX_FORCED_RUN: usize = 64;

/// The vocabulary as the infill sampler reads it.
struct Insertion<'a>(&'a Tokenizer);

impl InfillVocab for Insertion<'_> {
    fn is_eog(&self, id: u32) -> bool {
        self.0.is_eog(id)
    }
    fn piece(&self, id: u32) -> &[u8] {
        self.0.token_to_piece(id, false)
    }
    fn end_of_insertion(&self) -> Option<u32> {
        self.0.eot().or(self.0.eos())
    }
}

/// The drawing half of a generation, shared by [`Generation`] (one session,
/// its own passes) and the batcher (many sessions, shared passes): given the
/// logits after the last fed token, draw the next one and say whether to stop.
pub(crate) struct Draws {
    sampler: Sampler,
    decoder: StreamDecoder,
    matcher: Option<Matcher>,
    /// A grammar waiting for its trigger, and the latest output bytes.
    lazy: Option<(Arc<Automaton>, Vec<u8>, Vec<u8>)>,
    thought: Option<ThoughtWatch>,
    params: GenerateParams,
    pub(crate) n_generated: usize,
    pub(crate) done: bool,
}

impl Draws {
    /// The draws after `prompt`, whose last tokens the penalties count as
    /// llama-server's do.
    pub(crate) fn new(model: &Model, params: GenerateParams, prompt: &[u32]) -> Result<Draws> {
        let infill = params.sampling.chain.as_ref().is_some_and(|c| c.contains(&Stage::Infill));
        if infill && Insertion(&model.tokenizer).end_of_insertion().is_none() {
            return Err(ModelError::Invalid(
                "samplers: the infill sampler ends an insertion on the end-of-turn or end-of-sequence token, \
                 and this vocabulary has neither".into(),
            ));
        }
        let mut sampler = Sampler::new(params.sampling.clone(), model.config.n_vocab)?;
        sampler.accept_history(prompt);
        let decoder = model.tokenizer.stream_decoder();
        let (matcher, lazy) = match (&params.grammar, &params.grammar_trigger) {
            (Some(g), Some(trigger)) if !trigger.is_empty() => (None, Some((g.clone(), trigger.clone(), Vec::new()))),
            (g, _) => (g.clone().map(Matcher::new), None),
        };
        if params.grammar.is_some() {
            // Index the vocabulary now rather than inside the first step.
            model.token_index();
        }
        let thought = params.thought_budget.clone().map(ThoughtWatch::new);
        Ok(Draws { sampler, decoder, matcher, lazy, thought, params, n_generated: 0, done: false })
    }

    /// Ends the thought under way at the next draw (its close written after
    /// that token), as a spent budget would; false where the generation has
    /// no thought budget armed, or its thought is over.
    pub fn end_thought(&mut self) -> bool {
        self.thought.as_mut().is_some_and(ThoughtWatch::end_now)
    }

    /// Starts a lazy grammar once the output holds its trigger: the grammar
    /// reads from the trigger on. Output the grammar refuses after the
    /// trigger (in the same token) leaves the generation unconstrained.
    fn watch_trigger(&mut self, piece: &[u8]) -> Result<()> {
        let Some((g, trigger, tail)) = &mut self.lazy else { return Ok(()) };
        tail.extend_from_slice(piece);
        if let Some(at) = tail.windows(trigger.len()).position(|w| w == trigger.as_slice()) {
            let mut m = Matcher::new(g.clone());
            if m.advance(&tail[at..])? {
                self.matcher = Some(m);
            }
            self.lazy = None;
        } else if tail.len() >= trigger.len() {
            tail.drain(..tail.len() + 1 - trigger.len());
        }
        Ok(())
    }

    /// Masks what the grammar refuses. The end of the turn stays drawable
    /// only where the document may end; `ignore_eos` has already masked it.
    fn constrain(&self, model: &Model, logits: &mut [f32]) -> Result<()> {
        let Some(m) = &self.matcher else { return Ok(()) };
        let tok = &model.tokenizer;
        let keep_eog = m.is_accepting() && !self.params.ignore_eos;
        let eog: Vec<f32> = if keep_eog { tok.eog_ids().iter().map(|&id| logits[id as usize]).collect() } else { Vec::new() };
        let mask = m.mask(model.token_index())?;
        mask.apply(logits);
        for (&id, &l) in tok.eog_ids().iter().zip(&eog) {
            logits[id as usize] = l;
        }
        if mask.count() == 0 && !keep_eog {
            return Err(ModelError::Invalid(
                "the grammar cannot go on: no token of the vocabulary continues the document".into(),
            ));
        }
        Ok(())
    }

    /// How many of the next row's largest logits decide this draw
    /// ([`Sampler::decided_by_top`]), the end-of-generation tokens it masks
    /// counted in; `None` where the whole row is read: a grammar may allow
    /// any token, and log-probabilities are the whole distribution's.
    pub(crate) fn top_needed(&self, model: &Model) -> Option<usize> {
        if self.matcher.is_some() || self.params.n_probs > 0 {
            return None;
        }
        let k = self.sampler.decided_by_top()?;
        let masked = if self.params.ignore_eos { model.tokenizer.eog_ids().len() } else { 0 };
        Some(k + masked)
    }

    /// The next step from `logits` (which the draw may mask); `None` once
    /// stopped. `ctx_full`: the session has no room to feed the token back.
    pub(crate) fn draw(&mut self, model: &Model, logits: &mut [f32], ctx_full: bool) -> Result<Option<Step>> {
        if self.done {
            return Ok(None);
        }
        if self.params.max_tokens == 0 {
            self.done = true;
            return Ok(None);
        }
        let tok = &model.tokenizer;
        if self.params.ignore_eos {
            for &id in tok.eog_ids() {
                logits[id as usize] = f32::NEG_INFINITY;
            }
        }
        // Probabilities are the model's own softmax, before the samplers' transforms.
        let top = if self.params.n_probs > 0 { ember_sample::top_logprobs(logits, self.params.n_probs) } else { Vec::new() };
        let logprob_of = |logits: &[f32], token| (self.params.n_probs > 0).then(|| ember_sample::token_logprob(logits, token));
        let (token, mut logprob) = if self.matcher.is_some() {
            // The reported probability stays the model's, so it is read before masking.
            let raw: Option<Vec<f32>> = (self.params.n_probs > 0).then(|| logits.to_vec());
            self.constrain(model, logits)?;
            let token = self.sampler.sample_with_vocab(logits, &Insertion(tok));
            (token, raw.and_then(|r| logprob_of(&r, token)))
        } else {
            let token = self.sampler.sample_with_vocab(logits, &Insertion(tok));
            (token, logprob_of(logits, token))
        };
        let mut top = top;
        if self.params.n_probs > 0 && self.params.post_sampling_probs {
            // As log-probabilities, as the model's are carried: ln 1 = 0 for a greedy draw.
            let (own, kept) = self.sampler.drawn_probs(token, self.params.n_probs);
            logprob = Some(own.ln());
            top = kept.into_iter().map(|(t, p)| (t, p.ln())).collect();
        }
        self.sampler.accept(token);
        self.n_generated += 1;
        let mut stop = None;
        let mut text;
        if tok.is_eog(token) && !self.params.ignore_eos {
            stop = Some(StopReason::EndOfGeneration);
            text = String::new();
        } else {
            if let Some(m) = &mut self.matcher {
                if !m.advance(tok.token_to_piece(token, false))? {
                    return Err(ModelError::Invalid(format!("token {token} was drawn against the grammar")));
                }
            } else {
                self.watch_trigger(tok.token_to_piece(token, false))?;
            }
            text = self.decoder.push(tok, token);
            if let Some(t) = &mut self.thought {
                t.saw(tok.token_to_piece(token, false));
            }
            if self.matcher.as_ref().is_some_and(|m| m.is_final()) {
                // The document is whole and nothing may follow: end the turn
                // here rather than spend a pass drawing its end.
                stop = Some(StopReason::EndOfGeneration);
            } else if self.n_generated >= self.params.max_tokens {
                stop = Some(StopReason::Length);
            } else if ctx_full {
                stop = Some(StopReason::ContextFull);
            }
        }
        if stop.is_some() {
            text.push_str(&self.decoder.flush());
            self.done = true;
        }
        Ok(Some(Step { token, text, stop, logprob, top }))
    }

    /// The tokens the grammar forces next, from its forced bytes tokenized as
    /// text; the last token is dropped unless the document ends there (it
    /// might have merged with what follows).
    fn grammar_forced(&self, model: &Model) -> Result<Vec<u32>> {
        let Some(m) = &self.matcher else { return Ok(Vec::new()) };
        let forced = m.forced_bytes(4 * MAX_FORCED_RUN)?;
        let text = match std::str::from_utf8(&forced) {
            Ok(t) => t,
            Err(e) => std::str::from_utf8(&forced[..e.valid_up_to()]).expect("valid prefix"),
        };
        if text.is_empty() {
            return Ok(Vec::new());
        }
        let tok = &model.tokenizer;
        let mut ids = tok.tokenize(text, false, false);
        let mut probe = m.clone();
        let ends = probe.advance(text.as_bytes())? && probe.is_final();
        if !ends {
            ids.pop();
        }
        // Keep only a run whose bytes are exactly a prefix of the forced text
        // (a tokenizer that adds a space prefix would not be).
        let mut at = 0;
        let mut keep = 0;
        for &id in &ids {
            let piece = tok.token_to_piece(id, false);
            if piece.is_empty() || !text.as_bytes()[at..].starts_with(piece) {
                break;
            }
            at += piece.len();
            keep += 1;
        }
        ids.truncate(keep);
        Ok(ids)
    }

    /// The tokens the grammar forces after the last draw, as steps drawn
    /// without sampling, at most `room` of them (the caller feeds the drawn
    /// token and these in one pass). The forced bytes are tokenized as text
    /// and the last token dropped unless the document ends there: it might
    /// have merged with what follows.
    pub(crate) fn forced_steps(&mut self, model: &Model, room: usize) -> Result<Vec<Step>> {
        let room = room.min(MAX_FORCED_RUN).min(self.params.max_tokens.saturating_sub(self.n_generated));
        if self.done || room == 0 {
            return Ok(Vec::new());
        }
        let mut ids = match self.thought.as_mut().and_then(ThoughtWatch::due) {
            Some(close) => close,
            None => self.grammar_forced(model)?,
        };
        ids.truncate(room);
        let tok = &model.tokenizer;
        let mut steps = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(m) = self.matcher.as_mut() {
                if !m.advance(tok.token_to_piece(id, false))? {
                    break;
                }
            } else {
                self.watch_trigger(tok.token_to_piece(id, false))?;
            }
            if let Some(t) = &mut self.thought {
                t.saw(tok.token_to_piece(id, false));
            }
            self.sampler.accept(id);
            self.n_generated += 1;
            let mut text = self.decoder.push(tok, id);
            let stop = if self.matcher.as_ref().is_some_and(|m| m.is_final()) {
                Some(StopReason::EndOfGeneration)
            } else if self.n_generated >= self.params.max_tokens {
                Some(StopReason::Length)
            } else {
                None
            };
            if stop.is_some() {
                text.push_str(&self.decoder.flush());
                self.done = true;
            }
            steps.push(Step { token: id, text, stop, logprob: None, top: Vec::new() });
            if stop.is_some() {
                break;
            }
        }
        Ok(steps)
    }
}

pub struct Generation {
    model: Arc<Model>,
    session: Session,
    /// The tokens whose keys and values the session holds.
    fed: Vec<u32>,
    n_cached: usize,
    draws: Draws,
    logits: Vec<f32>,
    n_prompt: usize,
    /// Grammar-forced steps already fed, handed out one per call.
    ready: VecDeque<Step>,
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
        let draws = Draws::new(&model, params, prompt)?;
        let n_cached = slot.reuse_prefix(prompt);
        let mut session = slot.session;
        let logits = model.prefill(&mut session, &prompt[n_cached..], Logits::Last)?;
        Ok(Generation { model, session, fed: prompt.to_vec(), n_cached, draws, logits, n_prompt: prompt.len(), ready: VecDeque::new() })
    }

    /// Prompt positions taken from the cache instead of read.
    pub fn n_cached(&self) -> usize {
        self.n_cached
    }

    pub fn n_prompt(&self) -> usize {
        self.n_prompt
    }
    pub fn n_generated(&self) -> usize {
        self.draws.n_generated
    }

    /// Draws the next token; `None` once generation has stopped.
    pub fn next_step(&mut self) -> Result<Option<Step>> {
        if let Some(step) = self.ready.pop_front() {
            return Ok(Some(step));
        }
        let n_ctx = self.session.cache.n_ctx();
        let ctx_full = self.session.len() >= n_ctx;
        let Some(step) = self.draws.draw(&self.model, &mut self.logits, ctx_full)? else { return Ok(None) };
        if step.stop.is_none() {
            let room = n_ctx.saturating_sub(self.session.len() + 1);
            let forced = self.draws.forced_steps(&self.model, room)?;
            // A run that ends the generation needs no pass: nothing is drawn after it.
            if forced.last().is_none_or(|s| s.stop.is_none()) {
                let mut feed = vec![step.token];
                feed.extend(forced.iter().map(|s| s.token));
                let out = self.model.forward(&mut self.session, &feed, Logits::Last)?;
                self.fed.extend_from_slice(&feed);
                self.logits.clear();
                self.logits.extend_from_slice(out);
            }
            self.ready.extend(forced);
        }
        Ok(Some(step))
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
