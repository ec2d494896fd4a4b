//! Codepoint classes as llama.cpp's pre-tokenizers see them (letter, number,
//! punctuation, mark, symbol, whitespace) and GPT-2's byte-to-character table.
//! Category ranges come from regex-syntax's Unicode tables, built once.

use std::sync::OnceLock;

/// The general-category group of a codepoint, the granularity llama.cpp uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cat {
    Number,
    Letter,
    Punct,
    Mark,
    Symbol,
    /// Separators, controls, format characters, unassigned: llama.cpp folds
    /// them all into one "other" class for its regexes.
    Other,
}

/// Flags of one position in a fragment. `defined` is false only past a
/// fragment's end, which llama.cpp's hand-written splitters treat as "no
/// character" rather than as some category.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Flags {
    pub letter: bool,
    pub number: bool,
    pub mark: bool,
    pub whitespace: bool,
    pub defined: bool,
}

struct Tables {
    /// Sorted, disjoint (start, end inclusive, category) for non-ASCII codepoints.
    ranges: Vec<(u32, u32, Cat)>,
    ascii: [Cat; 128],
}

fn class_ranges(pattern: &str) -> Vec<(u32, u32)> {
    use regex_syntax::hir::{Class, HirKind};
    let hir = regex_syntax::Parser::new().parse(pattern).expect("built-in Unicode class parses");
    match hir.kind() {
        HirKind::Class(Class::Unicode(cls)) => {
            cls.ranges().iter().map(|r| (r.start() as u32, r.end() as u32)).collect()
        }
        other => unreachable!("{pattern} parsed to {other:?}"),
    }
}

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        let mut ranges = Vec::new();
        for (pat, cat) in [
            (r"\p{N}", Cat::Number),
            (r"\p{L}", Cat::Letter),
            (r"\p{P}", Cat::Punct),
            (r"\p{M}", Cat::Mark),
            (r"\p{S}", Cat::Symbol),
        ] {
            ranges.extend(class_ranges(pat).into_iter().map(|(a, b)| (a, b, cat)));
        }
        ranges.sort_unstable_by_key(|r| r.0);
        let mut ascii = [Cat::Other; 128];
        for &(a, b, cat) in &ranges {
            for c in a..=b.min(127) {
                ascii[c as usize] = cat;
            }
        }
        Tables { ranges, ascii }
    })
}

pub(crate) fn category(c: char) -> Cat {
    let t = tables();
    let cp = c as u32;
    if cp < 128 {
        return t.ascii[cp as usize];
    }
    let i = t.ranges.partition_point(|r| r.0 <= cp);
    if i > 0 {
        let (_, end, cat) = t.ranges[i - 1];
        if cp <= end {
            return cat;
        }
    }
    Cat::Other
}

/// Unicode White_Space, the set llama.cpp's data tables hold.
pub(crate) fn is_whitespace(c: char) -> bool {
    c.is_whitespace()
}

pub(crate) fn flags(c: char) -> Flags {
    let cat = category(c);
    Flags {
        letter: cat == Cat::Letter,
        number: cat == Cat::Number,
        mark: cat == Cat::Mark,
        whitespace: is_whitespace(c),
        defined: true,
    }
}

fn is_printable_byte(b: u32) -> bool {
    (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
}

/// GPT-2's reversible map from bytes to printable characters: printable
/// Latin-1 bytes map to themselves, the other 68 to U+0100 upwards in order.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 0x100u32;
    for b in 0..256u32 {
        table[b as usize] = if is_printable_byte(b) {
            char::from_u32(b).unwrap()
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap()
        };
    }
    table
}

/// The inverse of [`byte_to_char_table`]; `None` for characters outside it.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    static HIGH: OnceLock<[u8; 68]> = OnceLock::new();
    let cp = c as u32;
    if cp < 0x100 {
        return is_printable_byte(cp).then_some(cp as u8);
    }
    if cp >= 0x100 + 68 {
        return None;
    }
    let high = HIGH.get_or_init(|| {
        let mut high = [0u8; 68];
        let mut n = 0;
        for b in 0..256u32 {
            if !is_printable_byte(b) {
                high[n] = b as u8;
                n += 1;
            }
        }
        high
    });
    Some(high[(cp - 0x100) as usize])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_round_trips() {
        let t = byte_to_char_table();
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(t[b as usize]), Some(b));
        }
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
    }

    #[test]
    fn categories() {
        assert_eq!(category('a'), Cat::Letter);
        assert_eq!(category('日'), Cat::Letter);
        assert_eq!(category('7'), Cat::Number);
        assert_eq!(category('²'), Cat::Number);
        assert_eq!(category('$'), Cat::Symbol);
        assert_eq!(category('!'), Cat::Punct);
        assert_eq!(category('\u{301}'), Cat::Mark);
        assert_eq!(category('\u{200B}'), Cat::Other);
        assert!(is_whitespace('\u{A0}'));
        assert!(!is_whitespace('\u{200B}'));
    }
}
