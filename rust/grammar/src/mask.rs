//! Token masks: which tokens of a vocabulary a state can read whole.
//!
//! The vocabulary is indexed once, its tokens sorted by their bytes with the
//! length each shares with the one before. A mask walks that list with one
//! state per depth, so tokens sharing a prefix share its transitions, and a
//! prefix the automaton refuses skips every token that starts with it (as a
//! walk of a trie would, without the pointers).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::automaton::{StateId, DEAD};
use crate::GrammarError;

/// A vocabulary's tokens as bytes, sorted for mask walks.
pub struct TokenIndex {
    id: u64,
    n_vocab: usize,
    /// Token ids in byte order.
    order: Vec<u32>,
    /// Bytes of `order[i]` are `bytes[offsets[i]..offsets[i + 1]]`.
    offsets: Vec<u32>,
    bytes: Vec<u8>,
    /// Bytes `order[i]` shares with `order[i - 1]` (0 for the first).
    shared: Vec<u16>,
    longest: usize,
}

static NEXT_INDEX_ID: AtomicU64 = AtomicU64::new(0);

impl TokenIndex {
    /// Indexes `tokens` as (id, bytes); tokens with no bytes (control
    /// tokens) are left out: no grammar can read them.
    pub fn new<'a>(n_vocab: usize, tokens: impl IntoIterator<Item = (u32, &'a [u8])>) -> TokenIndex {
        let mut toks: Vec<(u32, &[u8])> = tokens.into_iter().filter(|(id, b)| !b.is_empty() && (*id as usize) < n_vocab).collect();
        toks.sort_unstable_by(|a, b| a.1.cmp(b.1).then(a.0.cmp(&b.0)));
        let mut order = Vec::with_capacity(toks.len());
        let mut offsets = Vec::with_capacity(toks.len() + 1);
        let mut bytes = Vec::new();
        let mut shared = Vec::with_capacity(toks.len());
        let mut prev: &[u8] = &[];
        let mut longest = 0;
        offsets.push(0);
        for (id, b) in toks {
            order.push(id);
            bytes.extend_from_slice(b);
            offsets.push(bytes.len() as u32);
            let common = prev.iter().zip(b).take_while(|(x, y)| x == y).count();
            shared.push(common.min(u16::MAX as usize) as u16);
            longest = longest.max(b.len());
            prev = b;
        }
        TokenIndex { id: NEXT_INDEX_ID.fetch_add(1, Ordering::Relaxed), n_vocab, order, offsets, bytes, shared, longest }
    }

    /// Distinguishes indexes in the automata's mask caches.
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    fn token(&self, i: usize) -> &[u8] {
        &self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }
}

/// The tokens allowed in one state, as a bit per vocabulary entry.
#[derive(Clone, Debug)]
pub struct TokenMask {
    bits: Vec<u64>,
    count: usize,
}

impl TokenMask {
    pub fn allows(&self, id: u32) -> bool {
        self.bits.get(id as usize / 64).is_some_and(|w| w >> (id % 64) & 1 == 1)
    }

    /// Memory the mask holds.
    pub fn bytes(&self) -> usize {
        8 * self.bits.len()
    }

    /// How many tokens are allowed.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The allowed ids in increasing order.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.bits.iter().enumerate().flat_map(|(w, &bits)| {
            let mut b = bits;
            std::iter::from_fn(move || {
                if b == 0 {
                    return None;
                }
                let t = b.trailing_zeros();
                b &= b - 1;
                Some(w as u32 * 64 + t)
            })
        })
    }

    /// Sets every refused entry of `logits` to minus infinity.
    pub fn apply(&self, logits: &mut [f32]) {
        if self.count < logits.len() / 8 {
            // Few allowed: keep them aside and refuse the row wholesale.
            let kept: Vec<(u32, f32)> = self.ids().map(|id| (id, logits[id as usize])).collect();
            logits.fill(f32::NEG_INFINITY);
            for (id, l) in kept {
                logits[id as usize] = l;
            }
            return;
        }
        for (w, chunk) in logits.chunks_mut(64).enumerate() {
            let bits = self.bits[w];
            if bits == u64::MAX {
                continue;
            }
            for (i, l) in chunk.iter_mut().enumerate() {
                if bits >> i & 1 == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// The mask of `state` over `index`, stepping the automaton through `step`.
pub(crate) fn compute(
    index: &TokenIndex,
    state: StateId,
    mut step: impl FnMut(StateId, u8) -> Result<StateId, GrammarError>,
) -> Result<TokenMask, GrammarError> {
    let mut bits = vec![0u64; index.n_vocab.div_ceil(64)];
    let mut count = 0;
    // states[d]: the state after the current token's first d bytes.
    let mut states = vec![DEAD; index.longest + 1];
    states[0] = state;
    let n = index.order.len();
    let mut i = 0;
    while i < n {
        let tok = index.token(i);
        let mut d = index.shared[i] as usize;
        while d < tok.len() {
            let s = step(states[d], tok[d])?;
            if s == DEAD {
                break;
            }
            states[d + 1] = s;
            d += 1;
        }
        if d == tok.len() {
            let id = index.order[i] as usize;
            bits[id / 64] |= 1 << (id % 64);
            count += 1;
            i += 1;
        } else {
            // tok[..=d] is refused: so is every following token that starts with it.
            i += 1;
            while i < n && index.shared[i] as usize > d {
                i += 1;
            }
        }
    }
    Ok(TokenMask { bits, count })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Automaton;

    #[test]
    fn mask_matches_token_by_token_check() {
        let vocab: Vec<&[u8]> = vec![b"a", b"ab", b"abc", b"b", b"\"", b"\"a", b"a\"", b"", b"x", b"ab\"", b"{", "é".as_bytes(), &"é".as_bytes()[..1]];
        let index = TokenIndex::new(vocab.len(), vocab.iter().enumerate().map(|(i, b)| (i as u32, *b)));
        let g = Automaton::from_gbnf(r#"root ::= "\"" [a-bé]* "\"""#).unwrap();
        let mut states = vec![g.start()];
        states.push(g.advance(g.start(), b"\"").unwrap());
        states.push(g.advance(g.start(), b"\"ab").unwrap());
        states.push(g.advance(g.start(), &"\"é".as_bytes()[..2]).unwrap());
        for s in states {
            let m = g.mask(s, &index).unwrap();
            for (id, b) in vocab.iter().enumerate() {
                let want = !b.is_empty() && g.advance(s, b).unwrap() != DEAD;
                assert_eq!(m.allows(id as u32), want, "state {s} token {:?}", String::from_utf8_lossy(b));
            }
            assert_eq!(m.count(), m.ids().count());
        }
    }

    #[test]
    fn sparse_and_dense_masks_apply_alike() {
        let vocab: Vec<Vec<u8>> = (0..1000u32).map(|i| format!("{}", i % 10).into_bytes()).collect();
        let index = TokenIndex::new(1000, vocab.iter().enumerate().map(|(i, b)| (i as u32, b.as_slice())));
        for g in [r#"root ::= "7""#, r#"root ::= [0-8]"#] {
            let a = Automaton::from_gbnf(g).unwrap();
            let m = a.mask(a.start(), &index).unwrap();
            let mut logits: Vec<f32> = (0..1000).map(|i| i as f32).collect();
            m.apply(&mut logits);
            for (i, l) in logits.iter().enumerate() {
                assert_eq!(l.is_finite(), m.allows(i as u32), "{g} token {i}");
                if l.is_finite() {
                    assert_eq!(*l, i as f32);
                }
            }
        }
    }

    #[test]
    fn apply_refuses_masked_logits() {
        let vocab: Vec<&[u8]> = (0..130u8).map(|i| if i % 2 == 0 { &b"a"[..] } else { &b"b"[..] }).collect();
        let index = TokenIndex::new(130, vocab.iter().enumerate().map(|(i, b)| (i as u32, *b)));
        let g = Automaton::from_gbnf(r#"root ::= "a""#).unwrap();
        let m = g.mask(g.start(), &index).unwrap();
        let mut logits = vec![1.0f32; 130];
        m.apply(&mut logits);
        for (i, l) in logits.iter().enumerate() {
            assert_eq!(l.is_finite(), i % 2 == 0);
        }
        assert_eq!(m.count(), 65);
    }
}
