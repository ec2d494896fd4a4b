//! The individual sampling stages, each a port of the matching llama.cpp
//! sampler (src/llama-sampling.cpp) working in place on a candidate list, so
//! that the chain never allocates once the list has its capacity.

use std::cmp::Ordering;

use crate::rng::Rng;

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Candidate {
    pub id: u32,
    pub logit: f32,
    /// Probability, valid only right after `softmax`.
    pub p: f32,
    /// Per-stage scratch (typical sampling's sort key).
    pub score: f32,
}

/// The surviving tokens. `sorted` means most likely first, as llama.cpp's
/// `llama_token_data_array::sorted`, so stages can skip re-sorting.
#[derive(Debug, Default)]
pub(crate) struct Candidates {
    pub data: Vec<Candidate>,
    pub sorted: bool,
}

/// Higher logit first; equal logits by lower id, so that every ordering the
/// chain produces, and hence every seeded draw, is reproducible.
fn by_logit_desc(a: &Candidate, b: &Candidate) -> Ordering {
    b.logit
        .partial_cmp(&a.logit)
        .unwrap_or(Ordering::Equal)
        .then(a.id.cmp(&b.id))
}

impl Candidates {
    pub(crate) fn with_capacity(n: usize) -> Self {
        Candidates {
            data: Vec::with_capacity(n),
            sorted: false,
        }
    }

    /// Loads a fresh logits row in id order, each logit already through
    /// `adjust`.
    pub(crate) fn fill(&mut self, logits: &[f32], adjust: &Adjust) {
        self.data.clear();
        self.data
            .extend(logits.iter().enumerate().map(|(i, &l)| Candidate {
                id: i as u32,
                logit: adjust.apply(i, l),
                p: 0.0,
                score: 0.0,
            }));
        self.sorted = false;
    }

    /// `fill` followed by top-k in one pass: only the `k` best adjusted
    /// logits are ever stored, kept in a heap whose root is the worst of
    /// them. With a large vocabulary nearly every token fails the single
    /// comparison against the root, which is far cheaper than writing out the
    /// whole row and selecting from it. Needs `1 <= k < logits.len()`.
    pub(crate) fn fill_top_k(&mut self, logits: &[f32], k: usize, adjust: &Adjust) {
        debug_assert!(k >= 1 && k < logits.len());
        let heap = &mut self.data;
        heap.clear();
        let candidate = |i: usize| Candidate {
            id: i as u32,
            logit: adjust.apply(i, logits[i]),
            p: 0.0,
            score: 0.0,
        };
        for i in 0..k {
            heap.push(candidate(i));
            sift_up(heap, i);
        }
        for (i, &raw) in logits.iter().enumerate().skip(k) {
            // Ids arrive in increasing order, so an equal logit loses the tie
            // to the root and never enters.
            if adjust.apply(i, raw) > heap[0].logit {
                heap[0] = candidate(i);
                sift_down(heap, 0);
            }
        }
        self.sorted = false;
        self.sort();
    }

    fn sort(&mut self) {
        if !self.sorted {
            self.data.sort_unstable_by(by_logit_desc);
            self.sorted = true;
        }
    }

    fn max_logit(&self) -> f32 {
        if self.sorted {
            return self.data.first().map_or(f32::NEG_INFINITY, |c| c.logit);
        }
        self.data
            .iter()
            .fold(f32::NEG_INFINITY, |m, c| m.max(c.logit))
    }

    /// The most likely candidate, lowest id among equals.
    pub(crate) fn argmax(&self) -> u32 {
        let mut best = self.data[0];
        for c in &self.data[1..] {
            if by_logit_desc(c, &best) == Ordering::Less {
                best = *c;
            }
        }
        best.id
    }
}

/// Greedy decoding straight off the row: the best adjusted logit, lowest id
/// among equals, without storing any candidate.
pub(crate) fn argmax(logits: &[f32], adjust: &Adjust) -> u32 {
    let mut best = 0;
    let mut best_logit = f32::NEG_INFINITY;
    for (i, &raw) in logits.iter().enumerate() {
        let l = adjust.apply(i, raw);
        if l > best_logit {
            best = i;
            best_logit = l;
        }
    }
    best as u32
}

/// `a` comes after `b` in the chain's most-likely-first order.
fn worse(a: &Candidate, b: &Candidate) -> bool {
    by_logit_desc(a, b) == Ordering::Greater
}

fn sift_up(heap: &mut [Candidate], mut i: usize) {
    while i > 0 {
        let parent = (i - 1) / 2;
        if !worse(&heap[i], &heap[parent]) {
            break;
        }
        heap.swap(i, parent);
        i = parent;
    }
}

fn sift_down(heap: &mut [Candidate], mut i: usize) {
    loop {
        let (l, r) = (2 * i + 1, 2 * i + 2);
        let mut worst = i;
        if l < heap.len() && worse(&heap[l], &heap[worst]) {
            worst = l;
        }
        if r < heap.len() && worse(&heap[r], &heap[worst]) {
            worst = r;
        }
        if worst == i {
            return;
        }
        heap.swap(i, worst);
        i = worst;
    }
}

/// Fills `p` with the softmax of the logits without reordering.
pub(crate) fn softmax(c: &mut Candidates) {
    let max = c.max_logit();
    if !max.is_finite() {
        // All -inf (everything banned) or some +inf: the maximal logits share
        // the mass evenly instead of turning into NaN.
        let n = c.data.iter().filter(|x| x.logit == max).count() as f32;
        for x in &mut c.data {
            x.p = if x.logit == max { 1.0 / n } else { 0.0 };
        }
        return;
    }
    let mut sum = 0.0f32;
    for x in &mut c.data {
        x.p = (x.logit - max).exp();
        sum += x.p;
    }
    for x in &mut c.data {
        x.p /= sum;
    }
}

/// The first two stages, logit bias then penalties, which change single
/// tokens' logits without looking at the rest of the row. They are applied
/// per token while the row is read, so the later stages see adjusted logits
/// exactly as llama.cpp's chain would hand them on.
#[derive(Debug)]
pub(crate) struct Adjust<'a> {
    /// Summed bias per token; empty when there is none.
    pub bias: &'a [f32],
    /// Occurrences per token in the penalty window; empty when penalties are
    /// off.
    pub counts: &'a [u32],
    pub repeat: f32,
    pub freq: f32,
    pub presence: f32,
}

impl Adjust<'_> {
    #[cfg(test)]
    pub(crate) const NONE: Adjust<'static> = Adjust {
        bias: &[],
        counts: &[],
        repeat: 1.0,
        freq: 0.0,
        presence: 0.0,
    };

    /// The logit of token `i` after bias and penalties. NaN (a broken
    /// forward pass) becomes -inf so that comparisons stay total.
    #[inline]
    pub(crate) fn apply(&self, i: usize, raw: f32) -> f32 {
        let mut l = if raw.is_nan() { f32::NEG_INFINITY } else { raw };
        if !self.bias.is_empty() {
            l += self.bias[i];
        }
        if !self.counts.is_empty() {
            let count = self.counts[i];
            if count > 0 {
                // llama.cpp's penalties: divide a positive logit (multiply a
                // non-positive one) by `repeat`, so the penalty always lowers
                // it, then subtract `count * freq + presence`.
                if l <= 0.0 {
                    l *= self.repeat;
                } else {
                    l /= self.repeat;
                }
                l -= count as f32 * self.freq + self.presence;
            }
        }
        l
    }
}

/// Keeps the `k` most likely candidates, sorted; `k <= 0` is off.
pub(crate) fn top_k(c: &mut Candidates, k: i32) {
    if k <= 0 {
        return;
    }
    let k = (k as usize).min(c.data.len());
    if !c.sorted && k < c.data.len() {
        c.data.select_nth_unstable_by(k - 1, by_logit_desc);
        c.data.truncate(k);
    }
    c.sort();
    c.data.truncate(k);
}

/// Locally typical sampling (Meister et al.): keep the tokens whose surprisal
/// is closest to the entropy until their mass exceeds `p`.
pub(crate) fn typical(c: &mut Candidates, p: f32) {
    if p >= 1.0 {
        return;
    }
    softmax(c);
    // p == 0 contributes 0 to the entropy in the limit; llama.cpp would turn
    // it into NaN, which makes the sort below meaningless.
    let entropy: f32 = c
        .data
        .iter()
        .filter(|x| x.p > 0.0)
        .map(|x| -x.p * x.p.ln())
        .sum();
    for x in &mut c.data {
        x.score = if x.p > 0.0 {
            (-x.p.ln() - entropy).abs()
        } else {
            f32::INFINITY
        };
    }
    c.data.sort_unstable_by(|a, b| {
        a.score
            .partial_cmp(&b.score)
            .unwrap_or(Ordering::Equal)
            .then(a.id.cmp(&b.id))
    });
    let mut cum = 0.0f32;
    let mut last = c.data.len();
    for (i, x) in c.data.iter().enumerate() {
        cum += x.p;
        if cum > p {
            last = i + 1;
            break;
        }
    }
    c.data.truncate(last);
    c.sorted = false;
}

/// Nucleus sampling: keep the smallest most-likely-first prefix whose mass
/// reaches `p` (`>=`, as llama.cpp), always at least one token.
pub(crate) fn top_p(c: &mut Candidates, p: f32) {
    if p >= 1.0 {
        return;
    }
    softmax(c);
    if c.sorted {
        c.data
            .truncate(nucleus_len(&c.data, p).unwrap_or(c.data.len()));
        return;
    }
    // The nucleus is usually a few dozen tokens of a large vocabulary: order
    // a growing head (each step selects the next chunk out of the unordered
    // tail) instead of sorting everything.
    let n = c.data.len();
    let mut done = 0;
    let mut want = 128.min(n);
    loop {
        if want < n {
            c.data[done..].select_nth_unstable_by(want - done - 1, by_logit_desc);
        }
        c.data[done..want].sort_unstable_by(by_logit_desc);
        if let Some(len) = nucleus_len(&c.data[..want], p) {
            c.data.truncate(len);
            break;
        }
        if want == n {
            break;
        }
        done = want;
        want = (want * 2).min(n);
    }
    c.sorted = true;
}

/// Length of the shortest prefix with mass `>= p`, if the slice has one.
fn nucleus_len(sorted: &[Candidate], p: f32) -> Option<usize> {
    let mut cum = 0.0f32;
    for (i, x) in sorted.iter().enumerate() {
        cum += x.p;
        if cum >= p {
            return Some(i + 1);
        }
    }
    None
}

/// Keeps tokens at least `p` times as likely as the best, which in logits is
/// `logit >= max + ln p`; `p <= 0` is off. Order is preserved.
pub(crate) fn min_p(c: &mut Candidates, p: f32) {
    if p <= 0.0 || c.data.is_empty() {
        return;
    }
    if p > 1.0 {
        // Nothing is more than 100% as likely as the best; llama.cpp's
        // sorted path still keeps the best token, so do the same.
        let best = c.data.iter().copied().min_by(by_logit_desc);
        c.data.clear();
        c.data.extend(best);
        return;
    }
    // ln p <= 0, so the best token (even at +-inf) always survives.
    let min_logit = c.max_logit() + p.ln();
    c.data.retain(|x| x.logit >= min_logit);
}

pub(crate) fn temperature(c: &mut Candidates, t: f32) {
    for x in &mut c.data {
        x.logit /= t;
    }
}

/// llama.cpp's infill sampler (`llama_sampler_infill_apply`), on the
/// candidates sorted and their probabilities taken: where the end of
/// generation holds enough of the mass (three times its share per
/// candidate against the text's), only the end-of-generation tokens stay;
/// else each candidate whose text starts another's takes the other's
/// probability (the likelier of the two keeps both, the other leaves), and
/// those below 0.2 leave, the end of generation always staying; if no text
/// is left, the one candidate is the end of the insertion. The draw that
/// follows weighs the survivors by their own logits, as llama.cpp's does.
pub(crate) fn infill(c: &mut Candidates, vocab: &dyn crate::InfillVocab) {
    c.sort();
    softmax(c);
    let (mut p_txt, mut p_eog) = (0.0f32, 0.0f32);
    for x in &c.data {
        if vocab.is_eog(x.id) {
            p_eog += x.p;
        } else {
            p_txt += x.p;
        }
    }
    if 3.0 * p_eog * c.data.len() as f32 > p_txt {
        c.data.retain(|x| vocab.is_eog(x.id));
        let sum: f32 = c.data.iter().map(|x| x.p).sum();
        for x in &mut c.data {
            x.p /= sum;
        }
        return;
    }
    let n = c.data.len();
    for i0 in 0..n {
        for i1 in 0..n {
            if c.data[i0].logit == f32::NEG_INFINITY {
                break;
            }
            if i0 == i1 || c.data[i1].logit == f32::NEG_INFINITY {
                continue;
            }
            let (a, b) = (vocab.piece(c.data[i0].id), vocab.piece(c.data[i1].id));
            if !a.is_empty() && b.starts_with(a) {
                let (dst, src) = if c.data[i1].p > c.data[i0].p { (i1, i0) } else { (i0, i1) };
                c.data[dst].p += c.data[src].p;
                c.data[src].logit = f32::NEG_INFINITY;
                c.data[src].p = 0.0;
            }
        }
    }
    const THRESHOLD: f32 = 0.2;
    c.data.retain(|x| x.p >= THRESHOLD || vocab.is_eog(x.id));
    if c.data.iter().all(|x| vocab.is_eog(x.id)) {
        if let Some(end) = vocab.end_of_insertion() {
            c.data.clear();
            c.data.push(Candidate { id: end, logit: 1.0, p: 1.0, score: 0.0 });
        }
        return;
    }
    let sum: f32 = c.data.iter().map(|x| x.p).sum();
    for x in &mut c.data {
        x.p /= sum;
    }
}

/// Draws one candidate in proportion to its softmax probability.
pub(crate) fn draw(c: &mut Candidates, rng: &mut Rng) -> u32 {
    softmax(c);
    let total: f64 = c.data.iter().map(|x| x.p as f64).sum();
    let target = rng.next_f64() * total;
    let mut cum = 0.0f64;
    let mut last_positive = None;
    for x in &c.data {
        if x.p > 0.0 {
            cum += x.p as f64;
            last_positive = Some(x.id);
            if target < cum {
                return x.id;
            }
        }
    }
    // Rounding can leave target a hair above the final sum.
    last_positive.unwrap_or_else(|| c.argmax())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(logits: &[f32]) -> Candidates {
        let mut c = Candidates::with_capacity(logits.len());
        c.fill(logits, &Adjust::NONE);
        c
    }

    fn ids(c: &Candidates) -> Vec<u32> {
        c.data.iter().map(|x| x.id).collect()
    }

    fn sorted_ids(c: &Candidates) -> Vec<u32> {
        let mut v = ids(c);
        v.sort();
        v
    }

    /// Logits whose softmax is exactly `probs` (up to float rounding).
    fn logits_of(probs: &[f32]) -> Vec<f32> {
        probs.iter().map(|p| p.ln()).collect()
    }

    #[test]
    fn fill_replaces_nan() {
        let c = cands(&[1.0, f32::NAN]);
        assert_eq!(c.data[1].logit, f32::NEG_INFINITY);
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut c = cands(&[1.0, 2.0, 3.0]);
        softmax(&mut c);
        let e: Vec<f32> = [1.0f32, 2.0, 3.0].iter().map(|x| x.exp()).collect();
        let s: f32 = e.iter().sum();
        for (x, want) in c.data.iter().zip(&e) {
            assert!((x.p - want / s).abs() < 1e-6);
        }
    }

    #[test]
    fn softmax_all_banned_or_infinite() {
        let mut c = cands(&[f32::NEG_INFINITY; 4]);
        softmax(&mut c);
        assert!(c.data.iter().all(|x| x.p == 0.25));
        let mut c = cands(&[0.0, f32::INFINITY, 1.0]);
        softmax(&mut c);
        assert_eq!(
            c.data.iter().map(|x| x.p).collect::<Vec<_>>(),
            vec![0.0, 1.0, 0.0]
        );
    }

    #[test]
    fn logit_bias_adds() {
        let bias = [5.0, 0.0, f32::NEG_INFINITY];
        let adj = Adjust {
            bias: &bias,
            ..Adjust::NONE
        };
        assert_eq!(adj.apply(0, 0.0), 5.0);
        assert_eq!(adj.apply(1, 1.0), 1.0);
        assert_eq!(adj.apply(2, 2.0), f32::NEG_INFINITY);
    }

    #[test]
    fn repeat_penalty_divides_positive_multiplies_negative() {
        let counts = [1, 1, 1, 0];
        let adj = Adjust {
            counts: &counts,
            repeat: 2.0,
            ..Adjust::NONE
        };
        assert_eq!(adj.apply(0, 2.0), 1.0);
        assert_eq!(adj.apply(1, -2.0), -4.0);
        assert_eq!(adj.apply(2, 0.0), 0.0);
        assert_eq!(adj.apply(3, 3.0), 3.0, "unseen token untouched");
    }

    #[test]
    fn frequency_and_presence_penalties() {
        let counts = [3, 1, 0];
        let adj = Adjust {
            counts: &counts,
            freq: 0.5,
            presence: 0.25,
            ..Adjust::NONE
        };
        assert_eq!(adj.apply(0, 1.0), 1.0 - 3.0 * 0.5 - 0.25);
        assert_eq!(adj.apply(1, 1.0), 1.0 - 0.5 - 0.25);
        assert_eq!(adj.apply(2, 1.0), 1.0);
    }

    #[test]
    fn bias_comes_before_penalties() {
        // 1.0 - 2.0 = -1.0, then the penalty multiplies a negative logit:
        // -2.0. Penalising first would give 0.5 - 2.0 = -1.5.
        let (bias, counts) = ([-2.0], [1]);
        let adj = Adjust {
            bias: &bias,
            counts: &counts,
            repeat: 2.0,
            ..Adjust::NONE
        };
        assert_eq!(adj.apply(0, 1.0), -2.0);
    }

    #[test]
    fn fill_top_k_matches_fill_then_top_k() {
        let n = 3000;
        // Many exact ties (only 50 distinct values) to exercise tie-breaks,
        // plus an adjustment that reshuffles some tokens.
        let logits: Vec<f32> = (0..n).map(|i| ((i * 37) % 50) as f32 * 0.1).collect();
        let bias: Vec<f32> = (0..n)
            .map(|i| if i % 7 == 0 { 0.35 } else { 0.0 })
            .collect();
        let counts: Vec<u32> = (0..n).map(|i| (i % 11 == 0) as u32 * 2).collect();
        let adj = Adjust {
            bias: &bias,
            counts: &counts,
            repeat: 1.3,
            freq: 0.1,
            presence: 0.0,
        };
        for k in [1usize, 2, 40, 999, 2999] {
            let mut fast = Candidates::with_capacity(n);
            fast.fill_top_k(&logits, k, &adj);
            let mut slow = Candidates::with_capacity(n);
            slow.fill(&logits, &adj);
            top_k(&mut slow, k as i32);
            assert_eq!(ids(&fast), ids(&slow), "k = {k}");
            assert!(fast.sorted);
        }
        let mut c = Candidates::with_capacity(4);
        c.fill_top_k(&[1.0, 3.0, 3.0, 2.0], 1, &Adjust::NONE);
        assert_eq!(ids(&c), vec![1]);
    }

    #[test]
    fn top_k_keeps_best_sorted() {
        let mut c = cands(&[0.1, 0.5, 0.3, 0.9, 0.2]);
        top_k(&mut c, 3);
        assert_eq!(ids(&c), vec![3, 1, 2]);
        assert!(c.sorted);
    }

    #[test]
    fn top_k_off_and_oversized() {
        let mut c = cands(&[0.1, 0.5, 0.3]);
        top_k(&mut c, 0);
        assert_eq!(ids(&c), vec![0, 1, 2]);
        assert!(!c.sorted);
        top_k(&mut c, -1);
        assert_eq!(c.data.len(), 3);
        top_k(&mut c, 10);
        assert_eq!(ids(&c), vec![1, 2, 0]);
    }

    #[test]
    fn top_k_ties_prefer_lower_id() {
        let mut c = cands(&[1.0, 2.0, 2.0, 2.0]);
        top_k(&mut c, 2);
        assert_eq!(ids(&c), vec![1, 2]);
    }

    #[test]
    fn top_p_smallest_prefix_reaching_p() {
        // probs 0.5, 0.3, 0.15, 0.05
        let l = logits_of(&[0.15, 0.5, 0.05, 0.3]);
        let mut c = cands(&l);
        top_p(&mut c, 0.7);
        assert_eq!(ids(&c), vec![1, 3]);
        let mut c = cands(&l);
        top_p(&mut c, 0.85);
        assert_eq!(ids(&c), vec![1, 3, 0]);
        let mut c = cands(&l);
        top_p(&mut c, 0.0);
        assert_eq!(ids(&c), vec![1], "p = 0 keeps the best token");
        let mut c = cands(&l);
        top_p(&mut c, 1.0);
        assert_eq!(c.data.len(), 4, "p = 1 is off");
    }

    #[test]
    fn top_p_on_large_unsorted_vocab_matches_full_sort() {
        // A flat-ish distribution so the nucleus outgrows the first chunk.
        let n = 5000;
        let logits: Vec<f32> = (0..n).map(|i| ((i * 7919) % n) as f32 * 1e-3).collect();
        for &p in &[0.01f32, 0.3, 0.9, 0.999] {
            let mut fast = cands(&logits);
            top_p(&mut fast, p);
            let mut full = cands(&logits);
            full.sort();
            top_p(&mut full, p);
            assert_eq!(ids(&fast), ids(&full), "p = {p}");
            assert!(fast.data.len() > 128 || p < 0.1);
        }
    }

    #[test]
    fn min_p_relative_to_best() {
        // probs 0.6, 0.25, 0.1, 0.05; threshold 0.2 * 0.6 = 0.12
        let l = logits_of(&[0.25, 0.05, 0.6, 0.1]);
        let mut c = cands(&l);
        min_p(&mut c, 0.2);
        assert_eq!(ids(&c), vec![0, 2], "order preserved");
        let mut c = cands(&l);
        min_p(&mut c, 0.0);
        assert_eq!(c.data.len(), 4);
        let mut c = cands(&l);
        min_p(&mut c, 1.5);
        assert_eq!(ids(&c), vec![2]);
    }

    #[test]
    fn typical_keeps_tokens_near_entropy() {
        // probs 0.4, 0.3, 0.2, 0.1: entropy ~1.280 nats; surprisals 0.916,
        // 1.204, 1.609, 2.303 sit 0.364, 0.076, 0.329, 1.023 from it, so the
        // typicality order is 1, 2, 0, 3.
        let l = logits_of(&[0.4, 0.3, 0.2, 0.1]);
        let mut c = cands(&l);
        typical(&mut c, 0.45);
        assert_eq!(ids(&c), vec![1, 2]);
        let mut c = cands(&l);
        typical(&mut c, 0.75);
        assert_eq!(ids(&c), vec![1, 2, 0]);
        let mut c = cands(&l);
        typical(&mut c, 0.0);
        assert_eq!(ids(&c), vec![1], "p = 0 keeps the most typical token");
        let mut c = cands(&l);
        typical(&mut c, 1.0);
        assert_eq!(c.data.len(), 4, "p = 1 is off");
    }

    #[test]
    fn typical_can_drop_the_most_likely_token() {
        // One 0.3 token over a flat tail of 700 x 0.001: entropy ~5.2 nats,
        // the tail's surprisal (6.9) is nearer to it than the head's (1.2).
        let mut probs = vec![0.3f32];
        probs.extend_from_slice(&[0.001; 700]);
        let mut c = cands(&logits_of(&probs));
        typical(&mut c, 0.2);
        assert!(!ids(&c).contains(&0));
        assert!((195..=205).contains(&c.data.len()), "{}", c.data.len());
    }

    #[test]
    fn typical_ignores_zero_probability_tokens() {
        let mut c = cands(&[0.0, 0.0, f32::NEG_INFINITY]);
        typical(&mut c, 0.9);
        assert_eq!(sorted_ids(&c), vec![0, 1]);
    }

    #[test]
    fn temperature_scales_logits() {
        let mut c = cands(&[1.0, -2.0]);
        temperature(&mut c, 0.5);
        assert_eq!(c.data[0].logit, 2.0);
        assert_eq!(c.data[1].logit, -4.0);
    }

    #[test]
    fn draw_never_picks_zero_probability() {
        let mut rng = Rng::new(1);
        for _ in 0..1000 {
            let mut c = cands(&[f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY]);
            assert_eq!(draw(&mut c, &mut rng), 1);
        }
    }

    #[test]
    fn argmax_ties_to_lowest_id() {
        let c = cands(&[1.0, 3.0, 3.0, 2.0]);
        assert_eq!(c.argmax(), 1);
        let c = cands(&[f32::NEG_INFINITY; 3]);
        assert_eq!(c.argmax(), 0);
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0], &Adjust::NONE), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NAN], &Adjust::NONE), 0);
        let bias = [0.0, 0.0, 0.0, 1.5];
        let adj = Adjust {
            bias: &bias,
            ..Adjust::NONE
        };
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0], &adj), 3);
    }
}
