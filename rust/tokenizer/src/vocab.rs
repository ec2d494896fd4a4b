//! Token storage: every token's text, score and attributes in flat arenas, and
//! a string-to-id index over the texts. A 262k-token vocabulary is a few
//! allocations rather than a quarter-million.

use std::hash::{BuildHasherDefault, Hasher};

/// llama.cpp's token attributes (`llama_token_attr`), as bit flags: a token
/// can be, say, both control and unused.
pub(crate) mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    pub const LSTRIP: u16 = 1 << 7;
    pub const RSTRIP: u16 = 1 << 8;
}

/// What a token is, from `tokenizer.ggml.token_type`, after llama.cpp's own
/// corrections (e.g. `<|im_end|>` is made a control token even when a
/// converter wrote it as normal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenType {
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    pub(crate) fn from_attr(a: u16) -> TokenType {
        if a & attr::CONTROL != 0 {
            TokenType::Control
        } else if a & attr::USER_DEFINED != 0 {
            TokenType::UserDefined
        } else if a & attr::UNKNOWN != 0 {
            TokenType::Unknown
        } else if a & attr::BYTE != 0 {
            TokenType::Byte
        } else if a & attr::UNUSED != 0 {
            TokenType::Unused
        } else if a & attr::NORMAL != 0 {
            TokenType::Normal
        } else {
            TokenType::Undefined
        }
    }

    /// The attribute for a GGUF token type number (llama.cpp's `LLAMA_TOKEN_TYPE_*`).
    pub(crate) fn attr_of_gguf_type(t: i64) -> u16 {
        match t {
            1 => attr::NORMAL,
            2 => attr::UNKNOWN,
            3 => attr::CONTROL,
            4 => attr::USER_DEFINED,
            5 => attr::UNUSED,
            6 => attr::BYTE,
            _ => 0,
        }
    }
}

/// FxHash: the vocabulary and the merge table are the model's own, not an
/// attacker's, so a fast non-keyed hash is the right trade.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

const FX_K: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(FX_K);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().unwrap()));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut buf = [0u8; 8];
            buf[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(buf));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

pub(crate) type FxBuild = BuildHasherDefault<FxHasher>;
pub(crate) type FxHashMap<K, V> = std::collections::HashMap<K, V, FxBuild>;

fn hash_str(s: &[u8]) -> u64 {
    let mut h = FxHasher(s.len() as u64);
    h.write(s);
    // FxHash leaves similar strings in nearby buckets; murmur3's finaliser
    // spreads them before the table takes the top bits.
    let mut x = h.finish();
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Texts of all tokens back to back, with an open-addressing index from text
/// to id that points into the same arena instead of owning keys.
pub(crate) struct Vocab {
    arena: String,
    /// `offsets[i]..offsets[i + 1]` is token i's text.
    offsets: Vec<u32>,
    /// `hash >> 32 << 32 | id`, so most probes settle without touching the arena.
    slots: Vec<u64>,
    shift: u32,
    pub scores: Vec<f32>,
    pub attrs: Vec<u16>,
}

const EMPTY: u64 = u64::MAX;
const TAG: u64 = !0xFFFF_FFFF;

impl Vocab {
    /// Builds the vocabulary; `Err((text, first, second))` on a repeated text.
    pub fn new<'a>(
        texts: impl ExactSizeIterator<Item = &'a str>,
        scores: Vec<f32>,
        attrs: Vec<u16>,
    ) -> Result<Vocab, (String, u32, u32)> {
        let n = texts.len();
        let mut arena = String::new();
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0u32);
        for (i, t) in texts.enumerate() {
            if t.is_empty() {
                // llama.cpp's placeholder, so the token stays addressable.
                arena.push_str(&format!("[EMPTY_{i}]"));
            } else {
                arena.push_str(t);
            }
            offsets.push(arena.len() as u32);
        }
        let bits = ((n.max(1) * 2).next_power_of_two().trailing_zeros()).max(4);
        let mut v = Vocab { arena, offsets, slots: vec![EMPTY; 1 << bits], shift: 64 - bits, scores, attrs };
        let mask = v.slots.len() - 1;
        for id in 0..n as u32 {
            let text = v.text(id).as_bytes();
            let h = hash_str(text);
            let mut slot = (h >> v.shift) as usize;
            loop {
                let cur = v.slots[slot];
                if cur == EMPTY {
                    v.slots[slot] = (h & TAG) | id as u64;
                    break;
                }
                if cur & TAG == h & TAG && v.text(cur as u32).as_bytes() == text {
                    return Err((v.text(id).to_owned(), cur as u32, id));
                }
                slot = (slot + 1) & mask;
            }
        }
        Ok(v)
    }

    /// Bytes of all token texts together.
    pub fn text_bytes(&self) -> usize {
        self.arena.len()
    }

    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    #[inline]
    pub fn text(&self, id: u32) -> &str {
        let (a, b) = (self.offsets[id as usize] as usize, self.offsets[id as usize + 1] as usize);
        &self.arena[a..b]
    }

    /// The id whose text is exactly `s`.
    #[inline]
    pub fn find(&self, s: &str) -> Option<u32> {
        self.find_bytes(s.as_bytes())
    }

    pub fn find_bytes(&self, s: &[u8]) -> Option<u32> {
        let h = hash_str(s);
        let mut slot = (h >> self.shift) as usize;
        loop {
            let cur = self.slots[slot];
            if cur == EMPTY {
                return None;
            }
            if cur & TAG == h & TAG && self.text(cur as u32).as_bytes() == s {
                return Some(cur as u32);
            }
            slot = (slot + 1) & (self.slots.len() - 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_finds_every_token() {
        let texts: Vec<String> = (0..5000).map(|i| format!("t{i}")).collect();
        let n = texts.len();
        let v = Vocab::new(texts.iter().map(|s| s.as_str()), vec![0.0; n], vec![attr::NORMAL; n]).unwrap();
        for (i, t) in texts.iter().enumerate() {
            assert_eq!(v.find(t), Some(i as u32));
        }
        assert_eq!(v.find("nope"), None);
    }

    #[test]
    fn duplicates_are_refused() {
        let texts = ["a", "b", "a"];
        let err = Vocab::new(texts.iter().copied(), vec![0.0; 3], vec![0; 3]).err().unwrap();
        assert_eq!(err, ("a".to_string(), 0, 2));
    }
}
