//! BPE over one pre-tokenized word: the word's bytes become GPT-2 characters
//! (byte-level BPE), or the word's own UTF-8 characters are the symbols
//! (Gemma 4's SentencePiece-style BPE), then adjacent pairs merge by rank
//! (lowest first, leftmost on ties) as llama.cpp's `llm_tokenizer_bpe_session`
//! does.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::vocab::{FxHashMap, Vocab};

/// No token: a piece that is neither a vocabulary token nor a merge part.
pub(crate) const NONE: u32 = u32::MAX;

/// The merge table, keyed by the ids of the two parts. Parts or results that
/// are not vocabulary tokens get ids past the vocabulary, so that merges
/// through them still happen exactly as llama.cpp's string-keyed table would.
pub(crate) struct Merges {
    /// (left << 32 | right) -> (rank, id of the merged piece)
    pairs: FxHashMap<u64, (u32, u32)>,
    /// Vocabulary id of each byte's GPT-2 character, or `NONE`.
    byte_ids: [u32; 256],
    /// Vocabulary id of each single-byte string, for pieces that are not tokens.
    raw_byte_ids: [u32; 256],
    /// The GPT-2 character of each byte, UTF-8 encoded.
    byte_chars: [([u8; 4], u8); 256],
    pub ignore_merges: bool,
    /// Symbols are UTF-8 characters, not byte-level characters; a piece that
    /// is no token falls back to the `<0xXX>` tokens of its bytes.
    chars: Option<CharSymbols>,
}

/// What character-level BPE needs beyond the merge table.
struct CharSymbols {
    /// Ids (vocabulary or merge-part) of the single characters merges start from.
    ids: FxHashMap<char, u32>,
    /// The `<0xXX>` token of each byte, or `NONE`.
    byte_tokens: [u32; 256],
}

impl Merges {
    /// Builds the table from `tokenizer.ggml.merges` entries already split
    /// into their two parts; a repeated pair keeps its first (lowest) rank.
    pub fn new<'a>(
        vocab: &Vocab,
        merges: impl Iterator<Item = (&'a str, &'a str)>,
        ignore_merges: bool,
        byte_level: bool,
    ) -> Merges {
        let n_vocab = vocab.len() as u32;
        let mut extra: FxHashMap<String, u32> = FxHashMap::default();
        let id_of = |s: &str, extra: &mut FxHashMap<String, u32>| -> u32 {
            if let Some(id) = vocab.find(s) {
                return id;
            }
            let next = n_vocab + extra.len() as u32;
            *extra.entry(s.to_owned()).or_insert(next)
        };
        let mut pairs: FxHashMap<u64, (u32, u32)> = FxHashMap::default();
        pairs.reserve(merges.size_hint().0);
        let mut joined = String::new();
        for (rank, (a, b)) in merges.enumerate() {
            let l = id_of(a, &mut extra);
            let r = id_of(b, &mut extra);
            joined.clear();
            joined.push_str(a);
            joined.push_str(b);
            let m = id_of(&joined, &mut extra);
            pairs.entry((l as u64) << 32 | r as u64).or_insert((rank as u32, m));
        }
        let chars = crate::unicode::byte_to_char_table();
        let mut byte_ids = [NONE; 256];
        let mut raw_byte_ids = [NONE; 256];
        let mut byte_chars = [([0u8; 4], 0u8); 256];
        for b in 0..256usize {
            let mut buf = [0u8; 4];
            let s = chars[b].encode_utf8(&mut buf);
            byte_ids[b] = vocab.find(s).or_else(|| extra.get(s).copied()).unwrap_or(NONE);
            byte_chars[b] = (buf, chars[b].len_utf8() as u8);
            if b < 0x80 {
                raw_byte_ids[b] = vocab.find(std::str::from_utf8(&[b as u8]).unwrap()).unwrap_or(NONE);
            }
        }
        let chars = (!byte_level).then(|| {
            let mut ids: FxHashMap<char, u32> = FxHashMap::default();
            for (text, &id) in extra.iter() {
                let mut cs = text.chars();
                if let (Some(c), None) = (cs.next(), cs.next()) {
                    ids.insert(c, id);
                }
            }
            for id in 0..n_vocab {
                let mut cs = vocab.text(id).chars();
                if let (Some(c), None) = (cs.next(), cs.next()) {
                    ids.entry(c).or_insert(id);
                }
            }
            let mut byte_tokens = [NONE; 256];
            for (b, slot) in byte_tokens.iter_mut().enumerate() {
                *slot = vocab.find(&format!("<0x{b:02X}>")).unwrap_or(NONE);
            }
            CharSymbols { ids, byte_tokens }
        });
        Merges { pairs, byte_ids, raw_byte_ids, byte_chars, ignore_merges, chars }
    }

    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// The GPT-2-character spelling of `word`'s bytes.
    pub fn encode_bytes(&self, word: &[u8], out: &mut String) {
        out.clear();
        for &b in word {
            let (buf, n) = &self.byte_chars[b as usize];
            out.push_str(std::str::from_utf8(&buf[..*n as usize]).unwrap());
        }
    }

    /// Tokenizes one pre-tokenized word (raw bytes), appending ids to `out`.
    pub fn tokenize_word(&self, vocab: &Vocab, word: &[u8], scratch: &mut Scratch, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        if self.ignore_merges {
            self.encode_bytes(word, &mut scratch.encoded);
            if let Some(id) = vocab.find(&scratch.encoded) {
                out.push(id);
                return;
            }
        }
        let syms = &mut scratch.syms;
        syms.clear();
        match &self.chars {
            None => {
                for (i, &b) in word.iter().enumerate() {
                    syms.push(Sym {
                        id: self.byte_ids[b as usize],
                        start: i as u32,
                        len: 1,
                        prev: i as i32 - 1,
                        next: i as i32 + 1,
                    });
                }
            }
            Some(cs) => {
                let text = std::str::from_utf8(word).expect("words are split from a str");
                // A word of newlines alone is its own token where it is one
                // (llama.cpp's Gemma 4 rule).
                if text.bytes().all(|b| b == b'\n') {
                    if let Some(id) = vocab.find(text) {
                        out.push(id);
                        return;
                    }
                }
                for (i, (at, c)) in text.char_indices().enumerate() {
                    let id = cs.ids.get(&c).copied().unwrap_or(NONE);
                    syms.push(Sym {
                        id,
                        start: at as u32,
                        len: c.len_utf8() as u32,
                        prev: i as i32 - 1,
                        next: i as i32 + 1,
                    });
                }
            }
        }
        if let Some(last) = syms.last_mut() {
            last.next = -1;
        }
        let heap = &mut scratch.heap;
        heap.clear();
        let push = |heap: &mut BinaryHeap<Reverse<(u32, u32, u32, u32)>>, syms: &[Sym], l: i32, r: i32| {
            if l < 0 || r < 0 {
                return;
            }
            let (ls, rs) = (&syms[l as usize], &syms[r as usize]);
            if ls.id == NONE || rs.id == NONE {
                return;
            }
            if let Some(&(rank, _)) = self.pairs.get(&((ls.id as u64) << 32 | rs.id as u64)) {
                heap.push(Reverse((rank, l as u32, r as u32, ls.len + rs.len)));
            }
        };
        for i in 1..syms.len() {
            push(heap, syms, i as i32 - 1, i as i32);
        }
        while let Some(Reverse((_, l, r, size))) = heap.pop() {
            let (l, r) = (l as usize, r as usize);
            // Stale entries: either side merged away, or grown since the push.
            if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != size {
                continue;
            }
            let (_, merged) = self.pairs[&((syms[l].id as u64) << 32 | syms[r].id as u64)];
            syms[l].id = merged;
            syms[l].len += syms[r].len;
            syms[r].len = 0;
            syms[l].next = syms[r].next;
            let after = syms[r].next;
            if after >= 0 {
                syms[after as usize].prev = l as i32;
            }
            push(heap, syms, syms[l].prev, l as i32);
            push(heap, syms, l as i32, syms[l].next);
        }
        let n_vocab = vocab.len() as u32;
        let mut i = 0i32;
        while i >= 0 {
            let s = &syms[i as usize];
            if s.id < n_vocab {
                out.push(s.id);
            } else if let Some(cs) = &self.chars {
                // Not a token: each of its bytes' `<0xXX>` tokens, where the
                // vocabulary has them.
                for &b in &word[s.start as usize..(s.start + s.len) as usize] {
                    if cs.byte_tokens[b as usize] != NONE {
                        out.push(cs.byte_tokens[b as usize]);
                    }
                }
            } else {
                // Not a token: llama.cpp looks up each byte of the piece's
                // GPT-2 spelling as a one-byte token, so only printable ASCII
                // survives and everything else is dropped.
                for &b in &word[s.start as usize..(s.start + s.len) as usize] {
                    let (buf, n) = &self.byte_chars[b as usize];
                    for &eb in &buf[..*n as usize] {
                        if eb < 0x80 && self.raw_byte_ids[eb as usize] != NONE {
                            out.push(self.raw_byte_ids[eb as usize]);
                        }
                    }
                }
            }
            i = s.next;
        }
    }
}

#[derive(Clone, Copy)]
pub(crate) struct Sym {
    id: u32,
    /// Byte range in the word (a byte-level symbol is one byte, a
    /// character-level one its character's).
    start: u32,
    len: u32,
    prev: i32,
    next: i32,
}

/// Buffers reused across words of one call.
#[derive(Default)]
pub(crate) struct Scratch {
    syms: Vec<Sym>,
    heap: BinaryHeap<Reverse<(u32, u32, u32, u32)>>,
    pub encoded: String,
}
