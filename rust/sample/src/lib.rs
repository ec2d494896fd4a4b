//! Token sampling as llama.cpp's common sampling chain applies it: logit bias,
//! penalties, top-k, typical-p, top-p, min-p, temperature, then a seeded draw;
//! or the stages a request names, in its order (with llama.cpp's infill stage).
//! Also owns the log-probabilities reported alongside sampled tokens.
//!
//! ```
//! use ember_sample::{Sampler, SamplingParams};
//!
//! let params = SamplingParams { seed: Some(7), ..Default::default() };
//! let mut sampler = Sampler::new(params, 4).unwrap();
//! let token = sampler.sample(&[0.1, 2.5, -1.0, 0.3]);
//! sampler.accept(token);
//! ```

mod params;
mod rng;
mod stages;

use std::collections::VecDeque;

pub use params::{SampleError, SamplingParams, Stage, MAX_INFILL_CANDIDATES};

use rng::Rng;
use stages::{Adjust, Candidates};

/// Above this the penalty window is grown on demand rather than reserved up
/// front, so a huge or unbounded `repeat_last_n` cannot reserve gigabytes.
const MAX_RESERVED_WINDOW: usize = 1 << 16;

/// What the infill stage reads of the vocabulary.
pub trait InfillVocab {
    fn is_eog(&self, id: u32) -> bool;
    /// The token's text, control tokens empty (llama.cpp's `token_to_piece`
    /// without special tokens).
    fn piece(&self, id: u32) -> &[u8];
    /// The token an insertion with nothing more to write ends on: the end
    /// of turn, else the end of sequence.
    fn end_of_insertion(&self) -> Option<u32>;
}

/// One generation's sampling state: the parameters, the penalty window and
/// the random stream. Build one per sequence; `reset` reuses it.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    n_vocab: usize,
    cands: Candidates,
    penalties_on: bool,
    /// `logit_bias` as a dense per-token row (duplicates summed); empty when
    /// there is none.
    bias: Vec<f32>,
    /// The penalty window's length; `None` for the whole sequence.
    window_len: Option<usize>,
    /// The last `window_len` accepted tokens, oldest first.
    window: VecDeque<u32>,
    /// How often each token occurs in `window`; empty when penalties are off.
    counts: Vec<u32>,
    seed: u64,
    rng: Rng,
    /// The last draw was greedy (temperature 0): its candidates are not filled.
    last_greedy: bool,
}

impl Sampler {
    /// Checks `params` against a vocabulary of `n_vocab` tokens (the length of
    /// every logits row that will be passed to [`Sampler::sample`]) and
    /// reserves all the memory sampling needs.
    pub fn new(params: SamplingParams, n_vocab: usize) -> Result<Sampler, SampleError> {
        params::validate(&params, n_vocab)?;
        // Validated to be >= -1; -1 (negative) means an unbounded window.
        let window_len = usize::try_from(params.repeat_last_n).ok();
        let penalties_named = params.chain.as_ref().is_none_or(|c| c.first() == Some(&Stage::Penalties));
        let penalties_on = params.repeat_last_n != 0
            && penalties_named
            && (params.repeat_penalty != 1.0
                || params.frequency_penalty != 0.0
                || params.presence_penalty != 0.0);
        let (window, counts) = if penalties_on {
            let reserve = window_len.unwrap_or(MAX_RESERVED_WINDOW);
            (
                VecDeque::with_capacity(reserve.min(MAX_RESERVED_WINDOW)),
                vec![0; n_vocab],
            )
        } else {
            (VecDeque::new(), Vec::new())
        };
        let mut bias = Vec::new();
        if !params.logit_bias.is_empty() {
            bias.resize(n_vocab, 0.0);
            for &(id, b) in &params.logit_bias {
                bias[id as usize] += b;
            }
        }
        let seed = params.seed.unwrap_or_else(rng::entropy_seed);
        Ok(Sampler {
            params,
            n_vocab,
            cands: Candidates::with_capacity(n_vocab),
            penalties_on,
            bias,
            window_len,
            window,
            counts,
            seed,
            rng: Rng::new(seed),
            last_greedy: false,
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// The seed in use: the requested one, or the one drawn from entropy
    /// (report it to make an unseeded run reproducible).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// How many of a row's largest logits decide the next draw, where the
    /// rest cannot change it (a row holding only those, the rest -inf,
    /// draws the same token from the same random stream): 1 for a greedy
    /// draw, `top_k` where top-k is on. `None` where any logit may matter:
    /// a bias or a penalty can lift a lower one past them, and without
    /// top-k the whole distribution is drawn from.
    pub fn decided_by_top(&self) -> Option<usize> {
        if self.penalties_on || !self.bias.is_empty() || self.params.chain.is_some() {
            return None;
        }
        if self.params.temperature <= 0.0 {
            return Some(1);
        }
        match usize::try_from(self.params.top_k) {
            Ok(k) if k > 0 && k < self.n_vocab => Some(k),
            _ => None,
        }
    }

    /// Picks the next token from one row of logits.
    ///
    /// Panics if `logits.len()` differs from the `n_vocab` given to `new`:
    /// that is a wiring bug, not a request error.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.sample_in(logits, None)
    }

    /// [`Sampler::sample`] with the vocabulary a named chain's infill stage
    /// reads; a chain with that stage must be sampled through this.
    pub fn sample_with_vocab(&mut self, logits: &[f32], vocab: &dyn InfillVocab) -> u32 {
        self.sample_in(logits, Some(vocab))
    }

    fn sample_in(&mut self, logits: &[f32], vocab: Option<&dyn InfillVocab>) -> u32 {
        assert_eq!(
            logits.len(),
            self.n_vocab,
            "logits row has {} entries but the sampler was built for {} tokens",
            logits.len(),
            self.n_vocab
        );
        let p = &self.params;
        let adjust = adjust_of(p, &self.bias, &self.counts);
        if let Some(chain) = &p.chain {
            self.last_greedy = false;
            let c = &mut self.cands;
            c.fill(logits, &adjust);
            for stage in chain {
                match stage {
                    // Taken with the bias as the row was read (first, as validated).
                    Stage::Penalties => {}
                    Stage::TopK => stages::top_k(c, p.top_k),
                    Stage::TypicalP => stages::typical(c, p.typical_p),
                    Stage::TopP => stages::top_p(c, p.top_p),
                    Stage::MinP => stages::min_p(c, p.min_p),
                    Stage::Temperature if p.temperature <= 0.0 => stages::top_k(c, 1),
                    Stage::Temperature => stages::temperature(c, p.temperature),
                    Stage::Infill => {
                        stages::infill(c, vocab.expect("a chain with the infill stage is sampled with its vocabulary"))
                    }
                }
            }
            return stages::draw(c, &mut self.rng);
        }
        self.last_greedy = p.temperature <= 0.0;
        if self.last_greedy {
            return stages::argmax(logits, &adjust);
        }
        let c = &mut self.cands;
        match usize::try_from(p.top_k) {
            Ok(k) if k > 0 && k < self.n_vocab => c.fill_top_k(logits, k, &adjust),
            _ => {
                c.fill(logits, &adjust);
                stages::top_k(c, p.top_k);
            }
        }
        stages::typical(c, p.typical_p);
        stages::top_p(c, p.top_p);
        stages::min_p(c, p.min_p);
        stages::temperature(c, p.temperature);
        stages::draw(c, &mut self.rng)
    }

    /// The distribution the last [`Sampler::sample`] drew `token` from, after
    /// the whole chain (llama-server's `post_sampling_probs`): the drawn
    /// token's probability and the `n` most likely candidates that survived,
    /// most likely first (equal ones by lower id), none at probability 0. A
    /// greedy draw had one candidate, the token, at probability 1.
    pub fn drawn_probs(&mut self, token: u32, n: usize) -> (f32, Vec<(u32, f32)>) {
        if self.last_greedy {
            return (1.0, if n > 0 { vec![(token, 1.0)] } else { Vec::new() });
        }
        let c = &mut self.cands.data;
        let own = c.iter().find(|x| x.id == token).map_or(0.0, |x| x.p);
        let mut kept: Vec<(u32, f32)> = c.iter().filter(|x| x.p > 0.0).map(|x| (x.id, x.p)).collect();
        kept.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        kept.truncate(n);
        (own, kept)
    }

    /// Records a token as part of the sequence so the penalties see it.
    /// Prompt tokens may be accepted too, as llama.cpp's server does. Ids
    /// outside the vocabulary are ignored: no logit could be penalised.
    pub fn accept(&mut self, token: u32) {
        if !self.penalties_on || token as usize >= self.n_vocab {
            return;
        }
        if Some(self.window.len()) == self.window_len {
            if let Some(old) = self.window.pop_front() {
                self.counts[old as usize] -= 1;
            }
        }
        self.window.push_back(token);
        self.counts[token as usize] += 1;
    }

    /// Records the tokens before the first draw (the prompt), as llama.cpp's
    /// server does, so the penalties count a repeat of the prompt's last
    /// tokens too. Only a window's worth at the end can matter.
    pub fn accept_history(&mut self, tokens: &[u32]) {
        if !self.penalties_on {
            return;
        }
        let from = self.window_len.map_or(0, |n| tokens.len().saturating_sub(n));
        for &t in &tokens[from..] {
            self.accept(t);
        }
    }

    /// Forgets the history and restarts the random stream: from the same
    /// seed when one was given (so a reset sampler repeats itself), from
    /// fresh entropy otherwise, as llama.cpp's dist sampler does.
    pub fn reset(&mut self) {
        for t in self.window.drain(..) {
            self.counts[t as usize] -= 1;
        }
        self.seed = self.params.seed.unwrap_or_else(rng::entropy_seed);
        self.rng = Rng::new(self.seed);
    }
}

/// Bias and penalties for one `sample` call. `counts` is empty exactly when
/// the penalties are off, which `Adjust` reads as "skip".
fn adjust_of<'a>(p: &SamplingParams, bias: &'a [f32], counts: &'a [u32]) -> Adjust<'a> {
    Adjust {
        bias,
        counts,
        repeat: p.repeat_penalty,
        freq: p.frequency_penalty,
        presence: p.presence_penalty,
    }
}

/// Log-sum-exp of a logits row, ignoring NaN. `None` when no entry is finite
/// enough to normalise against (all -inf, or some +inf).
fn log_sum_exp(logits: &[f32]) -> Option<f64> {
    let max = logits
        .iter()
        .filter(|x| !x.is_nan())
        .fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    if !max.is_finite() {
        return None;
    }
    let sum: f64 = logits
        .iter()
        .filter(|x| !x.is_nan())
        .map(|&x| ((x - max) as f64).exp())
        .sum();
    Some(max as f64 + sum.ln())
}

/// Log-probability of each entry of `logits` under its full softmax, with the
/// degenerate rows handled: all -inf gives a uniform row, +inf entries share
/// all the mass. NaN entries get -inf.
fn log_probs_fn(logits: &[f32]) -> impl Fn(f32) -> f32 + '_ {
    let lse = log_sum_exp(logits);
    let (max, n_max) = if lse.is_none() {
        let max = logits
            .iter()
            .filter(|x| !x.is_nan())
            .fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        (max, logits.iter().filter(|&&x| x == max).count().max(1))
    } else {
        (0.0, 1)
    };
    move |x: f32| match lse {
        _ if x.is_nan() => f32::NEG_INFINITY,
        Some(lse) => (x as f64 - lse) as f32,
        None if x == max => -(n_max as f32).ln(),
        None => f32::NEG_INFINITY,
    }
}

/// The `n` most likely tokens of a raw logits row with their natural-log
/// probabilities under the softmax of the whole row (what OpenAI's
/// `logprobs` reports), most likely first, equal logits by lower id.
/// Bias, penalties and truncation are deliberately not applied.
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let n = n.min(logits.len());
    if n == 0 {
        return Vec::new();
    }
    let key = |i: u32| {
        let x = logits[i as usize];
        if x.is_nan() {
            f32::NEG_INFINITY
        } else {
            x
        }
    };
    let desc = |a: &u32, b: &u32| {
        key(*b)
            .partial_cmp(&key(*a))
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(b))
    };
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    if n < ids.len() {
        ids.select_nth_unstable_by(n - 1, desc);
        ids.truncate(n);
    }
    ids.sort_unstable_by(desc);
    let logprob = log_probs_fn(logits);
    ids.into_iter()
        .map(|i| (i, logprob(logits[i as usize])))
        .collect()
}

/// Natural-log probability of one token under the softmax of the whole raw
/// row, for reporting the sampled token's own logprob.
pub fn token_logprob(logits: &[f32], token: u32) -> f32 {
    log_probs_fn(logits)(logits[token as usize])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every stage off: a plain draw from softmax(logits / temperature).
    fn plain(temperature: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            typical_p: 1.0,
            seed: Some(seed),
            ..Default::default()
        }
    }

    fn ln(probs: &[f32]) -> Vec<f32> {
        probs.iter().map(|p| p.ln()).collect()
    }

    fn softmax(logits: &[f32]) -> Vec<f64> {
        let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f64> = logits.iter().map(|&x| ((x - m) as f64).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|x| x / s).collect()
    }

    /// The logits the truncation stages would see.
    fn adjusted(s: &Sampler, logits: &[f32]) -> Vec<f32> {
        let a = adjust_of(&s.params, &s.bias, &s.counts);
        logits
            .iter()
            .enumerate()
            .map(|(i, &l)| a.apply(i, l))
            .collect()
    }

    fn histogram(s: &mut Sampler, logits: &[f32], draws: usize) -> Vec<f64> {
        let mut h = vec![0usize; logits.len()];
        for _ in 0..draws {
            h[s.sample(logits) as usize] += 1;
        }
        h.iter().map(|&c| c as f64 / draws as f64).collect()
    }

    /// `row` with all but its `k` largest (ties to the lower id) at -inf:
    /// what a device that reads back only the top of a row hands over.
    fn only_top(row: &[f32], k: usize) -> Vec<f32> {
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        let mut out = vec![f32::NEG_INFINITY; row.len()];
        order[..k].iter().for_each(|&i| out[i] = row[i]);
        out
    }

    #[test]
    fn a_draw_decided_by_the_top_draws_the_same_from_the_top_alone() {
        let n = 500;
        let mut rng = Rng::new(9);
        // Few distinct values, so the boundary of the top falls among ties.
        let rows: Vec<Vec<f32>> =
            (0..40).map(|_| (0..n).map(|_| (rng.next_u64() % 60) as f32 / 8.0).collect()).collect();
        let defaults = SamplingParams { seed: Some(3), ..Default::default() };
        for params in [defaults.clone(), SamplingParams::greedy(), SamplingParams { top_k: 7, top_p: 1.0, min_p: 0.0, ..defaults.clone() }] {
            let (mut full, mut top) = (Sampler::new(params.clone(), n).unwrap(), Sampler::new(params.clone(), n).unwrap());
            let k = top.decided_by_top().expect("these draws are decided by their top");
            for row in &rows {
                let t = full.sample(row);
                assert_eq!(top.sample(&only_top(row, k)), t, "{params:?}");
                full.accept(t);
                top.accept(t);
            }
        }
        // Where a lower logit can be lifted, or the whole row is drawn from.
        let whole = [
            SamplingParams { repeat_penalty: 1.1, ..defaults.clone() },
            SamplingParams { presence_penalty: -0.5, ..defaults.clone() },
            SamplingParams { logit_bias: vec![(3, 2.0)], ..defaults.clone() },
            SamplingParams { top_k: 0, ..defaults.clone() },
        ];
        for params in whole {
            assert_eq!(Sampler::new(params.clone(), n).unwrap().decided_by_top(), None, "{params:?}");
        }
    }

    fn assert_close(got: &[f64], want: &[f64], tol: f64) {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() < tol,
                "token {i}: got {g:.4}, want {w:.4} (all {got:?})"
            );
        }
    }

    #[test]
    fn distribution_matches_softmax_at_temperature_one() {
        let logits = [1.0, 2.0, 3.0];
        let mut s = Sampler::new(plain(1.0, 11), 3).unwrap();
        assert_close(&histogram(&mut s, &logits, 10_000), &softmax(&logits), 0.02);
    }

    #[test]
    fn temperature_sharpens_and_flattens() {
        let logits = [1.0, 2.0, 3.0];
        let mut s = Sampler::new(plain(0.5, 12), 3).unwrap();
        assert_close(
            &histogram(&mut s, &logits, 10_000),
            &softmax(&[2.0, 4.0, 6.0]),
            0.02,
        );
        let mut s = Sampler::new(plain(2.0, 13), 3).unwrap();
        assert_close(
            &histogram(&mut s, &logits, 10_000),
            &softmax(&[0.5, 1.0, 1.5]),
            0.02,
        );
    }

    #[test]
    fn greedy_picks_argmax_with_ties_to_lowest_id() {
        let mut s = Sampler::new(SamplingParams::greedy(), 5).unwrap();
        assert_eq!(s.sample(&[0.0, 4.0, 1.0, 4.0, 3.0]), 1);
        assert_eq!(s.sample(&[9.0, 9.0, 9.0, 9.0, 9.0]), 0);
        let mut s = Sampler::new(
            SamplingParams {
                temperature: -1.0,
                ..Default::default()
            },
            3,
        )
        .unwrap();
        assert_eq!(s.sample(&[0.0, 0.0, 1.0]), 2);
    }

    #[test]
    fn greedy_sees_bias_and_penalties() {
        let p = SamplingParams {
            logit_bias: vec![(2, -10.0)],
            repeat_penalty: 4.0,
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::new(p, 3).unwrap();
        let logits = [1.0, 3.0, 5.0];
        assert_eq!(s.sample(&logits), 1, "bias sinks token 2");
        s.accept(1);
        assert_eq!(s.sample(&logits), 0, "3 / 4 < 1");
    }

    #[test]
    fn bias_applies_before_penalties() {
        // Token 0: 1.0 - 2.0 = -1.0 after bias, then the repeat penalty
        // multiplies (negative): -2.0. The other order would give -1.5.
        let p = SamplingParams {
            logit_bias: vec![(0, -2.0)],
            repeat_penalty: 2.0,
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::new(p, 2).unwrap();
        s.accept(0);
        assert_eq!(adjusted(&s, &[1.0, 0.5]), vec![-2.0, 0.5]);
    }

    #[test]
    fn penalties_follow_llama_cpp_formulas() {
        let p = SamplingParams {
            repeat_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::new(p, 4).unwrap();
        for t in [0, 0, 1, 2] {
            s.accept(t);
        }
        assert_eq!(
            adjusted(&s, &[4.0, -4.0, 0.0, 1.0]),
            vec![4.0 / 2.0 - 2.0 * 0.5 - 0.25, -8.0 - 0.5 - 0.25, -0.75, 1.0]
        );
    }

    #[test]
    fn penalty_window_slides() {
        let p = SamplingParams {
            presence_penalty: 1.0,
            repeat_last_n: 2,
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::new(p, 4).unwrap();
        for t in [0, 1, 2] {
            s.accept(t);
        }
        assert_eq!(
            adjusted(&s, &[0.0; 4]),
            vec![0.0, -1.0, -1.0, 0.0],
            "token 0 left the window"
        );
        s.reset();
        assert_eq!(
            adjusted(&s, &[0.0; 4]),
            vec![0.0; 4],
            "reset clears history"
        );
        assert!(s.counts.iter().all(|&c| c == 0));
    }

    #[test]
    fn the_history_fills_the_window_with_its_last_tokens() {
        let p = SamplingParams {
            presence_penalty: 1.0,
            repeat_last_n: 2,
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::new(p, 4).unwrap();
        s.accept_history(&[0, 1, 2]);
        assert_eq!(adjusted(&s, &[0.0; 4]), vec![0.0, -1.0, -1.0, 0.0], "the last two of the prompt count");
        let off = Sampler::new(SamplingParams::greedy(), 4).map(|mut s| {
            s.accept_history(&[0, 1]);
            s.window.len()
        });
        assert_eq!(off.unwrap(), 0, "without penalties nothing is kept");
    }

    #[test]
    fn top_k_sees_bias_and_penalties() {
        // Token 3 is last on raw logits but first after its bias; token 0 is
        // penalised below token 1. With top-k 2 only tokens 3 and 1 survive.
        let p = SamplingParams {
            top_k: 2,
            logit_bias: vec![(3, 5.0)],
            presence_penalty: 5.0,
            ..plain(1.0, 8)
        };
        let mut s = Sampler::new(p, 4).unwrap();
        s.accept(0);
        let h = histogram(&mut s, &[5.0, 4.0, 3.0, 0.0], 2000);
        assert_eq!(h[0] + h[2], 0.0, "{h:?}");
        assert!(h[1] > 0.0 && h[3] > 0.0, "{h:?}");
    }

    #[test]
    fn unbounded_window_remembers_everything() {
        let p = SamplingParams {
            presence_penalty: 1.0,
            repeat_last_n: -1,
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::new(p, 3).unwrap();
        s.accept(0);
        for _ in 0..100_000 {
            s.accept(1);
        }
        assert_eq!(adjusted(&s, &[0.0; 3]), vec![-1.0, -1.0, 0.0]);
        s.reset();
        assert_eq!(adjusted(&s, &[0.0; 3]), vec![0.0; 3]);
    }

    #[test]
    fn penalties_off_ignore_history() {
        let p = SamplingParams {
            repeat_last_n: 0,
            repeat_penalty: 2.0,
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::new(p, 2).unwrap();
        s.accept(0);
        assert_eq!(s.sample(&[1.0, 0.9]), 0);
        s.accept(7); // out of vocabulary: ignored, not a panic
    }

    #[test]
    fn top_k_runs_before_top_p() {
        // top-k 2 renormalises 0.4, 0.3 to 0.57, 0.43, so top-p 0.5 keeps one
        // token. top-p first would keep two (0.4 < 0.5).
        let p = SamplingParams {
            top_k: 2,
            top_p: 0.5,
            ..plain(1.0, 3)
        };
        let mut s = Sampler::new(p, 4).unwrap();
        let logits = ln(&[0.4, 0.3, 0.2, 0.1]);
        assert!((0..500).all(|_| s.sample(&logits) == 0));
    }

    #[test]
    fn typical_runs_before_top_p() {
        // typical 0.45 keeps tokens 1, 2 (0.3, 0.2 -> 0.6, 0.4) and top-p 0.5
        // then keeps token 1; the reverse order always yields token 0.
        let p = SamplingParams {
            typical_p: 0.45,
            top_p: 0.5,
            ..plain(1.0, 4)
        };
        let mut s = Sampler::new(p, 4).unwrap();
        let logits = ln(&[0.4, 0.3, 0.2, 0.1]);
        assert!((0..500).all(|_| s.sample(&logits) == 1));
    }

    #[test]
    fn min_p_runs_before_temperature() {
        // min-p 0.5 on probs 0.5, 0.2, 0.3 keeps tokens 0 and 2. Had the
        // temperature 0.5 come first (0.66, 0.11, 0.24), token 2 would fall
        // below half the best and never be drawn.
        let p = SamplingParams {
            min_p: 0.5,
            ..plain(0.5, 5)
        };
        let mut s = Sampler::new(p, 3).unwrap();
        let h = histogram(&mut s, &ln(&[0.5, 0.2, 0.3]), 5000);
        assert_eq!(h[1], 0.0);
        // Survivors 0.5, 0.3 at temperature 0.5: 0.25 / 0.34 and 0.09 / 0.34.
        assert_close(&h, &[0.25 / 0.34, 0.0, 0.09 / 0.34], 0.025);
    }

    #[test]
    fn truncation_survives_high_temperature() {
        // A very high temperature flattens survivors but cannot revive
        // tokens the truncation stages dropped.
        let p = SamplingParams {
            top_k: 2,
            temperature: 100.0,
            seed: Some(9),
            ..Default::default()
        };
        let mut s = Sampler::new(p, 4).unwrap();
        let h = histogram(&mut s, &[5.0, 4.0, 3.0, 2.0], 4000);
        assert_eq!(h[2] + h[3], 0.0);
        assert_close(&h[..2], &[0.5, 0.5], 0.04);
    }

    #[test]
    fn banned_tokens_are_never_drawn() {
        let p = SamplingParams {
            logit_bias: vec![(0, f32::NEG_INFINITY)],
            ..plain(1.0, 6)
        };
        let mut s = Sampler::new(p, 2).unwrap();
        assert!((0..1000).all(|_| s.sample(&[10.0, 0.0]) == 1));
        // Everything banned still yields a token instead of NaN chaos.
        let p = SamplingParams {
            logit_bias: vec![(0, f32::NEG_INFINITY), (1, f32::NEG_INFINITY)],
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(p, 2).unwrap();
        assert!(s.sample(&[1.0, 2.0]) < 2);
    }

    #[test]
    fn defaults_sample_from_the_plausible_head() {
        let mut s = Sampler::new(
            SamplingParams {
                seed: Some(1),
                ..Default::default()
            },
            100,
        )
        .unwrap();
        // Token 0 dominates; min-p 0.05 drops everything below e^-3 of it.
        let mut logits = vec![0.0f32; 100];
        logits[0] = 10.0;
        logits[1] = 8.0;
        for _ in 0..1000 {
            assert!(s.sample(&logits) <= 1);
        }
    }

    fn run(seed: u64, steps: usize) -> Vec<u32> {
        let p = SamplingParams {
            seed: Some(seed),
            top_k: 0,
            repeat_penalty: 1.1,
            frequency_penalty: 0.1,
            ..Default::default()
        };
        let n = 257;
        let mut s = Sampler::new(p, n).unwrap();
        let mut out = Vec::new();
        for step in 0..steps {
            let logits: Vec<f32> = (0..n)
                .map(|i| (((i * 31 + step * 17) % 97) as f32 / 24.0).sin() * 3.0)
                .collect();
            let t = s.sample(&logits);
            s.accept(t);
            out.push(t);
        }
        out
    }

    #[test]
    fn same_seed_same_tokens() {
        assert_eq!(run(1234, 200), run(1234, 200));
        assert_ne!(run(1234, 200), run(4321, 200));
    }

    #[test]
    fn reset_replays_a_seeded_sampler() {
        let mut s = Sampler::new(plain(1.0, 77), 8).unwrap();
        let logits = [0.0f32; 8];
        let first: Vec<u32> = (0..50).map(|_| s.sample(&logits)).collect();
        s.reset();
        let again: Vec<u32> = (0..50).map(|_| s.sample(&logits)).collect();
        assert_eq!(first, again);
        assert!(first.iter().any(|&t| t != first[0]));
    }

    #[test]
    fn unseeded_samplers_differ() {
        let p = SamplingParams {
            seed: None,
            ..plain(1.0, 0)
        };
        let a = Sampler::new(p.clone(), 4).unwrap();
        let b = Sampler::new(p, 4).unwrap();
        assert_ne!(a.seed(), b.seed());
    }

    #[test]
    fn sample_does_not_reallocate() {
        let n = 32_000;
        let mut s = Sampler::new(
            SamplingParams {
                top_k: 0,
                repeat_penalty: 1.3,
                seed: Some(2),
                ..Default::default()
            },
            n,
        )
        .unwrap();
        let logits: Vec<f32> = (0..n).map(|i| ((i % 1000) as f32) * 0.01).collect();
        let (ptr, cap) = (s.cands.data.as_ptr(), s.cands.data.capacity());
        for _ in 0..20 {
            let t = s.sample(&logits);
            s.accept(t);
        }
        assert_eq!((s.cands.data.as_ptr(), s.cands.data.capacity()), (ptr, cap));
    }

    #[test]
    fn new_rejects_bad_params() {
        let e = Sampler::new(
            SamplingParams {
                top_p: -1.0,
                ..Default::default()
            },
            10,
        )
        .unwrap_err();
        assert_eq!(e.field(), "top_p");
        let e = Sampler::new(
            SamplingParams {
                logit_bias: vec![(3, 1.0)],
                ..Default::default()
            },
            3,
        )
        .unwrap_err();
        assert_eq!(
            e,
            SampleError::BiasTokenOutOfRange {
                token: 3,
                n_vocab: 3
            }
        );
        assert!(Sampler::new(SamplingParams::default(), 0).is_err());
    }

    #[test]
    #[should_panic(expected = "logits row has 2 entries")]
    fn wrong_row_length_panics() {
        Sampler::new(SamplingParams::default(), 3)
            .unwrap()
            .sample(&[0.0, 1.0]);
    }

    #[test]
    fn drawn_probs_are_the_chain_s_distribution() {
        // top_k 2 of four tokens at temperature 0.5: the two kept share the
        // mass as softmax(logits / 0.5), the others have none.
        let logits = [1.0f32, 3.0, 2.0, 0.0];
        let params = SamplingParams { top_k: 2, ..plain(0.5, 7) };
        let mut s = Sampler::new(params, 4).unwrap();
        let token = s.sample(&logits);
        let (own, kept) = s.drawn_probs(token, 10);
        let want = softmax(&[3.0 / 0.5, 2.0 / 0.5]);
        assert_eq!(kept.iter().map(|k| k.0).collect::<Vec<_>>(), vec![1, 2]);
        assert!((kept[0].1 as f64 - want[0]).abs() < 1e-6 && (kept[1].1 as f64 - want[1]).abs() < 1e-6);
        assert!([1, 2].contains(&token) && own == kept.iter().find(|k| k.0 == token).unwrap().1);
        assert_eq!(s.drawn_probs(token, 1).1.len(), 1);
        // A greedy draw had one candidate.
        let mut g = Sampler::new(SamplingParams { temperature: 0.0, ..Default::default() }, 4).unwrap();
        let t = g.sample(&logits);
        assert_eq!((t, g.drawn_probs(t, 5)), (1, (1.0, vec![(1, 1.0)])));
    }

    #[test]
    fn top_logprobs_from_full_softmax() {
        let logits = [1.0f32, 3.0, 2.0, 0.0];
        let lse = logits.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
        let got = top_logprobs(&logits, 2);
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].0, got[1].0), (1, 2));
        assert!((got[0].1 as f64 - (3.0 - lse)).abs() < 1e-6);
        assert!((got[1].1 as f64 - (2.0 - lse)).abs() < 1e-6);
        let all = top_logprobs(&logits, 10);
        assert_eq!(
            all.iter().map(|x| x.0).collect::<Vec<_>>(),
            vec![1, 2, 0, 3]
        );
        let total: f64 = all.iter().map(|x| (x.1 as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!(top_logprobs(&logits, 0).is_empty());
        assert!((token_logprob(&logits, 3) as f64 - (0.0 - lse)).abs() < 1e-6);
    }

    #[test]
    fn top_logprobs_ties_and_degenerate_rows() {
        let got = top_logprobs(&[2.0, 5.0, 5.0, 5.0], 2);
        assert_eq!((got[0].0, got[1].0), (1, 2));
        let got = top_logprobs(&[f32::NEG_INFINITY; 4], 1);
        assert!((got[0].1 - (0.25f32).ln()).abs() < 1e-6);
        let got = top_logprobs(&[0.0, f32::INFINITY, f32::NAN], 3);
        assert_eq!(got[0], (1, 0.0));
        assert_eq!(got[1].1, f32::NEG_INFINITY);
        assert_eq!(got[2], (2, f32::NEG_INFINITY));
    }

    #[test]
    fn top_logprobs_large_logits_are_stable() {
        let got = top_logprobs(&[1000.0, 1000.0], 1);
        assert!((got[0].1 - (0.5f32).ln()).abs() < 1e-6);
    }

    /// Eight tokens: "ab", "abc", "x", an end of turn (id 3, no text), "y", "z", "w", "v".
    struct Pieces;

    impl InfillVocab for Pieces {
        fn is_eog(&self, id: u32) -> bool {
            id == 3
        }
        fn piece(&self, id: u32) -> &[u8] {
            [&b"ab"[..], b"abc", b"x", b"", b"y", b"z", b"w", b"v"][id as usize]
        }
        fn end_of_insertion(&self) -> Option<u32> {
            Some(3)
        }
    }

    /// How often each token is drawn through top-k (all eight) and infill.
    fn drawn(probs: &[f32; 8], seed: u64) -> Vec<f64> {
        let params = SamplingParams { top_k: 8, chain: Some(vec![Stage::TopK, Stage::Infill]), ..plain(1.0, seed) };
        let mut s = Sampler::new(params, 8).unwrap();
        let mut h = vec![0usize; 8];
        for _ in 0..4000 {
            h[s.sample_with_vocab(&ln(probs), &Pieces) as usize] += 1;
        }
        h.iter().map(|&c| c as f64 / 4000.0).collect()
    }

    #[test]
    fn infill_merges_a_token_into_the_likelier_one_its_text_starts_and_drops_the_unlikely() {
        // The end of turn (0.01) is too unlikely to end it (3 * 0.01 * 8 < 0.99). "abc"
        // (0.35) takes "ab" (0.3), which leaves; the rest fall below 0.2 but the end of
        // turn, which always stays. The survivors are drawn by their own logits.
        let h = drawn(&[0.3, 0.35, 0.1, 0.01, 0.09, 0.05, 0.05, 0.05], 5);
        assert!(h.iter().enumerate().all(|(i, &x)| i == 1 || i == 3 || x == 0.0), "{h:?}");
        assert_close(&[h[1], h[3]], &[0.35 / 0.36, 0.01 / 0.36], 0.02);
    }

    #[test]
    fn infill_keeps_only_the_end_where_it_holds_enough_of_the_mass() {
        // 3 * 0.05 * 8 = 1.2 > 0.95.
        let h = drawn(&[0.4, 0.2, 0.1, 0.05, 0.1, 0.05, 0.05, 0.05], 6);
        assert_eq!(h[3], 1.0);
    }

    #[test]
    fn infill_ends_the_insertion_when_no_text_is_likely_enough() {
        // Every text below 0.2 ("abc" merged into "ab" too): the one candidate
        // left is the end of the insertion.
        let h = drawn(&[0.15, 0.001, 0.15, 0.002, 0.15, 0.15, 0.15, 0.15], 7);
        assert_eq!(h[3], 1.0);
        // Without the stage, the same row draws text.
        let params = SamplingParams { top_k: 8, chain: Some(vec![Stage::TopK]), ..plain(1.0, 7) };
        let mut s = Sampler::new(params, 8).unwrap();
        assert_ne!(s.sample(&ln(&[0.15, 0.001, 0.15, 0.002, 0.15, 0.15, 0.15, 0.15])), 3);
    }

    #[test]
    fn a_named_chain_runs_only_its_stages_in_its_order() {
        let logits = [0.0f32, 1.0, 2.0, 3.0];
        // Without the penalties in the chain, a repeated token is not penalised.
        let mut s = Sampler::new(SamplingParams {
            repeat_penalty: 100.0, chain: Some(vec![Stage::Temperature]), ..plain(0.0, 1)
        }, 4).unwrap();
        s.accept(3);
        assert_eq!(s.sample(&logits), 3);
        assert_eq!(s.decided_by_top(), None);
        // With them first, it is.
        let mut s = Sampler::new(SamplingParams {
            repeat_penalty: 100.0, chain: Some(vec![Stage::Penalties, Stage::Temperature]), ..plain(0.0, 1)
        }, 4).unwrap();
        s.accept(3);
        assert_eq!(s.sample(&logits), 2);
        // A chain without temperature draws at temperature 1 whatever the parameter says.
        let params = SamplingParams { chain: Some(vec![Stage::TopK]), top_k: 2, ..plain(0.0, 9) };
        let mut s = Sampler::new(params, 4).unwrap();
        let h = histogram(&mut s, &logits, 4000);
        let e = 1.0f64.exp();
        assert_close(&h, &[0.0, 0.0, 1.0 / (1.0 + e), e / (1.0 + e)], 0.03);
    }

    #[test]
    fn a_chain_ember_cannot_run_as_llama_cpp_would_is_refused_by_name() {
        for (chain, top_k) in [(vec![Stage::TopK, Stage::Penalties], 40), (vec![Stage::Infill, Stage::TopK], 40),
                               (vec![Stage::TopK, Stage::Infill], 0), (vec![Stage::TopK, Stage::Infill], 5000)] {
            let e = Sampler::new(SamplingParams { chain: Some(chain), top_k, ..Default::default() }, 8).unwrap_err();
            assert_eq!(e.field(), "samplers");
        }
    }
}
