//! The grammar the automaton runs: rules of alternatives of sequences over
//! byte ranges and rule references. Everything richer in GBNF (literals,
//! Unicode classes, groups, repetition) is lowered to this form by the parser,
//! so the automaton reads bytes and never needs to know about UTF-8.

use std::collections::HashMap;

use regex_syntax::utf8::Utf8Sequences;

use crate::GrammarError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    /// One byte in `lo..=hi`.
    Bytes(u8, u8),
    /// The rule with this index.
    Rule(u32),
}

#[derive(Clone, Debug)]
pub struct Rule {
    /// The name written in the grammar, or a generated one (`name-3`) for
    /// groups, repetitions and character classes.
    pub name: String,
    pub alts: Vec<Vec<Elem>>,
}

#[derive(Clone, Debug)]
pub struct Grammar {
    pub rules: Vec<Rule>,
    pub root: u32,
}

/// The largest Unicode scalar value.
const MAX_CHAR: u32 = 0x10FFFF;

/// Builds a grammar rule by rule; shared by the GBNF parser and its helpers.
#[derive(Default)]
pub(crate) struct Builder {
    pub rules: Vec<Rule>,
    /// Rules by name: their index and whether they have been defined yet
    /// (a rule may be used before its definition).
    by_name: HashMap<String, (u32, bool)>,
    /// Character classes already lowered, so each distinct class is one rule.
    classes: HashMap<Vec<(u32, u32)>, Elem>,
}

impl Builder {
    /// The index of the rule called `name`, reserving it if unseen.
    pub fn rule_id(&mut self, name: &str) -> u32 {
        if let Some(&(id, _)) = self.by_name.get(name) {
            return id;
        }
        let id = self.push(name.to_string(), Vec::new());
        self.by_name.insert(name.to_string(), (id, false));
        id
    }

    /// Gives the rule called `name` its alternatives; an error if it already had some.
    pub fn define(&mut self, name: &str, alts: Vec<Vec<Elem>>) -> Result<u32, String> {
        let id = self.rule_id(name);
        let entry = self.by_name.get_mut(name).expect("reserved above");
        if entry.1 {
            return Err(format!("rule {name:?} is defined twice"));
        }
        entry.1 = true;
        self.rules[id as usize].alts = alts;
        Ok(id)
    }

    /// A new anonymous rule named after the rule being defined.
    pub fn fresh(&mut self, base: &str, alts: Vec<Vec<Elem>>) -> u32 {
        let name = format!("{base}-{}", self.rules.len());
        self.push(name, alts)
    }

    fn push(&mut self, name: String, alts: Vec<Vec<Elem>>) -> u32 {
        self.rules.push(Rule { name, alts });
        (self.rules.len() - 1) as u32
    }

    /// The element matching one character from `ranges` (inclusive code
    /// point ranges, any order), or from their complement when `negated`.
    /// Surrogates are never matched: they have no UTF-8 form.
    pub fn class(&mut self, base: &str, ranges: &[(u32, u32)], negated: bool) -> Result<Elem, String> {
        let mut set = normalize(ranges);
        if negated {
            set = complement(&set);
        }
        if set.is_empty() {
            return Err("a character class that matches nothing".into());
        }
        if let Some(&e) = self.classes.get(&set) {
            return Ok(e);
        }
        let mut alts: Vec<Vec<Elem>> = Vec::new();
        for &(lo, hi) in &set {
            for seq in Utf8Sequences::new(char_at(lo), char_at(hi)) {
                alts.push(seq.as_slice().iter().map(|r| Elem::Bytes(r.start, r.end)).collect());
            }
        }
        let elem = if alts.len() == 1 && alts[0].len() == 1 {
            alts[0][0]
        } else {
            Elem::Rule(self.fresh(base, alts))
        };
        self.classes.insert(set, elem);
        Ok(elem)
    }

    /// Checks every used rule is defined and names the root.
    pub fn finish(self) -> Result<Grammar, GrammarError> {
        for (name, &(_, defined)) in &self.by_name {
            if !defined {
                return Err(GrammarError::Undefined(name.clone()));
            }
        }
        let root = match self.by_name.get("root") {
            Some(&(id, _)) => id,
            None => return Err(GrammarError::NoRoot),
        };
        Ok(Grammar { rules: self.rules, root })
    }
}

/// The literal text as a sequence of single-byte elements.
pub(crate) fn literal(text: &str) -> impl Iterator<Item = Elem> + '_ {
    text.bytes().map(|b| Elem::Bytes(b, b))
}

/// A valid char for a code point (surrogates have been cut out by `normalize`).
fn char_at(c: u32) -> char {
    char::from_u32(c).expect("surrogates are removed before lowering")
}

/// Sorted, merged ranges within the scalar values, surrogates removed.
fn normalize(ranges: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut v: Vec<(u32, u32)> = Vec::new();
    for &(a, b) in ranges {
        let (lo, hi) = (a.min(b), a.max(b).min(MAX_CHAR));
        if lo > hi {
            continue;
        }
        // Split around the surrogate block.
        if lo < 0xD800 {
            v.push((lo, hi.min(0xD7FF)));
        }
        if hi > 0xDFFF {
            v.push((lo.max(0xE000), hi));
        }
    }
    v.sort_unstable();
    let mut out: Vec<(u32, u32)> = Vec::with_capacity(v.len());
    for (lo, hi) in v {
        match out.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// The scalar values outside the normalized `set`.
fn complement(set: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut next = 0u32;
    for &(lo, hi) in set {
        if lo > next {
            out.push((next, lo - 1));
        }
        next = hi + 1;
    }
    if next <= MAX_CHAR {
        out.push((next, MAX_CHAR));
    }
    normalize(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_skip_surrogates_and_merge() {
        assert_eq!(normalize(&[(0xD000, 0xE100), (5, 3), (6, 7)]), vec![(3, 7), (0xD000, 0xD7FF), (0xE000, 0xE100)]);
        assert_eq!(complement(&normalize(&[(0, 0x7F)])), vec![(0x80, 0xD7FF), (0xE000, MAX_CHAR)]);
    }
}
