//! Token ids back to text: each token's bytes (byte-level BPE reversed, `▁` to
//! space, `<0xXX>` to its byte), llama.cpp's detokenize clean-up, and a
//! streaming decoder that only ever hands out whole UTF-8 characters.

use crate::vocab::attr;
use crate::{Tokenizer, TokenizerKind};

/// The bytes llama.cpp's `token_to_piece(id, special = true)` gives, which is
/// what it caches per token.
pub(crate) fn piece_bytes(kind: TokenizerKind, text: &str, a: u16, out: &mut Vec<u8>) {
    if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
        out.extend_from_slice(text.as_bytes());
    } else if a & attr::NORMAL != 0 {
        match kind {
            TokenizerKind::Spm | TokenizerKind::SpmBpe => {
                if text.contains('\u{2581}') {
                    out.extend_from_slice(text.replace('\u{2581}', " ").as_bytes());
                } else {
                    out.extend_from_slice(text.as_bytes());
                }
            }
            TokenizerKind::Bpe => {
                for c in text.chars() {
                    match crate::unicode::char_to_byte(c) {
                        Some(b) => out.push(b),
                        None => {
                            // llama.cpp's marker for a character outside the
                            // byte table, kept byte for byte.
                            out.extend_from_slice(b"[UNK_BYTE_0x");
                            let mut buf = [0u8; 4];
                            for b in c.encode_utf8(&mut buf).bytes() {
                                out.extend_from_slice(format!("{b:02x}").as_bytes());
                            }
                            out.extend_from_slice(text.as_bytes());
                            out.push(b']');
                        }
                    }
                }
            }
        }
    } else if a & attr::BYTE != 0 {
        // `<0xXX>`: strtol of the two hex digits, 0 when they are not hex.
        let hex = text.get(3..5).unwrap_or("");
        out.push(u8::from_str_radix(hex, 16).unwrap_or(0));
    }
    // Undefined and unused tokens render as nothing.
}

/// llama.cpp's `clean_spaces` passes: drop the space before `?!.,`, fold
/// ` ' ` to `'`, and join ` 's`, ` 'm`, ` 're`, ` 've` to the word before.
/// Ported index for index, in place, to keep its edge cases.
pub(crate) fn clean_spaces(text: &mut Vec<u8>) {
    let t = text;
    // First pass: " ?", " !", " .", " ,".
    let total1 = t.len();
    let mut total = usize::from(total1 > 0);
    for i in 1..total1 {
        let x = t[i];
        if t[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        t[total] = x;
        total += 1;
    }
    t.truncate(total);

    // Second pass: a lone apostrophe between spaces.
    let total2 = t.len();
    let mut total = usize::from(total2 > 0);
    let mut i = 1;
    while i < total2 {
        let x = t[i];
        if x == b'\'' && i + 1 < total2 && t[i - 1] == b' ' && t[i + 1] == b' ' {
            total -= 1;
            i += 1;
            t[i] = 0;
        }
        t[total] = x;
        total += 1;
        i += 1;
    }
    t.truncate(total);

    // Third pass: contractions.
    let total3 = t.len();
    let mut total = usize::from(total3 > 0);
    for i in 1..total3 {
        let x = t[i];
        if t[i - 1] == b' ' && x == b'\'' && i + 1 < total3 {
            let x1 = t[i + 1];
            if x1 == b't' || x1 == b'd' {
                // " 't", " 'd" keep their space
            } else if x1 == b's' || x1 == b'm' {
                total -= 1;
            } else if i + 2 < total3 {
                let x2 = t[i + 2];
                if (x1 == b'r' || x1 == b'v') && x2 == b'e' {
                    total -= 1;
                }
            }
        }
        t[total] = x;
        total += 1;
    }
    t.truncate(total);
}

/// Turns a stream of token ids into text, holding back the bytes of a
/// character split across tokens until it is whole. Invalid bytes come out
/// as U+FFFD as soon as they are known to be invalid; `flush` gives out
/// whatever is left at the end of the stream.
#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    special: bool,
}

impl StreamDecoder {
    /// `special` renders control tokens by their text (as `token_to_piece`'s flag).
    pub fn new(special: bool) -> StreamDecoder {
        StreamDecoder { pending: Vec::new(), special }
    }

    /// Adds one token; returns the text that is now complete (maybe empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        let piece = tok.token_to_piece(id, self.special);
        self.push_bytes(piece)
    }

    /// Adds raw bytes; returns the text that is now complete.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut pos = 0;
        while pos < self.pending.len() {
            match std::str::from_utf8(&self.pending[pos..]) {
                Ok(s) => {
                    out.push_str(s);
                    pos = self.pending.len();
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[pos..pos + valid]).unwrap());
                    pos += valid;
                    match e.error_len() {
                        // A character cut short at the end: wait for the rest.
                        None => break,
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            pos += n;
                        }
                    }
                }
            }
        }
        self.pending.drain(..pos);
        out
    }

    /// Ends the stream: any held-back bytes come out, lossily.
    pub fn flush(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    /// Bytes held back, waiting for the rest of their character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(s: &str) -> String {
        let mut v = s.as_bytes().to_vec();
        clean_spaces(&mut v);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn clean_spaces_matches_llama_cpp() {
        assert_eq!(clean("Hello , world !"), "Hello, world!");
        assert_eq!(clean("it ' s"), "it's");
        assert_eq!(clean("he 's here and they 're"), "he's here and they're");
        assert_eq!(clean("don 't"), "don 't");
        assert_eq!(clean(""), "");
    }

    #[test]
    fn stream_holds_back_split_characters() {
        let mut d = StreamDecoder::new(false);
        let euro = "€".as_bytes();
        assert_eq!(d.push_bytes(b"a"), "a");
        assert_eq!(d.push_bytes(&euro[..1]), "");
        assert_eq!(d.push_bytes(&euro[1..2]), "");
        assert_eq!(d.pending().len(), 2);
        assert_eq!(d.push_bytes(&euro[2..]), "€");
        assert_eq!(d.push_bytes(b"\xffb"), "\u{FFFD}b");
        assert_eq!(d.push_bytes(&euro[..2]), "");
        assert_eq!(d.flush(), "\u{FFFD}");
        assert_eq!(d.flush(), "");
    }
}
