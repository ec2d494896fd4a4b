//! llama.cpp's grammar syntax (GBNF), parsed into [`Grammar`].
//!
//! ```text
//! root   ::= object
//! object ::= "{" ws ( pair ( "," ws pair )* )? "}"
//! pair   ::= [a-z]+ ":" ws [0-9]+      # comments run to the end of the line
//! ws     ::= [ \t\n]{0,4}
//! ```
//!
//! Rules end at a newline unless inside parentheses or right after `|`.
//! Literals and classes take `\n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH`.
//! `.` is any character; `x*`, `x+`, `x?`, `x{m}`, `x{m,}`, `x{m,n}` repeat.
//! Repetition is lowered the way llama.cpp lowers it: `x*` becomes a rule
//! `r ::= x r |`, whose recursion in tail position the automaton runs
//! without growing its stack.

use crate::grammar::{literal, Builder, Elem, Grammar};
use crate::GrammarError;

/// Repetition bounds above this are refused: `x{0,n}` is n nested rules.
pub const MAX_REPEAT: u32 = 10_000;

/// Groups nested deeper than this are refused: the parser descends once per
/// level, on the stack of whatever thread compiles the grammar.
pub const MAX_NESTING: usize = 256;

/// Parses GBNF text; the rule named `root` is the document.
pub fn parse(text: &str) -> Result<Grammar, GrammarError> {
    let mut p = Parser { src: text.as_bytes(), text, pos: 0, depth: 0, b: Builder::default() };
    p.grammar()?;
    p.b.finish()
}

struct Parser<'a> {
    src: &'a [u8],
    text: &'a str,
    pos: usize,
    /// Groups open around `pos`.
    depth: usize,
    b: Builder,
}

type PResult<T> = Result<T, GrammarError>;

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

impl Parser<'_> {
    fn err<T>(&self, msg: impl Into<String>) -> PResult<T> {
        // The parser steps by bytes: an error may fall inside a character.
        let mut at = self.pos.min(self.text.len());
        while !self.text.is_char_boundary(at) {
            at -= 1;
        }
        let before = &self.text[..at];
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        Err(GrammarError::Syntax { line, col, msg: msg.into() })
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    fn starts(&self, s: &str) -> bool {
        self.src[self.pos..].starts_with(s.as_bytes())
    }

    /// Skips spaces, tabs and comments, and newlines too when `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' => self.pos += 1,
                b'#' => {
                    while !matches!(self.peek(), None | Some(b'\n')) {
                        self.pos += 1;
                    }
                }
                b'\r' | b'\n' if newlines => self.pos += 1,
                _ => break,
            }
        }
    }

    fn name(&mut self) -> PResult<&str> {
        let start = self.pos;
        while self.peek().is_some_and(is_word) {
            self.pos += 1;
        }
        if start == self.pos {
            return self.err("expected a rule name");
        }
        Ok(&self.text[start..self.pos])
    }

    fn grammar(&mut self) -> PResult<()> {
        self.space(true);
        while self.peek().is_some() {
            self.rule()?;
            self.space(true);
        }
        Ok(())
    }

    fn rule(&mut self) -> PResult<()> {
        let name = self.name()?.to_string();
        self.space(false);
        if !self.starts("::=") {
            return self.err(format!("expected ::= after rule name {name:?}"));
        }
        self.pos += 3;
        self.space(true);
        let alts = self.alternates(&name, false)?;
        match self.peek() {
            None | Some(b'\n') | Some(b'\r') => {}
            Some(c) => return self.err(format!("unexpected {:?}: expected a newline or the end", c as char)),
        }
        if let Err(msg) = self.b.define(&name, alts) {
            return self.err(msg);
        }
        Ok(())
    }

    fn alternates(&mut self, rule: &str, nested: bool) -> PResult<Vec<Vec<Elem>>> {
        let mut alts = vec![self.sequence(rule, nested)?];
        while self.peek() == Some(b'|') {
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(rule, nested)?);
        }
        Ok(alts)
    }

    fn sequence(&mut self, rule: &str, nested: bool) -> PResult<Vec<Elem>> {
        let mut seq: Vec<Elem> = Vec::new();
        // Where the last term starts in `seq`, so a repetition knows what it repeats.
        let mut last: Option<usize> = None;
        loop {
            let start = seq.len();
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    let text = self.quoted(b'"')?;
                    seq.extend(literal(&text));
                }
                Some(b'[') => {
                    self.pos += 1;
                    let e = self.char_class(rule)?;
                    seq.push(e);
                }
                Some(b'.') => {
                    self.pos += 1;
                    let e = self.b.class(rule, &[(0, 0x10FFFF)], false).expect("non-empty");
                    seq.push(e);
                }
                Some(b'(') => {
                    if self.depth == MAX_NESTING {
                        return self.err(format!("groups nested deeper than {MAX_NESTING}"));
                    }
                    self.pos += 1;
                    self.space(true);
                    self.depth += 1;
                    let alts = self.alternates(rule, true)?;
                    self.depth -= 1;
                    if self.peek() != Some(b')') {
                        return self.err("expected ) to close the group");
                    }
                    self.pos += 1;
                    seq.push(Elem::Rule(self.b.fresh(rule, alts)));
                }
                Some(c) if is_word(c) => {
                    let name = self.name()?.to_string();
                    seq.push(Elem::Rule(self.b.rule_id(&name)));
                }
                Some(b'<') => return self.err("token references (<...>) are not supported; write the text instead"),
                Some(b'*' | b'+' | b'?' | b'{') => {
                    let Some(at) = last else {
                        return self.err("a repetition operator must follow something to repeat");
                    };
                    let (min, max) = self.repetition()?;
                    let item: Vec<Elem> = seq.drain(at..).collect();
                    self.repeat(rule, &mut seq, item, min, max);
                    // A repeated repetition (`x**`) repeats the whole.
                    last = Some(at);
                    self.space(nested);
                    continue;
                }
                _ => break,
            }
            last = Some(start);
            self.space(nested);
        }
        Ok(seq)
    }

    /// Reads `*`, `+`, `?` or `{m}`, `{m,}`, `{m,n}` into (min, max); max `None` is unbounded.
    fn repetition(&mut self) -> PResult<(u32, Option<u32>)> {
        let c = self.peek().expect("caller saw an operator");
        self.pos += 1;
        match c {
            b'*' => Ok((0, None)),
            b'+' => Ok((1, None)),
            b'?' => Ok((0, Some(1))),
            _ => {
                self.space(false);
                let min = self.int()?;
                self.space(false);
                let max = if self.peek() == Some(b',') {
                    self.pos += 1;
                    self.space(false);
                    if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                        Some(self.int()?)
                    } else {
                        None
                    }
                } else {
                    Some(min)
                };
                self.space(false);
                if self.peek() != Some(b'}') {
                    return self.err("expected } to close the repetition");
                }
                self.pos += 1;
                if let Some(max) = max {
                    if max < min {
                        return self.err(format!("repetition {{{min},{max}}} has its maximum below its minimum"));
                    }
                }
                if min.max(max.unwrap_or(0)) > MAX_REPEAT {
                    return self.err(format!("repetition bound above {MAX_REPEAT}"));
                }
                Ok((min, max))
            }
        }
    }

    fn int(&mut self) -> PResult<u32> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        match self.text[start..self.pos].parse() {
            Ok(n) => Ok(n),
            Err(_) => self.err("expected a number"),
        }
    }

    /// Appends `item{min,max}` to `seq` as llama.cpp lowers it: `min` copies,
    /// then either a `*` rule or `max - min` nested optional rules.
    fn repeat(&mut self, rule: &str, seq: &mut Vec<Elem>, item: Vec<Elem>, min: u32, max: Option<u32>) {
        // A multi-element item (a literal) becomes one rule so it repeats as a unit.
        let unit: Vec<Elem> = if item.len() == 1 { item } else { vec![Elem::Rule(self.b.fresh(rule, vec![item]))] };
        for _ in 0..min {
            seq.extend_from_slice(&unit);
        }
        match max {
            None => {
                // r ::= unit r |
                let r = self.b.fresh(rule, Vec::new());
                let mut again = unit.clone();
                again.push(Elem::Rule(r));
                self.b.rules[r as usize].alts = vec![again, Vec::new()];
                seq.push(Elem::Rule(r));
            }
            Some(max) if max > min => {
                // opt_1 ::= unit |, opt_k ::= unit opt_{k-1} |
                let mut inner: Option<u32> = None;
                for _ in min..max {
                    let mut first = unit.clone();
                    first.extend(inner.map(Elem::Rule));
                    inner = Some(self.b.fresh(rule, vec![first, Vec::new()]));
                }
                seq.extend(inner.map(Elem::Rule));
            }
            Some(_) => {}
        }
    }

    /// The text of a literal up to the closing quote, escapes decoded.
    fn quoted(&mut self, close: u8) -> PResult<String> {
        let mut out = String::new();
        loop {
            match self.peek() {
                None | Some(b'\n') => return self.err("unterminated literal"),
                Some(c) if c == close => {
                    self.pos += 1;
                    return Ok(out);
                }
                _ => out.push(self.char()?),
            }
        }
    }

    /// One possibly escaped character of a literal or class.
    fn char(&mut self) -> PResult<char> {
        let rest = &self.text[self.pos..];
        let c = rest.chars().next().expect("caller checked");
        self.pos += c.len_utf8();
        if c != '\\' {
            return Ok(c);
        }
        let Some(e) = self.peek() else { return self.err("escape at the end of the grammar") };
        self.pos += 1;
        let hex = |p: &mut Self, n: usize| -> PResult<char> {
            let digits = p.text.get(p.pos..p.pos + n).unwrap_or("");
            let v = u32::from_str_radix(digits, 16).ok().filter(|_| digits.len() == n);
            match v.and_then(char::from_u32) {
                Some(c) => {
                    p.pos += n;
                    Ok(c)
                }
                None => p.err(format!("expected {n} hex digits naming a character")),
            }
        };
        match e {
            b'n' => Ok('\n'),
            b'r' => Ok('\r'),
            b't' => Ok('\t'),
            b'0' => Ok('\0'),
            b'x' => hex(self, 2),
            b'u' => hex(self, 4),
            b'U' => hex(self, 8),
            b'\\' | b'"' | b'[' | b']' | b'-' | b'^' | b'\'' | b'/' => Ok(e as char),
            _ => self.err(format!("unknown escape \\{}", e as char)),
        }
    }

    fn char_class(&mut self, rule: &str) -> PResult<Elem> {
        let negated = self.peek() == Some(b'^');
        if negated {
            self.pos += 1;
        }
        let mut ranges = Vec::new();
        loop {
            match self.peek() {
                None | Some(b'\n') => return self.err("unterminated character class"),
                Some(b']') => {
                    self.pos += 1;
                    break;
                }
                _ => {
                    let lo = self.char()? as u32;
                    let hi = if self.peek() == Some(b'-') && self.src.get(self.pos + 1) != Some(&b']') {
                        self.pos += 1;
                        if self.peek().is_none() {
                            return self.err("unterminated character class");
                        }
                        self.char()? as u32
                    } else {
                        lo
                    };
                    if hi < lo {
                        return self.err("a character range whose end comes before its start");
                    }
                    ranges.push((lo, hi));
                }
            }
        }
        match self.b.class(rule, &ranges, negated) {
            Ok(e) => Ok(e),
            Err(msg) => self.err(msg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn syntax_err(text: &str) -> (usize, usize, String) {
        match parse(text) {
            Err(GrammarError::Syntax { line, col, msg }) => (line, col, msg),
            other => panic!("expected a syntax error for {text:?}, got {other:?}"),
        }
    }

    /// Found by the grammar fuzz target: an error met inside a multi-byte
    /// character (here an escape's `\\` run ending in U+07DB) was reported by
    /// slicing the text there, a panic instead of the error.
    #[test]
    fn an_error_inside_a_character_is_still_an_error() {
        const FOUND: &[u8] = &[
            114, 111, 111, 116, 58, 58, 61, 32, 32, 91, 97, 45, 122, 101, 99, 116, 34, 44, 32, 34, 112, 114, 58, 32,
            34, 35, 47, 92, 92, 92, 92, 92, 92, 92, 223, 155, 101, 102, 115, 111, 49, 112, 101, 114, 116, 97, 114, 114,
            49, 97, 121, 105, 101, 115, 34, 58, 32, 123, 34, 110, 101, 120, 116, 34, 58, 32, 123, 34, 36, 114, 101,
            103, 58, 32, 34, 35, 47, 36, 100, 101, 102, 115, 111, 123, 34, 116, 121, 112, 101,
        ];
        let text = std::str::from_utf8(FOUND).unwrap();
        let (line, col, _) = syntax_err(text);
        assert_eq!(line, 1);
        assert!(col <= text.chars().count() + 1);
        for cut in ["root ::= [\u{7db}", "root ::= \"\\\u{7db}", "root ::= x\u{1F600}"] {
            assert!(parse(cut).is_err(), "{cut:?}");
        }
    }

    #[test]
    fn errors_say_where() {
        let (line, col, msg) = syntax_err("root ::= a\na ::= \"x");
        assert_eq!((line, col), (2, 9), "{msg}");
        assert!(msg.contains("unterminated"));
        assert!(syntax_err("root ::= \"a\" )").2.contains("unexpected"));
        assert!(syntax_err("root ::= *").2.contains("repetition"));
        assert!(syntax_err("root ::= \"a\"{3,2}").2.contains("maximum below"));
        assert!(syntax_err("root ::= [b-a]").2.contains("range"));
        assert!(syntax_err("root ::= \"\\q\"").2.contains("escape"));
        assert!(syntax_err("root ::= \"a\"\nroot ::= \"b\"").2.contains("twice"));
        assert!(syntax_err("root = \"a\"").2.contains("::="));
        assert!(matches!(parse("root ::= a"), Err(GrammarError::Undefined(n)) if n == "a"));
        assert!(matches!(parse("a ::= \"x\""), Err(GrammarError::NoRoot)));
    }

    #[test]
    fn rules_continue_inside_groups_and_after_bars() {
        let g = parse("root ::= (\n  \"a\"\n  | \"b\" ) |\n  \"c\"\n\n# comment\nx ::= \"y\" # trailing\n").unwrap();
        assert_eq!(g.rules[g.root as usize].alts.len(), 2);
    }
}
