//! SentencePiece-style tokenization of one text fragment, as llama.cpp's
//! `llm_tokenizer_spm_session`: characters merge pairwise, highest-scoring
//! resulting token first, with `<0xXX>` byte tokens for what is left over.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::vocab::Vocab;

struct Bigram {
    score: f32,
    left: u32,
    right: u32,
    size: u32,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Highest score first; on a tie, the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}

#[derive(Clone, Copy)]
struct Sym {
    start: u32,
    len: u32,
    prev: i32,
    next: i32,
}

/// Byte-fallback ids for each byte: `<0xXX>`, else the one-byte token, else unknown.
pub(crate) fn byte_fallback_ids(vocab: &Vocab, unk: Option<u32>) -> [Option<u32>; 256] {
    let mut ids = [None; 256];
    for (b, slot) in ids.iter_mut().enumerate() {
        *slot = vocab
            .find(&format!("<0x{b:02X}>"))
            .or_else(|| if b < 0x80 { vocab.find(std::str::from_utf8(&[b as u8]).unwrap()) } else { None })
            .or(unk);
    }
    ids
}

/// Tokenizes `text` (spaces already escaped to U+2581), appending to `out`.
pub(crate) fn tokenize(vocab: &Vocab, byte_ids: &[Option<u32>; 256], text: &str, out: &mut Vec<u32>) {
    let mut syms: Vec<Sym> = Vec::with_capacity(text.len());
    for (i, c) in text.char_indices() {
        let n = syms.len() as i32;
        syms.push(Sym { start: i as u32, len: c.len_utf8() as u32, prev: n - 1, next: n + 1 });
    }
    if let Some(last) = syms.last_mut() {
        last.next = -1;
    }
    let mut heap = BinaryHeap::new();
    let try_add = |heap: &mut BinaryHeap<Bigram>, syms: &[Sym], l: i32, r: i32| {
        if l < 0 || r < 0 {
            return;
        }
        let (ls, rs) = (syms[l as usize], syms[r as usize]);
        // Live neighbours are contiguous, so their concatenation is a slice.
        let piece = &text[ls.start as usize..(rs.start + rs.len) as usize];
        if let Some(id) = vocab.find(piece) {
            heap.push(Bigram {
                score: vocab.scores[id as usize],
                left: l as u32,
                right: r as u32,
                size: piece.len() as u32,
            });
        }
    };
    for i in 1..syms.len() {
        try_add(&mut heap, &syms, i as i32 - 1, i as i32);
    }
    while let Some(b) = heap.pop() {
        let (l, r) = (b.left as usize, b.right as usize);
        if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != b.size {
            continue;
        }
        syms[l].len += syms[r].len;
        syms[r].len = 0;
        syms[l].next = syms[r].next;
        let after = syms[r].next;
        if after >= 0 {
            syms[after as usize].prev = l as i32;
        }
        try_add(&mut heap, &syms, syms[l].prev, l as i32);
        try_add(&mut heap, &syms, l as i32, syms[l].next);
    }
    let mut i = if syms.is_empty() { -1 } else { 0 };
    while i >= 0 {
        let s = syms[i as usize];
        let piece = &text[s.start as usize..(s.start + s.len) as usize];
        match vocab.find(piece) {
            Some(id) => out.push(id),
            // Every merged piece is a token, so only single characters get
            // here; they fall back to their bytes.
            None => out.extend(piece.bytes().filter_map(|b| byte_ids[b as usize])),
        }
        i = s.next;
    }
}
