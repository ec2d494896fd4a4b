//! Splitting text at the spellings of special tokens before tokenization,
//! as llama.cpp's `tokenizer_st_partition` does: longest spellings first, each
//! one cutting every text fragment left by the longer ones.

use crate::vocab::{attr, Vocab};

/// A piece of the input: raw text (a byte range) or a special token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    Text(usize, usize),
    Token(u32),
}

/// The special tokens in partition order, and a byte trie over their
/// spellings to find which of them occur in a text at all, so that a text is
/// only searched for the few that can cut it (Gemma has over 6000).
pub(crate) struct Specials {
    /// Control, user-defined and unknown tokens, longest text first.
    order: Vec<u32>,
    nodes: Vec<TrieNode>,
}

#[derive(Default)]
struct TrieNode {
    /// (byte, child), sorted by byte.
    edges: Vec<(u8, u32)>,
    /// The index in `order` of the spelling that ends here, if any.
    end: Option<u32>,
}

impl Specials {
    pub fn new(vocab: &Vocab) -> Specials {
        let mut order: Vec<u32> = (0..vocab.len() as u32)
            .filter(|&id| vocab.attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
            .collect();
        // llama.cpp's std::sort leaves equal lengths in unspecified order; ids
        // ascending is the deterministic choice.
        order.sort_by_key(|&id| std::cmp::Reverse(vocab.text(id).len()));
        let mut nodes = vec![TrieNode::default()];
        for (k, &id) in order.iter().enumerate() {
            let mut node = 0usize;
            for &b in vocab.text(id).as_bytes() {
                node = match nodes[node].edges.binary_search_by_key(&b, |e| e.0) {
                    Ok(i) => nodes[node].edges[i].1 as usize,
                    Err(i) => {
                        let child = nodes.len() as u32;
                        nodes[node].edges.insert(i, (b, child));
                        nodes.push(TrieNode::default());
                        child as usize
                    }
                };
            }
            nodes[node].end = Some(k as u32);
        }
        Specials { order, nodes }
    }

    /// Indices into `order` of every special spelling that occurs in `text`.
    fn present(&self, text: &[u8]) -> Vec<u32> {
        let mut found = Vec::new();
        for start in 0..text.len() {
            let mut node = 0usize;
            for &b in &text[start..] {
                match self.nodes[node].edges.binary_search_by_key(&b, |e| e.0) {
                    Ok(i) => node = self.nodes[node].edges[i].1 as usize,
                    Err(_) => break,
                }
                if let Some(k) = self.nodes[node].end {
                    found.push(k);
                }
            }
        }
        found.sort_unstable();
        found.dedup();
        found
    }

    /// Cuts `text` at special spellings. Without `parse_special` only
    /// user-defined tokens cut (control and unknown spellings stay text), as
    /// in llama.cpp and Hugging Face tokenizers. A control or unknown
    /// spelling that overlaps a byte range of `literal` stays text even with
    /// `parse_special`: a rendered prompt's markup is special, the client's
    /// text in it is not.
    pub fn partition(&self, vocab: &Vocab, text: &str, parse_special: bool, literal: &[(usize, usize)]) -> Vec<Fragment> {
        let mut frags = vec![Fragment::Text(0, text.len())];
        if text.is_empty() {
            return Vec::new();
        }
        let bytes = text.as_bytes();
        for k in self.present(bytes) {
            let id = self.order[k as usize];
            let a = vocab.attrs[id as usize];
            if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let needle = vocab.text(id);
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(mut start, end) = f else {
                    next.push(f);
                    continue;
                };
                let guarded = a & (attr::CONTROL | attr::UNKNOWN) != 0;
                let mut from = start;
                loop {
                    let Some(m) = text[from..end].find(needle).map(|m| m + from) else {
                        next.push(Fragment::Text(start, end));
                        break;
                    };
                    if guarded && literal.iter().any(|&(la, lb)| m < lb && la < m + needle.len()) {
                        // Client text: looked past, left in the text fragment.
                        from = m + 1;
                        while !text.is_char_boundary(from) {
                            from += 1;
                        }
                        continue;
                    }
                    let mut left_end = m;
                    if a & attr::LSTRIP != 0 {
                        while left_end > start && bytes[left_end - 1].is_ascii_whitespace_c() {
                            left_end -= 1;
                        }
                    }
                    if left_end > start {
                        next.push(Fragment::Text(start, left_end));
                    }
                    next.push(Fragment::Token(id));
                    let mut right = m + needle.len();
                    if a & attr::RSTRIP != 0 {
                        while right < end && bytes[right].is_ascii_whitespace_c() {
                            right += 1;
                        }
                    }
                    if right >= end {
                        break;
                    }
                    start = right;
                    from = right;
                }
            }
            frags = next;
        }
        frags
    }
}

/// C's `isspace` in the C locale, which llama.cpp uses for lstrip/rstrip
/// (it includes vertical tab, unlike `u8::is_ascii_whitespace`).
trait CSpace {
    fn is_ascii_whitespace_c(&self) -> bool;
}

impl CSpace for u8 {
    fn is_ascii_whitespace_c(&self) -> bool {
        matches!(self, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
    }
}
