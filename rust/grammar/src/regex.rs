//! Regular expressions over the characters of a string (a JSON Schema
//! `pattern`, or the expression behind a `format`), translated to GBNF over
//! the JSON text that spells those characters between the quotes: a `"`, a
//! `\` or a control character of the language is written as its JSON escape.
//! Also the small GBNF writing tools the schema compiler shares.

use regex_syntax::hir::{Class, Hir, HirKind, Look};

/// The largest count a repetition may carry. The grammar parser expands
/// `x{m,n}` into about n rules, so a larger count is refused rather than
/// turned into a grammar nobody can hold in memory.
pub(crate) const MAX_COUNT: u64 = 10_000;

// ---------------------------------------------------------------------------
// GBNF text

/// How tightly a GBNF expression binds: a sequence must be parenthesised
/// before a quantifier, an alternation also inside a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prec {
    Atom,
    Seq,
    Alt,
}

/// A GBNF expression (never the empty string).
#[derive(Debug, Clone)]
pub(crate) struct Expr {
    pub text: String,
    pub prec: Prec,
}

impl Expr {
    pub fn atom(text: impl Into<String>) -> Self {
        Expr { text: text.into(), prec: Prec::Atom }
    }

    /// A GBNF literal matching exactly `text`.
    pub fn lit(text: &str) -> Self {
        Expr::atom(literal(text))
    }

    /// The concatenation of non-empty parts, adjacent literals joined.
    pub fn cat(parts: impl IntoIterator<Item = Expr>) -> Self {
        let mut parts: Vec<Expr> = parts.into_iter().collect();
        parts.dedup_by(|next, prev| {
            let joined = prev.is_literal() && next.is_literal();
            if joined {
                prev.text.pop();
                prev.text.push_str(&next.text[1..]);
            }
            joined
        });
        match parts.len() {
            0 => unreachable!("a GBNF sequence needs at least one element"),
            1 => parts.into_iter().next().unwrap(),
            _ => Expr { text: parts.iter().map(Expr::in_seq).collect::<Vec<_>>().join(" "), prec: Prec::Seq },
        }
    }

    /// The alternation of `alts`, without duplicates (a duplicate would
    /// only double the live parses).
    pub fn alt(alts: impl IntoIterator<Item = Expr>) -> Self {
        let mut uniq: Vec<Expr> = Vec::new();
        for a in alts {
            if !uniq.iter().any(|u| u.text == a.text) {
                uniq.push(a);
            }
        }
        match uniq.len() {
            0 => unreachable!("a GBNF alternation needs at least one alternative"),
            1 => uniq.pop().unwrap(),
            _ => Expr { text: uniq.iter().map(|a| a.text.as_str()).collect::<Vec<_>>().join(" | "), prec: Prec::Alt },
        }
    }

    /// `self` repeated between `min` and `max` times; `self` must not match
    /// the empty string (the automaton refuses such a loop).
    pub fn repeat(&self, min: u64, max: Option<u64>) -> Self {
        let q = match (min, max) {
            (0, None) => "*".to_owned(),
            (1, None) => "+".to_owned(),
            (0, Some(1)) => "?".to_owned(),
            (1, Some(1)) => return self.clone(),
            (m, None) => format!("{{{m},}}"),
            (m, Some(n)) if m == n => format!("{{{m}}}"),
            (m, Some(n)) => format!("{{{m},{n}}}"),
        };
        Expr::atom(format!("{}{q}", self.in_rep()))
    }

    /// Whether this is one GBNF literal (whose quotes then sit at both ends).
    fn is_literal(&self) -> bool {
        self.prec == Prec::Atom && self.text.len() >= 2 && self.text.starts_with('"') && self.text.ends_with('"')
    }

    pub fn optional(&self) -> Self {
        self.repeat(0, Some(1))
    }

    pub fn in_seq(&self) -> String {
        match self.prec {
            Prec::Alt => format!("( {} )", self.text),
            _ => self.text.clone(),
        }
    }

    fn in_rep(&self) -> String {
        match self.prec {
            Prec::Atom => self.text.clone(),
            _ => format!("( {} )", self.text),
        }
    }
}

/// A GBNF literal matching exactly `text`.
pub(crate) fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c < ' ' || c == '\x7f' => out.push_str(&format!("\\x{:02X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A GBNF character class over sorted, disjoint ranges.
pub(crate) fn class(ranges: &[(char, char)], negated: bool) -> String {
    let mut out = String::from(if negated { "[^" } else { "[" });
    for &(a, b) in ranges {
        out.push_str(&class_char(a));
        if b != a {
            if b as u32 != a as u32 + 1 {
                out.push('-');
            }
            out.push_str(&class_char(b));
        }
    }
    out.push(']');
    out
}

/// One character inside a GBNF class: printable ASCII as itself except the
/// class syntax, everything else escaped so the grammar text stays plain.
fn class_char(c: char) -> String {
    match c {
        '\\' => "\\\\".to_owned(),
        ']' => "\\]".to_owned(),
        '[' => "\\[".to_owned(),
        '-' => "\\-".to_owned(),
        '^' => "\\x5E".to_owned(),
        ' '..='~' => c.to_string(),
        c if (c as u32) < 0x80 => format!("\\x{:02X}", c as u32),
        c if (c as u32) <= 0xFFFF => format!("\\u{:04X}", c as u32),
        c => format!("\\U{:08X}", c as u32),
    }
}

/// The JSON spelling of `s` inside quotes, escaping what JSON requires and
/// DEL (which the free string rule also only admits escaped).
pub(crate) fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            c if c < ' ' || c == '\x7f' => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// Characters JSON text cannot (or, for DEL, the free string rule does not)
/// hold raw inside a string.
fn needs_escape(c: char) -> bool {
    c < ' ' || c == '"' || c == '\\' || c == '\x7f'
}

/// The short escape letter of a character, if JSON has one.
fn short_escape(c: char) -> Option<char> {
    Some(match c {
        '"' => '"',
        '\\' => '\\',
        '/' => '/',
        '\x08' => 'b',
        '\x0c' => 'f',
        '\n' => 'n',
        '\r' => 'r',
        '\t' => 't',
        _ => return None,
    })
}

/// Sorted, disjoint ranges covering `chars`.
pub(crate) fn ranges_of(mut chars: Vec<char>) -> Vec<(char, char)> {
    chars.sort_unstable();
    chars.dedup();
    let mut out: Vec<(char, char)> = Vec::new();
    for c in chars {
        match out.last_mut() {
            Some((_, b)) if *b as u32 + 1 == c as u32 => *b = c,
            _ => out.push((c, c)),
        }
    }
    out
}

/// The complement of sorted, disjoint ranges within all characters.
fn complement(ranges: &[(char, char)]) -> Vec<(char, char)> {
    let mut out = Vec::new();
    let mut next = 0u32;
    for &(a, b) in ranges {
        if (a as u32) > next {
            push_range(&mut out, next, a as u32 - 1);
        }
        next = b as u32 + 1;
    }
    if next <= char::MAX as u32 {
        push_range(&mut out, next, char::MAX as u32);
    }
    out
}

/// Pushes the characters in `a..=b`, stepping over the surrogate gap.
fn push_range(out: &mut Vec<(char, char)>, a: u32, b: u32) {
    const GAP: (u32, u32) = (0xD800, 0xDFFF);
    let mut spans = vec![(a, b)];
    if a <= GAP.1 && b >= GAP.0 {
        spans = vec![(a, GAP.0.saturating_sub(1)), (GAP.1 + 1, b)];
    }
    for (x, y) in spans {
        if x <= y && !(GAP.0..=GAP.1).contains(&x) {
            if let (Some(x), Some(y)) = (char::from_u32(x), char::from_u32(y)) {
                out.push((x, y));
            }
        }
    }
}

/// GBNF for one JSON-string character out of `ranges`: the raw characters
/// as a class, the ones JSON must escape as their escapes (both the short
/// and the `\u00XX` spelling of a control character, as JSON allows).
/// `any_char` names the rule for any character, used for the full range.
fn char_class(ranges: &[(char, char)], any_char: &str) -> Expr {
    if ranges == [('\0', char::MAX)] {
        return Expr::atom(any_char);
    }
    let contains = |c: char| ranges.iter().any(|&(a, b)| a <= c && c <= b);
    // The characters written raw: the ranges less those JSON escapes, which
    // all lie below 0x80.
    let mut raw = Vec::new();
    for &(a, b) in ranges {
        let (a, b) = (a as u32, b as u32);
        let mut start = a;
        for x in a..=b.min(0x7F) {
            if char::from_u32(x).is_some_and(needs_escape) {
                if start < x {
                    push_range(&mut raw, start, x - 1);
                }
                start = x + 1;
            }
        }
        if start <= b {
            push_range(&mut raw, start, b);
        }
    }
    let mut alts = Vec::new();
    if !raw.is_empty() {
        let positive = class(&raw, false);
        let negated = class(&complement(&raw), true);
        alts.push(Expr::atom(if negated.len() < positive.len() { negated } else { positive }));
    }
    let letters: Vec<char> = ['"', '\\', '/', '\x08', '\x0c', '\n', '\r', '\t']
        .into_iter()
        .filter(|&c| contains(c))
        .filter_map(short_escape)
        .collect();
    let mut escapes = Vec::new();
    if !letters.is_empty() {
        escapes.push(Expr::atom(class(&ranges_of(letters), false)));
    }
    let mut unicode = Vec::new();
    for (high, low_range) in [('0', 0x00..=0x0F), ('1', 0x10..=0x1F), ('7', 0x7F..=0x7F)] {
        let lows: Vec<char> = low_range
            .filter(|&x| contains(char::from_u32(x).unwrap()))
            .flat_map(|x| {
                let d = char::from_digit(x & 0xF, 16).unwrap();
                [d, d.to_ascii_uppercase()]
            })
            .collect();
        if !lows.is_empty() {
            unicode.push(Expr::cat([Expr::lit(&high.to_string()), Expr::atom(class(&ranges_of(lows), false))]));
        }
    }
    if !unicode.is_empty() {
        escapes.push(Expr::cat([Expr::lit("u00"), Expr::alt(unicode)]));
    }
    if !escapes.is_empty() {
        alts.push(Expr::cat([Expr::lit("\\"), Expr::alt(escapes)]));
    }
    Expr::alt(alts)
}

// ---------------------------------------------------------------------------
// Regular expressions

/// A regular expression over characters, kept normalised by its
/// constructors: no repetition of something that matches the empty string,
/// no `Lit("")`, nothing-matching parts folded away.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Re {
    /// A non-empty run of characters.
    Lit(String),
    /// One character out of sorted, disjoint, non-empty ranges.
    Class(Vec<(char, char)>),
    /// A sequence; `Cat([])` is the empty string.
    Cat(Vec<Re>),
    /// A choice; `Alt([])` matches nothing.
    Alt(Vec<Re>),
    /// A repetition of something that cannot match the empty string.
    Rep(Box<Re>, u32, Option<u32>),
}

impl Re {
    fn empty() -> Re {
        Re::Cat(Vec::new())
    }

    fn nothing() -> Re {
        Re::Alt(Vec::new())
    }

    fn is_nothing(&self) -> bool {
        matches!(self, Re::Alt(v) if v.is_empty())
    }

    fn lit(s: &str) -> Re {
        if s.is_empty() {
            Re::empty()
        } else {
            Re::Lit(s.to_owned())
        }
    }

    fn class(ranges: Vec<(char, char)>) -> Re {
        if ranges.is_empty() {
            Re::nothing()
        } else {
            Re::Class(ranges)
        }
    }

    fn cat(parts: Vec<Re>) -> Re {
        let mut out = Vec::new();
        for p in parts {
            match p {
                p if p.is_nothing() => return Re::nothing(),
                Re::Cat(inner) => out.extend(inner),
                p => out.push(p),
            }
        }
        if out.len() == 1 {
            out.pop().unwrap()
        } else {
            Re::Cat(out)
        }
    }

    fn alt(alts: Vec<Re>) -> Re {
        let mut out: Vec<Re> = Vec::new();
        for a in alts {
            let inner = match a {
                Re::Alt(inner) => inner,
                a => vec![a],
            };
            for a in inner {
                if !out.contains(&a) {
                    out.push(a);
                }
            }
        }
        if out.len() == 1 {
            out.pop().unwrap()
        } else {
            Re::Alt(out)
        }
    }

    fn rep(sub: Re, min: u32, max: Option<u32>) -> Re {
        if max == Some(0) {
            return Re::empty();
        }
        if sub.nullable() {
            // Any number of copies may then be empty: what remains is up to
            // `max` non-empty copies.
            let sub = sub.non_empty();
            if sub.is_nothing() {
                return Re::empty();
            }
            return Re::rep(sub, 0, max);
        }
        if sub.is_nothing() {
            return if min == 0 { Re::empty() } else { Re::nothing() };
        }
        if (min, max) == (1, Some(1)) {
            return sub;
        }
        Re::Rep(Box::new(sub), min, max)
    }

    fn nullable(&self) -> bool {
        match self {
            Re::Lit(_) | Re::Class(_) => false,
            Re::Cat(v) => v.iter().all(Re::nullable),
            Re::Alt(v) => v.iter().any(Re::nullable),
            Re::Rep(_, min, _) => *min == 0,
        }
    }

    /// The same language without the empty string.
    fn non_empty(&self) -> Re {
        match self {
            _ if !self.nullable() => self.clone(),
            Re::Cat(v) => {
                // Every part can be empty: the first non-empty one decides.
                Re::alt(
                    (0..v.len())
                        .map(|i| {
                            let mut parts = vec![v[i].non_empty()];
                            parts.extend(v[i + 1..].iter().cloned());
                            Re::cat(parts)
                        })
                        .collect(),
                )
            }
            Re::Alt(v) => Re::alt(v.iter().map(Re::non_empty).collect()),
            Re::Rep(sub, _, max) => Re::rep((**sub).clone(), 1, *max),
            Re::Lit(_) | Re::Class(_) => unreachable!("never nullable"),
        }
    }

    /// The fewest and most characters a match has.
    fn char_len(&self) -> (u64, Option<u64>) {
        match self {
            Re::Lit(s) => {
                let n = s.chars().count() as u64;
                (n, Some(n))
            }
            Re::Class(_) => (1, Some(1)),
            Re::Cat(v) => v
                .iter()
                .map(Re::char_len)
                .fold((0, Some(0)), |(a, b), (c, d)| (a.saturating_add(c), b.zip(d).map(|(b, d)| b.saturating_add(d)))),
            Re::Alt(v) => {
                let lens: Vec<_> = v.iter().map(Re::char_len).collect();
                let lo = lens.iter().map(|l| l.0).min().unwrap_or(0);
                let hi = lens.iter().try_fold(0, |m, l| l.1.map(|h| m.max(h)));
                (lo, hi)
            }
            Re::Rep(sub, min, max) => {
                let (lo, hi) = sub.char_len();
                (lo.saturating_mul(u64::from(*min)), hi.zip(*max).map(|(h, m)| h.saturating_mul(u64::from(m))))
            }
        }
    }

    /// GBNF for this expression over JSON string text; `None` for the empty
    /// string.
    fn to_gbnf(&self, any_char: &str) -> Option<Expr> {
        match self {
            Re::Lit(s) => Some(Expr::lit(&json_escape(s))),
            Re::Class(ranges) => Some(char_class(ranges, any_char)),
            Re::Cat(v) => {
                let parts: Vec<Expr> = v.iter().filter_map(|p| p.to_gbnf(any_char)).collect();
                (!parts.is_empty()).then(|| Expr::cat(parts))
            }
            Re::Alt(_) if self.nullable() => self.non_empty().to_gbnf(any_char).map(|e| e.optional()),
            Re::Alt(v) => Some(Expr::alt(v.iter().filter_map(|a| a.to_gbnf(any_char)))),
            Re::Rep(sub, min, max) => {
                let sub = sub.to_gbnf(any_char).expect("a repeated expression is never empty");
                Some(sub.repeat(u64::from(*min), max.map(u64::from)))
            }
        }
    }
}

/// One alternative of a pattern: `re`, matched against the whole string
/// once its unanchored ends admit any characters.
#[derive(Debug, Clone)]
struct Branch {
    re: Re,
    open_start: bool,
    open_end: bool,
}

/// Why a pattern cannot be intersected with a length range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LengthError {
    /// No string matches both.
    Contradiction,
    /// The intersection exists but is not expressed here.
    Unsupported,
}

/// A parsed pattern: strings matching any of its branches.
#[derive(Debug, Clone)]
pub(crate) struct Pattern {
    branches: Vec<Branch>,
}

/// Parses a pattern. As JSON Schema says, a pattern matches anywhere in the
/// string unless anchored: `^` at its start and `$` at its end tie it to the
/// ends of the string. Anchors elsewhere, multi-line anchors and word
/// boundaries are refused, as are look-around and backreferences (which
/// the regex parser itself does not know).
pub(crate) fn parse(pattern: &str) -> Result<Pattern, String> {
    let hir = regex_syntax::ParserBuilder::new().build().parse(pattern).map_err(|e| match e {
        regex_syntax::Error::Parse(e) => e.kind().to_string(),
        regex_syntax::Error::Translate(e) => e.kind().to_string(),
        e => e.to_string(),
    })?;
    let mut branches = Vec::new();
    split(&hir, &mut branches)?;
    let pattern = Pattern { branches: branches.into_iter().filter(|b| !b.re.is_nothing()).collect() };
    if pattern.branches.is_empty() {
        return Err("no string matches it".to_owned());
    }
    Ok(pattern)
}

/// Splits top-level alternatives into branches, stripping the anchors at the
/// ends of each.
fn split(h: &Hir, out: &mut Vec<Branch>) -> Result<(), String> {
    match h.kind() {
        HirKind::Capture(c) => split(&c.sub, out),
        HirKind::Alternation(alts) => alts.iter().try_for_each(|a| split(a, out)),
        kind => {
            let parts = match kind {
                HirKind::Concat(parts) => parts.as_slice(),
                _ => std::slice::from_ref(h),
            };
            // An alternation at either end whose branches hold anchors (the
            // parser factors `^a$|^b` into `^(?:a$|b)`): the rest of the
            // sequence goes into each branch.
            for i in [parts.len() - 1, 0] {
                if let (true, Some(branches)) = (parts.len() > 1, anchored_alternation(&parts[i])) {
                    for b in branches {
                        let mut seq = parts.to_vec();
                        seq[i] = b.clone();
                        split(&Hir::concat(seq), out)?;
                    }
                    return Ok(());
                }
            }
            let is_look = |h: &Hir, look: Look| matches!(h.kind(), HirKind::Look(l) if *l == look);
            let (mut lo, mut hi) = (0, parts.len());
            while lo < hi && is_look(&parts[lo], Look::Start) {
                lo += 1;
            }
            while hi > lo && is_look(&parts[hi - 1], Look::End) {
                hi -= 1;
            }
            let re = Re::cat(parts[lo..hi].iter().map(to_re).collect::<Result<_, _>>()?);
            out.push(Branch { re, open_start: lo == 0, open_end: hi == parts.len() });
            Ok(())
        }
    }
}

/// The branches of `h` when it is an alternation (maybe in a group) with
/// an anchor somewhere inside.
fn anchored_alternation(h: &Hir) -> Option<&[Hir]> {
    match h.kind() {
        HirKind::Capture(c) => anchored_alternation(&c.sub),
        HirKind::Alternation(branches) if !h.properties().look_set().is_empty() => Some(branches),
        _ => None,
    }
}

fn to_re(h: &Hir) -> Result<Re, String> {
    Ok(match h.kind() {
        HirKind::Empty => Re::empty(),
        HirKind::Literal(lit) => {
            Re::lit(std::str::from_utf8(&lit.0).map_err(|_| "it matches bytes that are not UTF-8 text")?)
        }
        HirKind::Class(Class::Unicode(c)) => Re::class(c.ranges().iter().map(|r| (r.start(), r.end())).collect()),
        HirKind::Class(Class::Bytes(c)) => {
            if c.ranges().iter().any(|r| r.end() >= 0x80) {
                return Err("it matches bytes that are not UTF-8 text".to_owned());
            }
            Re::class(c.ranges().iter().map(|r| (char::from(r.start()), char::from(r.end()))).collect())
        }
        HirKind::Look(look) => {
            return Err(match look {
                Look::Start | Look::End => {
                    "the anchors ^ and $ are supported only at the start and at the end of the pattern"
                }
                Look::StartLF | Look::EndLF | Look::StartCRLF | Look::EndCRLF => "multi-line anchors are not supported",
                _ => "word boundaries are not supported",
            }
            .to_owned())
        }
        HirKind::Repetition(r) => {
            let count = u64::from(r.max.unwrap_or(r.min));
            if count > MAX_COUNT {
                return Err(format!("the repetition count {count} is above {MAX_COUNT}"));
            }
            Re::rep(to_re(&r.sub)?, r.min, r.max)
        }
        HirKind::Capture(c) => to_re(&c.sub)?,
        HirKind::Concat(v) => Re::cat(v.iter().map(to_re).collect::<Result<_, _>>()?),
        HirKind::Alternation(v) => Re::alt(v.iter().map(to_re).collect::<Result<_, _>>()?),
    })
}

impl Pattern {
    /// Only the strings of `min..=max` characters. Done exactly where the
    /// length is implied by the branch, or where a branch is a fixed-length
    /// frame around one repetition of single characters (`^[a-z]+$`,
    /// `^[A-Z][a-z0-9_]*$`), whose count then absorbs the bounds.
    pub(crate) fn restrict_length(self, min: u64, max: Option<u64>) -> Result<Pattern, LengthError> {
        if min == 0 && max.is_none() {
            return Ok(self);
        }
        let fits_max = |n: Option<u64>| match (n, max) {
            (_, None) => true,
            (Some(n), Some(m)) => n <= m,
            (None, Some(_)) => false,
        };
        let mut branches = Vec::new();
        for b in self.branches {
            let open = b.open_start || b.open_end;
            let (lo, hi) = b.re.char_len();
            let hi = if open { None } else { hi };
            if hi.is_some_and(|h| h < min) || max.is_some_and(|m| lo > m) {
                continue;
            }
            if lo >= min && fits_max(hi) {
                branches.push(b);
                continue;
            }
            if open {
                return Err(LengthError::Unsupported);
            }
            let re = fold_length(&b.re, min, max).ok_or(LengthError::Unsupported)?;
            if !re.is_nothing() {
                branches.push(Branch { re, ..b });
            }
        }
        if branches.is_empty() {
            return Err(LengthError::Contradiction);
        }
        Ok(Pattern { branches })
    }

    /// GBNF for the text between the quotes; `None` when that can only be
    /// empty. `any_char` names the rule for any JSON string character.
    pub(crate) fn to_gbnf(&self, any_char: &str) -> Option<Expr> {
        let anything = || Re::Rep(Box::new(Re::Class(vec![('\0', char::MAX)])), 0, None);
        let whole = Re::alt(
            self.branches
                .iter()
                .map(|b| {
                    let mut parts = Vec::new();
                    if b.open_start {
                        parts.push(anything());
                    }
                    parts.push(b.re.clone());
                    if b.open_end {
                        parts.push(anything());
                    }
                    Re::cat(parts)
                })
                .collect(),
        );
        whole.to_gbnf(any_char)
    }
}

/// `re` restricted to `min..=max` characters when `re` is fixed-length parts
/// around a single repetition of one-character items; `Some(nothing)` when
/// no string fits, `None` when `re` has another shape.
fn fold_length(re: &Re, min: u64, max: Option<u64>) -> Option<Re> {
    let mut parts = match re {
        Re::Cat(v) => v.clone(),
        other => vec![other.clone()],
    };
    let variable: Vec<usize> = (0..parts.len())
        .filter(|&i| {
            let (lo, hi) = parts[i].char_len();
            hi != Some(lo)
        })
        .collect();
    let &[i] = variable.as_slice() else { return None };
    let Re::Rep(sub, rmin, rmax) = &parts[i] else { return None };
    if sub.char_len() != (1, Some(1)) {
        return None;
    }
    let fixed: u64 = (0..parts.len()).filter(|&j| j != i).map(|j| parts[j].char_len().0).sum();
    let lo = u64::from(*rmin).max(min.saturating_sub(fixed));
    let hi = match (rmax.map(u64::from), max.map(|m| m.checked_sub(fixed))) {
        (_, Some(None)) => return Some(Re::nothing()),
        (Some(a), Some(Some(b))) => Some(a.min(b)),
        (a, Some(b)) => a.or(b),
        (a, None) => a,
    };
    if hi.is_some_and(|h| lo > h) {
        return Some(Re::nothing());
    }
    // Both bounds come from counts already checked against MAX_COUNT.
    parts[i] = Re::rep((**sub).clone(), lo as u32, hi.map(|h| h as u32));
    Some(Re::cat(parts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gbnf(p: &str) -> String {
        parse(p).unwrap().to_gbnf("c").map(|e| e.text).unwrap_or_default()
    }

    #[test]
    fn anchored_literal_is_its_json_spelling() {
        assert_eq!(gbnf(r#"^a"b$"#), r#""a\\\"b""#);
    }

    #[test]
    fn unanchored_ends_admit_any_characters() {
        assert_eq!(gbnf("^ab"), r#""ab" c*"#);
        assert_eq!(gbnf("ab$"), r#"c* "ab""#);
    }

    #[test]
    fn nullable_repetitions_lose_their_empty_match() {
        assert_eq!(gbnf("^(a?)*$"), r#""a"*"#);
        assert_eq!(gbnf("^(a?b?)+$"), r#"( "a" "b"? | "b" )*"#);
    }

    #[test]
    fn negated_class_escapes_what_json_must() {
        let g = gbnf("^[^a]$");
        assert!(g.starts_with("[^"), "{g}");
        assert!(g.contains(r#""\\""#), "{g}");
    }

    #[test]
    fn anchors_in_the_middle_and_word_boundaries_are_refused() {
        assert!(parse("a^b").is_err());
        assert!(parse(r"\bword").is_err());
        assert!(parse("(?m)^a").is_err());
        assert!(parse("(?=a)").is_err());
        assert!(parse(r"(a)\1").is_err());
    }

    #[test]
    fn length_folds_into_the_single_repetition() {
        let p = parse("^[A-Z][a-z]*$").unwrap().restrict_length(2, Some(5)).unwrap();
        assert_eq!(p.to_gbnf("c").unwrap().text, "[A-Z] [a-z]{1,4}");
        assert_eq!(parse("^a+$").unwrap().restrict_length(0, Some(0)).unwrap_err(), LengthError::Contradiction);
        assert_eq!(parse("^(ab)+$").unwrap().restrict_length(0, Some(4)).unwrap_err(), LengthError::Unsupported);
    }
}
