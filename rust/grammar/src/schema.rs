//! JSON Schema to GBNF: rules whose language is the JSON text of documents
//! the schema validates, for a subset of JSON Schema chosen for generation.
//! A keyword outside the subset is refused by name, since a constraint
//! silently dropped lets the model write documents the caller then rejects.
//!
//! Where generation and validation part ways, the grammar admits fewer
//! documents than the schema, never more:
//! - Documents are compact. Whitespace may follow `{`, `[`, `,` and `:` and
//!   precede `}` and `]`, each time at most one space, or a newline and up
//!   to 20 spaces or tabs, so that a small model cannot loop on whitespace;
//!   none before or after the document.
//! - Object properties come in the order the schema lists them (the order of
//!   the `serde_json` map), any extra properties after the declared ones.
//! - A schema with `properties` but no `additionalProperties` admits only
//!   the declared properties, as llama.cpp does: a model left free to add
//!   properties invents them. An object schema without `properties` admits
//!   any object.
//! - A schema without `type` that uses the keywords of only some types
//!   (`properties`, `minLength`...) describes values of those types.
//! - `oneOf` is read as `anyOf`: exclusivity is not enforced.
//! - Integers are written without fraction or exponent, bounded numbers
//!   without exponent; a bound on a non-integer number must be an integer.
//! - `$ref` siblings and `allOf` members are merged into one schema, which
//!   works where their keywords combine (object members, bounds, `type`,
//!   `enum`) and is refused by name elsewhere.
//! - A `pattern` matches anywhere in the string unless anchored (`^` at its
//!   start, `$` at its end), as JSON Schema says; its characters are written
//!   in one JSON spelling each. `format` is one of date, time, date-time
//!   (RFC 3339, offset required, no leap second), uuid, and email (a
//!   dot-atom, `@`, a host name).

use std::collections::{HashMap, HashSet};

use serde_json::{json, Map, Value};

use crate::regex::{self, json_escape, Expr, LengthError, Prec, MAX_COUNT};

/// A schema outside the supported subset, or one that does not make sense.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SchemaError {
    /// A keyword outside the subset, or used in a way the subset does not
    /// cover (then `keyword` says how, e.g. `format: "ipv4"`); `path` is the
    /// JSON pointer of the schema holding it, such as `/properties/a/items`.
    #[error("JSON Schema keyword `{keyword}` at #{path} is not supported")]
    Unsupported { keyword: String, path: String },
    /// The schema is malformed or contradictory (a keyword of the wrong type,
    /// minimum above maximum, a `$ref` to nothing, a bad pattern...).
    #[error("invalid JSON Schema at #{path}: {msg}")]
    Invalid { path: String, msg: String },
}

type Result<T> = std::result::Result<T, SchemaError>;
/// A compiled schema, or `None` when no value matches it.
type Out = Result<Option<Expr>>;

fn unsupported(keyword: impl Into<String>, path: &str) -> SchemaError {
    SchemaError::Unsupported { keyword: keyword.into(), path: path.to_owned() }
}

fn invalid(path: &str, msg: impl Into<String>) -> SchemaError {
    SchemaError::Invalid { path: path.to_owned(), msg: msg.into() }
}

/// Keywords that constrain nothing.
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "$schema",
    "$id",
    "$comment",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$defs",
    "definitions",
];
const OBJECT_KEYWORDS: &[&str] = &["properties", "required", "additionalProperties"];
const ARRAY_KEYWORDS: &[&str] = &["items", "prefixItems", "additionalItems", "minItems", "maxItems"];
const STRING_KEYWORDS: &[&str] = &["minLength", "maxLength", "pattern", "format"];
const NUMBER_KEYWORDS: &[&str] = &["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];
const OTHER_KEYWORDS: &[&str] = &["type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"];

const MAX_RULES: usize = 10_000;
const MAX_TEXT: usize = 1 << 20;
/// Schemas nested deeper than this (through `$ref` and `allOf` too) are
/// refused before they exhaust the stack.
const MAX_DEPTH: usize = 96;
/// Schemas visited (or merged) in all, beyond which the schema is refused:
/// `allOf` and `$ref` siblings inline their targets, which a hostile
/// schema can make exponential.
const MAX_STEPS: usize = 100_000;
/// Integer bounds are kept in `i128`; beyond this magnitude they are refused.
const MAX_BOUND: f64 = 1e38;

/// A grammar whose rule `root` matches the documents of `schema`.
pub fn json_schema_to_gbnf(schema: &serde_json::Value) -> Result<String> {
    schema_rules(schema, "root")
}

/// The rules for `schema` without a framing: rule `root` (a name of
/// `[a-zA-Z0-9-]+`) matches a document, and every other rule it needs is named
/// `root-...`. The rules of several schemas can then be concatenated into
/// one grammar, with framing rules around them, as long as no root name
/// starts with another root name and a dash.
pub fn schema_rules(schema: &serde_json::Value, root: &str) -> Result<String> {
    if root.is_empty() || !root.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-') {
        return Err(invalid("", format!("{root:?} is not a GBNF rule name ([a-zA-Z0-9-]+)")));
    }
    let mut c = Compiler::new(schema, root);
    let slot = Slot { index: 0, name: root.to_owned() };
    c.rules.push(None);
    let e = c.visit(schema, "", root)?.ok_or_else(|| c.why(""))?;
    c.fill(slot, e)?;
    Ok(c.finish())
}

/// A grammar for any JSON object, for `response_format: json_object`.
pub fn json_object_gbnf() -> String {
    json_schema_to_gbnf(&json!({"type": "object"})).expect("the any-object schema compiles")
}

/// `path` extended by one JSON pointer segment.
fn child(path: &str, segment: &str) -> String {
    format!("{path}/{}", segment.replace('~', "~0").replace('/', "~1"))
}

/// `name` in the rule-name alphabet, for readable rule names (uniqueness
/// is [`Compiler::alloc`]'s job).
fn sanitize(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
        if out.len() >= 32 {
            break;
        }
    }
    let out = out.trim_matches('-');
    if out.is_empty() {
        "x".to_owned()
    } else {
        out.to_owned()
    }
}

/// Keys of `m` that constrain something.
fn constraints(m: &Map<String, Value>) -> impl Iterator<Item = &str> {
    m.keys().map(String::as_str).filter(|k| !ANNOTATIONS.contains(k))
}

fn check_keywords(m: &Map<String, Value>, path: &str) -> Result<()> {
    let known = [OBJECT_KEYWORDS, ARRAY_KEYWORDS, STRING_KEYWORDS, NUMBER_KEYWORDS, OTHER_KEYWORDS];
    match constraints(m).find(|k| !known.iter().any(|set| set.contains(k))) {
        Some(k) => Err(unsupported(k, path)),
        None => Ok(()),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Null,
    Boolean,
    Object,
    Array,
    Number,
    Integer,
    String,
}

impl Ty {
    const ALL: [(Ty, &'static str); 7] = [
        (Ty::Null, "null"),
        (Ty::Boolean, "boolean"),
        (Ty::Object, "object"),
        (Ty::Array, "array"),
        (Ty::Number, "number"),
        (Ty::Integer, "integer"),
        (Ty::String, "string"),
    ];

    fn name(self) -> &'static str {
        Ty::ALL.iter().find(|(t, _)| *t == self).expect("listed").1
    }

    fn admits(self, v: &Value) -> bool {
        match self {
            Ty::Null => v.is_null(),
            Ty::Boolean => v.is_boolean(),
            Ty::Object => v.is_object(),
            Ty::Array => v.is_array(),
            Ty::Number => v.is_number(),
            Ty::Integer => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
            Ty::String => v.is_string(),
        }
    }
}

/// The types a `type` value names (integer folded into number when both
/// appear), or `None` when it is absent.
fn types(t: Option<&Value>, path: &str) -> Result<Option<Vec<Ty>>> {
    let names: Vec<&Value> = match t {
        None => return Ok(None),
        Some(Value::Array(a)) if !a.is_empty() => a.iter().collect(),
        Some(v @ Value::String(_)) => vec![v],
        Some(_) => return Err(invalid(path, "type must be a type name or a non-empty array of them")),
    };
    let mut out = Vec::new();
    for n in names {
        let ty = Ty::ALL
            .iter()
            .find(|(_, name)| n.as_str() == Some(name))
            .ok_or_else(|| invalid(path, format!("{n} is not a JSON Schema type")))?
            .0;
        if !out.contains(&ty) {
            out.push(ty);
        }
    }
    if out.contains(&Ty::Number) {
        out.retain(|&t| t != Ty::Integer);
    }
    Ok(Some(out))
}

/// The types whose keywords `m` uses, when it has no `type`.
fn inferred_types(m: &Map<String, Value>) -> Vec<Ty> {
    let uses = |set: &[&str]| set.iter().any(|k| m.contains_key(*k));
    [
        (Ty::Object, OBJECT_KEYWORDS),
        (Ty::Array, ARRAY_KEYWORDS),
        (Ty::String, STRING_KEYWORDS),
        (Ty::Number, NUMBER_KEYWORDS),
    ]
    .into_iter()
    .filter(|(_, set)| uses(set))
    .map(|(t, _)| t)
    .collect()
}

/// A count keyword (`minLength`, `maxItems`...), at most [`MAX_COUNT`].
fn count(m: &Map<String, Value>, keyword: &str, path: &str) -> Result<Option<u64>> {
    let Some(v) = m.get(keyword) else { return Ok(None) };
    let n = v
        .as_u64()
        // `as` saturates, so a huge float count still reads as above the limit.
        .or_else(|| v.as_f64().filter(|f| *f >= 0.0 && f.fract() == 0.0).map(|f| f as u64))
        .ok_or_else(|| invalid(path, format!("{keyword} must be a non-negative integer")))?;
    if n > MAX_COUNT {
        return Err(invalid(path, format!("{keyword} {n} is above {MAX_COUNT}, the largest count compiled")));
    }
    Ok(Some(n))
}

/// A numeric bound's value: an integer when it is one (and fits), else the float.
#[derive(Debug, Clone, Copy)]
enum Num {
    Int(i128),
    Float(f64),
}

fn num(v: &Value, keyword: &str, path: &str) -> Result<Num> {
    if let Some(i) = v.as_i64() {
        return Ok(Num::Int(i.into()));
    }
    if let Some(u) = v.as_u64() {
        return Ok(Num::Int(u.into()));
    }
    match v.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < MAX_BOUND => Ok(Num::Int(f as i128)),
        Some(f) => Ok(Num::Float(f)),
        None => Err(invalid(path, format!("{keyword} must be a number"))),
    }
}

/// A lower or upper bound.
struct Bound {
    keyword: &'static str,
    value: Num,
    exclusive: bool,
}

/// The lower and upper bounds of `m`, draft-4 boolean exclusives included.
fn bounds(m: &Map<String, Value>, path: &str) -> Result<(Vec<Bound>, Vec<Bound>)> {
    Ok((side(m, "minimum", "exclusiveMinimum", path)?, side(m, "maximum", "exclusiveMaximum", path)?))
}

fn side(
    m: &Map<String, Value>,
    keyword: &'static str,
    exclusive_keyword: &'static str,
    path: &str,
) -> Result<Vec<Bound>> {
    let mut out = Vec::new();
    let draft4_exclusive = match m.get(exclusive_keyword) {
        None => false,
        Some(Value::Bool(b)) => {
            if *b && !m.contains_key(keyword) {
                return Err(invalid(path, format!("{exclusive_keyword}: true needs {keyword}")));
            }
            *b
        }
        Some(v) => {
            out.push(Bound { keyword: exclusive_keyword, value: num(v, exclusive_keyword, path)?, exclusive: true });
            false
        }
    };
    if let Some(v) = m.get(keyword) {
        out.push(Bound { keyword, value: num(v, keyword, path)?, exclusive: draft4_exclusive });
    }
    Ok(out)
}

/// A reserved place in the rule list, so rules read top-down.
struct Slot {
    index: usize,
    name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Builtin {
    Space,
    Char,
    String,
    Integer,
    Number,
    Value,
    Object,
    Array,
}

/// One member of an object body: a key-value pair, or the repeated extra pair.
struct Member {
    pair: Expr,
    required: bool,
    repeated: bool,
}

/// The state of one compilation: the rules so far and what they are named.
struct Compiler<'a> {
    /// The whole document, which `$ref` pointers address.
    doc: &'a Value,
    root: String,
    rules: Vec<Option<(String, String)>>,
    taken: HashSet<String>,
    /// Rule names of `$ref` targets by JSON pointer.
    refs: HashMap<String, String>,
    builtins: HashMap<Builtin, String>,
    /// `$ref` targets entered since the last byte of the document; meeting
    /// one again would be left recursion.
    start_refs: Vec<String>,
    /// Why the last schema found to match nothing does not.
    why: Option<SchemaError>,
    depth: usize,
    steps: usize,
    text_len: usize,
    n_rules: usize,
}

impl<'a> Compiler<'a> {
    fn new(doc: &'a Value, root: &str) -> Self {
        Compiler {
            doc,
            root: root.to_owned(),
            rules: Vec::new(),
            taken: [root.to_owned()].into(),
            refs: [(String::new(), root.to_owned())].into(),
            builtins: HashMap::new(),
            start_refs: vec![String::new()],
            why: None,
            depth: 0,
            steps: 0,
            text_len: 0,
            n_rules: 0,
        }
    }

    fn finish(self) -> String {
        let mut out = String::with_capacity(self.text_len);
        for (name, body) in self.rules.into_iter().flatten() {
            out.push_str(&name);
            out.push_str(" ::= ");
            out.push_str(&body);
            out.push('\n');
        }
        out
    }

    /// A fresh rule name: `hint`, or `hint-N` if that is taken.
    fn alloc(&mut self, hint: &str) -> String {
        let mut name = hint.to_owned();
        let mut n = 2;
        while self.taken.contains(&name) {
            name = format!("{hint}-{n}");
            n += 1;
        }
        self.taken.insert(name.clone());
        name
    }

    fn reserve(&mut self, hint: &str) -> Slot {
        let name = self.alloc(hint);
        self.rules.push(None);
        Slot { index: self.rules.len() - 1, name }
    }

    fn fill(&mut self, slot: Slot, body: Expr) -> Result<()> {
        self.n_rules += 1;
        self.text_len += slot.name.len() + body.text.len() + 6;
        if self.n_rules > MAX_RULES || self.text_len > MAX_TEXT {
            return Err(invalid(
                "",
                format!("the schema compiles to more than {MAX_RULES} rules or {MAX_TEXT} bytes of grammar"),
            ));
        }
        self.rules[slot.index] = Some((slot.name, body.text));
        Ok(())
    }

    /// A rule for `body`, as an expression naming it.
    fn define(&mut self, hint: &str, body: Expr) -> Result<Expr> {
        let slot = self.reserve(hint);
        let name = Expr::atom(slot.name.clone());
        self.fill(slot, body)?;
        Ok(name)
    }

    fn nothing(&mut self, path: &str, msg: impl Into<String>) -> Out {
        self.why = Some(invalid(path, msg));
        Ok(None)
    }

    fn why(&mut self, path: &str) -> SchemaError {
        self.why.take().unwrap_or_else(|| invalid(path, "no value matches this schema"))
    }

    /// Runs `f` for what comes after a byte of the document (inside an
    /// object or array), where a `$ref` back to an open target is fine.
    fn after_byte<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let saved = std::mem::take(&mut self.start_refs);
        let r = f(self);
        self.start_refs = saved;
        r
    }

    fn builtin(&mut self, b: Builtin) -> Result<Expr> {
        if let Some(name) = self.builtins.get(&b) {
            return Ok(Expr::atom(name.clone()));
        }
        let hint = match b {
            Builtin::Space => "space",
            Builtin::Char => "char",
            Builtin::String => "string",
            Builtin::Integer => "integer",
            Builtin::Number => "number",
            Builtin::Value => "value",
            Builtin::Object => "object",
            Builtin::Array => "array",
        };
        let slot = self.reserve(&format!("{}-{hint}", self.root));
        let name = slot.name.clone();
        self.builtins.insert(b, name.clone());
        let body = match b {
            Builtin::Space => Expr::atom(r#"( " " | "\n" [ \t]{0,20} )?"#),
            Builtin::Char => Expr {
                text: r#"[^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )"#.to_owned(),
                prec: Prec::Alt,
            },
            Builtin::String => {
                let c = self.builtin(Builtin::Char)?;
                Expr::cat([Expr::lit("\""), c.repeat(0, None), Expr::lit("\"")])
            }
            Builtin::Integer => int_range(None, None),
            Builtin::Number => Expr {
                text: r#""-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,16} )?"#.to_owned(),
                prec: Prec::Seq,
            },
            Builtin::Value => Expr::alt([
                self.builtin(Builtin::Object)?,
                self.builtin(Builtin::Array)?,
                self.builtin(Builtin::String)?,
                self.builtin(Builtin::Number)?,
                Expr::lit("true"),
                Expr::lit("false"),
                Expr::lit("null"),
            ]),
            Builtin::Object => {
                let key = self.builtin(Builtin::String)?;
                let value = self.builtin(Builtin::Value)?;
                let pair = self.pair(key, value)?;
                self.container("{", "}", pair)?
            }
            Builtin::Array => {
                let value = self.builtin(Builtin::Value)?;
                self.container("[", "]", value)?
            }
        };
        self.fill(slot, body)?;
        Ok(Expr::atom(name))
    }

    /// `key ":" space value`.
    fn pair(&mut self, key: Expr, value: Expr) -> Result<Expr> {
        Ok(Expr::cat([key, Expr::lit(":"), self.builtin(Builtin::Space)?, value]))
    }

    /// `open` any number of comma-separated `item`s `close`.
    fn container(&mut self, open: &str, close: &str, item: Expr) -> Result<Expr> {
        let space = self.builtin(Builtin::Space)?;
        let more = Expr::cat([Expr::lit(","), space.clone(), item.clone()]).repeat(0, None);
        let items = Expr::cat([item, more, space.clone()]).optional();
        Ok(Expr::cat([Expr::lit(open), space, items, Expr::lit(close)]))
    }

    fn any(&mut self) -> Out {
        Ok(Some(self.builtin(Builtin::Value)?))
    }

    /// `schema` as one atom: a rule named after `hint` unless it is one already.
    fn atom(&mut self, schema: &Value, path: &str, hint: &str) -> Out {
        let slot = self.reserve(hint);
        let Some(e) = self.visit(schema, path, &slot.name)? else { return Ok(None) };
        if e.prec == Prec::Atom {
            return Ok(Some(e));
        }
        let name = Expr::atom(slot.name.clone());
        self.fill(slot, e)?;
        Ok(Some(name))
    }

    /// Counts a unit of work against [`MAX_STEPS`].
    fn step(&mut self, path: &str) -> Result<()> {
        self.steps += 1;
        if self.steps > MAX_STEPS {
            return Err(invalid(path, format!("the schema takes more than {MAX_STEPS} steps to expand")));
        }
        Ok(())
    }

    fn visit(&mut self, schema: &Value, path: &str, hint: &str) -> Out {
        if self.depth >= MAX_DEPTH {
            return Err(invalid(path, format!("the schema nests more than {MAX_DEPTH} levels deep")));
        }
        self.step(path)?;
        self.depth += 1;
        let r = self.visit_inner(schema, path, hint);
        self.depth -= 1;
        r
    }

    fn visit_inner(&mut self, schema: &Value, path: &str, hint: &str) -> Out {
        let m = match schema {
            Value::Bool(true) => return self.any(),
            Value::Bool(false) => return self.nothing(path, "the schema false matches nothing"),
            Value::Object(m) => m,
            _ => return Err(invalid(path, "a schema must be an object or a boolean")),
        };
        check_keywords(m, path)?;
        if let Some(r) = m.get("$ref") {
            if constraints(m).all(|k| k == "$ref") {
                return self.reference(r, path);
            }
            // Siblings of `$ref` constrain too (from draft 2019-09 on).
            let mut rest = m.clone();
            rest.remove("$ref");
            let members = vec![(json!({ "$ref": r }), path.to_owned()), (Value::Object(rest), path.to_owned())];
            return self.all_of(members, path, hint);
        }
        if let Some(all) = m.get("allOf") {
            let all = all
                .as_array()
                .filter(|a| !a.is_empty())
                .ok_or_else(|| invalid(path, "allOf must be a non-empty array of schemas"))?;
            let mut members: Vec<(Value, String)> = all
                .iter()
                .enumerate()
                .map(|(i, s)| (s.clone(), child(&child(path, "allOf"), &i.to_string())))
                .collect();
            let mut rest = m.clone();
            rest.remove("allOf");
            members.push((Value::Object(rest), path.to_owned()));
            return self.all_of(members, path, hint);
        }
        match (m.get("anyOf"), m.get("oneOf")) {
            (Some(_), Some(_)) => Err(unsupported("oneOf (alongside anyOf)", path)),
            (Some(alts), None) => self.any_of(m, "anyOf", alts, path, hint),
            (None, Some(alts)) => self.any_of(m, "oneOf", alts, path, hint),
            (None, None) => self.typed(m, path, hint),
        }
    }

    /// A `$ref` into this document: one rule per target, so recursion works.
    fn reference(&mut self, r: &Value, path: &str) -> Out {
        let (pointer, target) = self.resolve(r, path)?;
        if let Some(name) = self.refs.get(&pointer) {
            if self.start_refs.contains(&pointer) {
                return Err(invalid(
                    path,
                    format!("$ref {r} leads back to itself before a character is written (left recursion)"),
                ));
            }
            return Ok(Some(Expr::atom(name.clone())));
        }
        let last = pointer.rsplit('/').next().unwrap_or_default();
        let slot = self.reserve(&format!("{}-{}", self.root, sanitize(last)));
        let name = slot.name.clone();
        self.refs.insert(pointer.clone(), name.clone());
        self.start_refs.push(pointer.clone());
        let e = self.visit(target, &pointer, &name);
        self.start_refs.pop();
        let e = e?.ok_or_else(|| self.why(&pointer))?;
        self.fill(slot, e)?;
        Ok(Some(Expr::atom(name)))
    }

    /// The JSON pointer a `$ref` names in this document, and what it points to.
    fn resolve(&self, r: &Value, path: &str) -> Result<(String, &'a Value)> {
        let s = r.as_str().ok_or_else(|| invalid(path, "$ref must be a string"))?;
        let pointer = s
            .strip_prefix('#')
            .and_then(percent_decode)
            .filter(|p| p.is_empty() || p.starts_with('/'))
            .ok_or_else(|| unsupported(format!("$ref: {r}"), path))?;
        let target = self
            .doc
            .pointer(&pointer)
            .ok_or_else(|| invalid(path, format!("$ref {r} points to nothing in this document")))?;
        Ok((pointer, target))
    }

    fn any_of(&mut self, m: &Map<String, Value>, keyword: &str, alts: &Value, path: &str, hint: &str) -> Out {
        let alts = alts
            .as_array()
            .filter(|a| !a.is_empty())
            .ok_or_else(|| invalid(path, format!("{keyword} must be a non-empty array of schemas")))?;
        let mut rest = m.clone();
        rest.remove(keyword);
        let shared = constraints(&rest).next().is_some();
        let mut out = Vec::new();
        for (i, alt) in alts.iter().enumerate() {
            let p = child(&child(path, keyword), &i.to_string());
            let h = format!("{hint}-{i}");
            // Keywords beside anyOf apply to every alternative.
            let e = if shared {
                self.all_of(vec![(Value::Object(rest.clone()), path.to_owned()), (alt.clone(), p.clone())], &p, &h)?
            } else {
                self.visit(alt, &p, &h)?
            };
            out.extend(e);
        }
        if out.is_empty() {
            return self.nothing(path, format!("no alternative of {keyword} matches anything"));
        }
        Ok(Some(Expr::alt(out)))
    }

    /// The intersection of schemas, merged into one.
    fn all_of(&mut self, members: Vec<(Value, String)>, path: &str, hint: &str) -> Out {
        let constraining: Vec<&(Value, String)> = members
            .iter()
            .filter(|(v, _)| match v {
                Value::Object(m) => constraints(m).next().is_some(),
                v => *v != Value::Bool(true),
            })
            .collect();
        match constraining.as_slice() {
            [] => return self.any(),
            // Visited as itself, a lone `$ref` stays a named (maybe recursive) rule.
            [(v, p)] => return self.visit(v, p, hint),
            _ => {}
        }
        let mut flat = Vec::new();
        for (v, p) in &members {
            if !self.flatten(v, p, &mut flat, 0)? {
                return Ok(None);
            }
        }
        let mut merged = Map::new();
        for (m, p) in flat {
            if !self.merge(&mut merged, m, &p)? {
                return Ok(None);
            }
        }
        self.visit(&Value::Object(merged), path, hint)
    }

    /// Appends the constraining parts of `v` with `$ref` and `allOf`
    /// resolved; false when `v` contains the schema `false`.
    fn flatten(
        &mut self,
        v: &Value,
        path: &str,
        out: &mut Vec<(Map<String, Value>, String)>,
        depth: usize,
    ) -> Result<bool> {
        if depth > MAX_DEPTH {
            return Err(invalid(path, "$ref and allOf form a loop"));
        }
        self.step(path)?;
        let m = match v {
            Value::Bool(true) => return Ok(true),
            Value::Bool(false) => {
                self.why = Some(invalid(path, "the schema false matches nothing"));
                return Ok(false);
            }
            Value::Object(m) => m,
            _ => return Err(invalid(path, "a schema must be an object or a boolean")),
        };
        check_keywords(m, path)?;
        let mut rest = m.clone();
        if let Some(r) = rest.remove("$ref") {
            let (pointer, target) = self.resolve(&r, path)?;
            if !self.flatten(target, &pointer, out, depth + 1)? {
                return Ok(false);
            }
        }
        if let Some(all) = rest.remove("allOf") {
            let all = all.as_array().ok_or_else(|| invalid(path, "allOf must be an array of schemas"))?.clone();
            for (i, s) in all.iter().enumerate() {
                if !self.flatten(s, &child(&child(path, "allOf"), &i.to_string()), out, depth + 1)? {
                    return Ok(false);
                }
            }
        }
        if constraints(&rest).next().is_some() {
            out.push((rest, path.to_owned()));
        }
        Ok(true)
    }

    /// Merges the constraints of `b` into `a`; false when they contradict.
    fn merge(&mut self, a: &mut Map<String, Value>, b: Map<String, Value>, path: &str) -> Result<bool> {
        for (k, vb) in b {
            if ANNOTATIONS.contains(&k.as_str()) {
                continue;
            }
            let Some(va) = a.get(&k) else {
                a.insert(k, vb);
                continue;
            };
            if *va == vb {
                continue;
            }
            let merged = match k.as_str() {
                "type" => {
                    let ta = types(Some(va), path)?.unwrap_or_default();
                    let tb = types(Some(&vb), path)?.unwrap_or_default();
                    let mut common = Vec::new();
                    for &t in &ta {
                        let t = match t {
                            _ if tb.contains(&t) => t,
                            Ty::Integer if tb.contains(&Ty::Number) => Ty::Integer,
                            Ty::Number if tb.contains(&Ty::Integer) => Ty::Integer,
                            _ => continue,
                        };
                        common.push(t.name());
                    }
                    if common.is_empty() {
                        self.why = Some(invalid(path, format!("allOf members admit no common type ({va} and {vb})")));
                        return Ok(false);
                    }
                    json!(common)
                }
                "properties" => {
                    let (Some(pa), Some(pb)) = (va.as_object(), vb.as_object()) else {
                        return Err(invalid(path, "properties must be an object"));
                    };
                    let mut out = pa.clone();
                    for (name, sb) in pb {
                        match pa.get(name) {
                            Some(sa) if sa != sb => out.insert(name.clone(), json!({ "allOf": [sa, sb] })),
                            Some(_) => None,
                            None => out.insert(name.clone(), sb.clone()),
                        };
                    }
                    Value::Object(out)
                }
                "required" | "enum" => {
                    let (Some(xa), Some(xb)) = (va.as_array(), vb.as_array()) else {
                        return Err(invalid(path, format!("{k} must be an array")));
                    };
                    let out: Vec<Value> = if k == "required" {
                        xa.iter().chain(xb.iter().filter(|x| !xa.contains(x))).cloned().collect()
                    } else {
                        xa.iter().filter(|x| xb.contains(x)).cloned().collect()
                    };
                    if out.is_empty() {
                        self.why = Some(invalid(path, "allOf members share no enum value"));
                        return Ok(false);
                    }
                    Value::Array(out)
                }
                "additionalProperties" | "items" => match (va, &vb) {
                    (Value::Bool(false), _) | (_, Value::Bool(false)) => Value::Bool(false),
                    (Value::Bool(true), x) => x.clone(),
                    (x, Value::Bool(true)) => x.clone(),
                    (x, y) => json!({ "allOf": [x, y] }),
                },
                "minimum" | "exclusiveMinimum" | "minLength" | "minItems" | "maximum" | "exclusiveMaximum"
                | "maxLength" | "maxItems" => {
                    let (Some(x), Some(y)) = (va.as_f64(), vb.as_f64()) else {
                        return Err(unsupported(format!("{k} (a draft-4 boolean form inside allOf)"), path));
                    };
                    let lower = k.starts_with("min") || k == "exclusiveMinimum";
                    if (x < y) == lower {
                        vb
                    } else {
                        va.clone()
                    }
                }
                "const" => {
                    self.why = Some(invalid(path, format!("allOf members require different constants {va} and {vb}")));
                    return Ok(false);
                }
                _ => return Err(unsupported(format!("{k} (with two different values in allOf)"), path)),
            };
            a.insert(k, merged);
        }
        Ok(true)
    }

    /// A schema without `$ref` or combinators: its types, each constrained.
    fn typed(&mut self, m: &Map<String, Value>, path: &str, hint: &str) -> Out {
        let tys = types(m.get("type"), path)?;
        if m.contains_key("enum") || m.contains_key("const") {
            return self.enumeration(m, tys.as_deref(), path);
        }
        let tys = match tys {
            Some(t) => t,
            None => inferred_types(m),
        };
        if tys.is_empty() {
            return self.any();
        }
        let mut alts = Vec::new();
        for ty in tys {
            let e = match ty {
                Ty::Null => Some(Expr::lit("null")),
                Ty::Boolean => Some(Expr::alt([Expr::lit("true"), Expr::lit("false")])),
                Ty::Integer => self.integer(m, path)?,
                Ty::Number => self.number(m, path)?,
                Ty::String => self.string(m, path)?,
                Ty::Array => self.array(m, path, hint)?,
                Ty::Object => self.object(m, path, hint)?,
            };
            alts.extend(e);
        }
        if alts.is_empty() {
            return Ok(None);
        }
        Ok(Some(Expr::alt(alts)))
    }

    /// `enum` and `const`: their values (of the allowed types) written as
    /// compact JSON.
    fn enumeration(&mut self, m: &Map<String, Value>, tys: Option<&[Ty]>, path: &str) -> Out {
        // Checking the values against other keywords is not done; refused.
        if let Some(k) = constraints(m).find(|k| !["type", "enum", "const"].contains(k)) {
            return Err(unsupported(format!("{k} (alongside enum or const)"), path));
        }
        let mut values: Vec<&Value> = match m.get("enum") {
            None => Vec::new(),
            Some(Value::Array(a)) => a.iter().collect(),
            Some(_) => return Err(invalid(path, "enum must be an array")),
        };
        if let Some(c) = m.get("const") {
            values = if m.contains_key("enum") { values.into_iter().filter(|v| *v == c).collect() } else { vec![c] };
        }
        if let Some(tys) = tys {
            values.retain(|v| tys.iter().any(|t| t.admits(v)));
        }
        if values.is_empty() {
            return self.nothing(path, "no value of enum or const is allowed by the schema");
        }
        Ok(Some(Expr::alt(values.into_iter().map(|v| Expr::lit(&v.to_string())))))
    }

    fn integer(&mut self, m: &Map<String, Value>, path: &str) -> Out {
        let (lower, upper) = bounds(m, path)?;
        let to_int = |b: &Bound, up: bool| -> Result<i128> {
            match b.value {
                Num::Int(i) if b.exclusive => Ok(if up { i - 1 } else { i + 1 }),
                Num::Int(i) => Ok(i),
                Num::Float(f) if f.abs() < MAX_BOUND => Ok((if up { f.floor() } else { f.ceil() }) as i128),
                Num::Float(_) => Err(invalid(path, format!("{} is too large", b.keyword))),
            }
        };
        let lo = lower.iter().map(|b| to_int(b, false)).collect::<Result<Vec<_>>>()?.into_iter().max();
        let hi = upper.iter().map(|b| to_int(b, true)).collect::<Result<Vec<_>>>()?.into_iter().min();
        match (lo, hi) {
            (None, None) => Ok(Some(self.builtin(Builtin::Integer)?)),
            (Some(l), Some(h)) if l > h => self.nothing(path, format!("no integer lies in [{l}, {h}]")),
            _ => Ok(Some(int_range(lo, hi))),
        }
    }

    fn number(&mut self, m: &Map<String, Value>, path: &str) -> Out {
        let (lower, upper) = bounds(m, path)?;
        let as_int = |b: &Bound| match b.value {
            Num::Int(i) => Ok((i, b.exclusive)),
            Num::Float(f) => Err(unsupported(format!("{}: {f} (a non-integer bound on a number)", b.keyword), path)),
        };
        // The strictest bound: the larger lower bound (exclusive when tied),
        // the smaller upper one.
        let mut lo: Option<(i128, bool)> = None;
        for b in &lower {
            let b = as_int(b)?;
            if lo.is_none_or(|l| (b.0, b.1) > l) {
                lo = Some(b);
            }
        }
        let mut hi: Option<(i128, bool)> = None;
        for b in &upper {
            let b = as_int(b)?;
            if hi.is_none_or(|h| (b.0, !b.1) < (h.0, !h.1)) {
                hi = Some(b);
            }
        }
        if lo.is_none() && hi.is_none() {
            return Ok(Some(self.builtin(Builtin::Number)?));
        }
        if let (Some(l), Some(h)) = (lo, hi) {
            if l.0 > h.0 || (l.0 == h.0 && (l.1 || h.1)) {
                return self.nothing(path, "no number lies between minimum and maximum");
            }
        }
        Ok(Some(number_range(lo, hi)))
    }

    fn string(&mut self, m: &Map<String, Value>, path: &str) -> Out {
        let min = count(m, "minLength", path)?.unwrap_or(0);
        let max = count(m, "maxLength", path)?;
        if max.is_some_and(|max| min > max) {
            return self.nothing(path, "minLength is above maxLength");
        }
        let text = |k: &str| m.get(k).map(|v| v.as_str().ok_or_else(|| invalid(path, format!("{k} must be a string"))));
        let (keyword, pattern) = match (text("pattern").transpose()?, text("format").transpose()?) {
            (Some(_), Some(_)) => return Err(unsupported("format (alongside pattern)", path)),
            (Some(p), None) => {
                ("pattern", regex::parse(p).map_err(|e| invalid(path, format!("pattern {p:?} cannot be used: {e}")))?)
            }
            (None, Some(f)) => {
                let re = format_regex(f).ok_or_else(|| unsupported(format!("format: {f:?}"), path))?;
                ("format", regex::parse(&re).expect("the format expressions parse"))
            }
            (None, None) => {
                let quote = Expr::lit("\"");
                return Ok(Some(match (min, max) {
                    (0, None) => self.builtin(Builtin::String)?,
                    (_, Some(0)) => Expr::lit("\"\""),
                    _ => Expr::cat([quote.clone(), self.builtin(Builtin::Char)?.repeat(min, max), quote]),
                }));
            }
        };
        let pattern = match pattern.restrict_length(min, max) {
            Ok(p) => p,
            Err(LengthError::Contradiction) => {
                return self
                    .nothing(path, format!("no string of the {keyword} has a length allowed by minLength/maxLength"));
            }
            Err(LengthError::Unsupported) => {
                let k = if max.is_some() { "maxLength" } else { "minLength" };
                return Err(unsupported(format!("{k} (alongside this {keyword})"), path));
            }
        };
        let any_char = self.builtin(Builtin::Char)?;
        Ok(Some(match pattern.to_gbnf(&any_char.text) {
            Some(body) => Expr::cat([Expr::lit("\""), body, Expr::lit("\"")]),
            None => Expr::lit("\"\""),
        }))
    }

    fn array(&mut self, m: &Map<String, Value>, path: &str, hint: &str) -> Out {
        // The tuple and the schema of the items after it: 2020-12's prefixItems
        // and items, or the drafts before it's items (an array) and additionalItems.
        let (prefix, rest): (&[Value], &str) = match (m.get("prefixItems"), m.get("items")) {
            (Some(_), Some(Value::Array(_))) => {
                return Err(invalid(path, "items is an array (the tuple of the drafts before 2020-12) beside prefixItems"));
            }
            (None, Some(Value::Array(a))) => (a, "additionalItems"),
            (None, _) => (&[], "items"),
            (Some(Value::Array(a)), _) => (a, "items"),
            (Some(_), _) => return Err(invalid(path, "prefixItems must be an array of schemas")),
        };
        if rest == "items" && m.contains_key("additionalItems") {
            return Err(invalid(path, "additionalItems goes with items as an array (the tuple); here it is items"));
        }
        let items = match m.get(rest) {
            None => Some(&Value::Bool(true)),
            Some(Value::Bool(false)) => None,
            Some(v @ (Value::Bool(true) | Value::Object(_))) => Some(v),
            Some(_) => return Err(invalid(path, format!("{rest} must be a schema"))),
        };
        let min = count(m, "minItems", path)?.unwrap_or(0);
        let max = count(m, "maxItems", path)?;
        let free =
            |v: &Value| *v == Value::Bool(true) || v.as_object().is_some_and(|o| constraints(o).next().is_none());
        if prefix.is_empty() && items.is_some_and(free) && min == 0 && max.is_none() {
            return Ok(Some(self.builtin(Builtin::Array)?));
        }
        let keys = if rest == "items" { ("prefixItems", "items") } else { ("items", "additionalItems") };
        self.after_byte(|c| c.array_body(prefix, items, keys, min, max, path, hint))
    }

    /// `keys`: what the schema calls the tuple and the items after it (for the paths of errors).
    #[allow(clippy::too_many_arguments)]
    fn array_body(
        &mut self,
        prefix: &[Value],
        items: Option<&Value>,
        keys: (&str, &str),
        min: u64,
        max: Option<u64>,
        path: &str,
        hint: &str,
    ) -> Out {
        // Positions that can hold an element: the tuple, then `items`; a
        // position whose schema matches nothing ends the array there.
        let mut cap: Option<u64> = items.is_none().then_some(prefix.len() as u64);
        let mut positions = Vec::new();
        for (i, s) in prefix.iter().enumerate() {
            if max.is_some_and(|max| i as u64 >= max) {
                break;
            }
            match self.atom(s, &child(&child(path, keys.0), &i.to_string()), &format!("{hint}-{i}"))? {
                Some(e) => positions.push(e),
                None => {
                    cap = Some(i as u64);
                    break;
                }
            }
        }
        let mut item = None;
        if cap.is_none() && max.is_none_or(|max| max > prefix.len() as u64) {
            let s = items.expect("no cap without items");
            item = self.atom(s, &child(path, keys.1), &format!("{hint}-item"))?;
            if item.is_none() {
                cap = Some(prefix.len() as u64);
            }
        }
        let max = match (max, cap) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if max.is_some_and(|max| min > max) {
            return self.nothing(path, format!("no array of at least {min} items matches the schema"));
        }
        let space = self.builtin(Builtin::Space)?;
        if max == Some(0) {
            return Ok(Some(Expr::cat([Expr::lit("["), space, Expr::lit("]")])));
        }
        if positions.is_empty() {
            positions.push(item.clone().expect("an array of one item or more has an item schema"));
        }
        let explicit = positions.len() as u64;
        let sep = |e: Expr| Expr::cat([Expr::lit(","), space.clone(), e]);
        let mut acc = match (&item, max.map(|m| m - explicit)) {
            (_, Some(0)) | (None, _) => None,
            (Some(item), more) => Some(sep(item.clone()).repeat(min.saturating_sub(explicit), more)),
        };
        for (i, e) in positions.into_iter().enumerate().rev() {
            let head = if i == 0 { e } else { sep(e) };
            let chunk = Expr::cat(std::iter::once(head).chain(acc));
            acc = Some(if i == 0 || (i as u64) < min { chunk } else { chunk.optional() });
        }
        let body = acc.expect("at least one position");
        Ok(Some(if min == 0 {
            Expr::cat([Expr::lit("["), space.clone(), Expr::cat([body, space]).optional(), Expr::lit("]")])
        } else {
            Expr::cat([Expr::lit("["), space.clone(), body, space, Expr::lit("]")])
        }))
    }

    fn object(&mut self, m: &Map<String, Value>, path: &str, hint: &str) -> Out {
        let props = match m.get("properties") {
            None => None,
            Some(Value::Object(p)) => Some(p),
            Some(_) => return Err(invalid(path, "properties must be an object")),
        };
        let mut required: Vec<&str> = Vec::new();
        match m.get("required") {
            None => {}
            Some(Value::Array(a)) => {
                for r in a {
                    let r = r.as_str().ok_or_else(|| invalid(path, "required must be an array of strings"))?;
                    if !required.contains(&r) {
                        required.push(r);
                    }
                }
            }
            Some(_) => return Err(invalid(path, "required must be an array of strings")),
        }
        let additional = m.get("additionalProperties");
        if additional.is_some_and(|a| !a.is_boolean() && !a.is_object()) {
            return Err(invalid(path, "additionalProperties must be a schema"));
        }
        if props.is_none() && required.is_empty() && additional.is_none_or(|a| *a == Value::Bool(true)) {
            return Ok(Some(self.builtin(Builtin::Object)?));
        }
        self.after_byte(|c| c.object_body(props, &required, additional, path, hint))
    }

    fn object_body(
        &mut self,
        props: Option<&Map<String, Value>>,
        required: &[&str],
        additional: Option<&Value>,
        path: &str,
        hint: &str,
    ) -> Out {
        let any = Value::Bool(true);
        // Extra properties: none when `additionalProperties` is absent but
        // `properties` present (see the module docs)...
        let extra = match additional {
            None if props.is_some() => None,
            None => Some(&any),
            Some(Value::Bool(false)) => None,
            Some(a) => Some(a),
        };
        // ...though a required property not in `properties` is still
        // allowed then, with any value.
        let undeclared = match additional {
            None => Some(&any),
            Some(Value::Bool(false)) => None,
            Some(a) => Some(a),
        };
        let mut names: Vec<&str> = Vec::new();
        let mut members = Vec::new();
        for (name, s) in props.into_iter().flatten() {
            names.push(name);
            let p = child(&child(path, "properties"), name);
            let is_required = required.contains(&name.as_str());
            match self.atom(s, &p, &format!("{hint}-{}", sanitize(name)))? {
                Some(value) => {
                    let pair = self.pair(Expr::lit(&format!("\"{}\"", json_escape(name))), value)?;
                    members.push(Member { pair, required: is_required, repeated: false });
                }
                None if is_required => return Ok(None),
                // A property no value can fill must be left out.
                None => {}
            }
        }
        let undeclared_names: Vec<&str> = required.iter().copied().filter(|r| !names.contains(r)).collect();
        for name in undeclared_names {
            let Some(s) = undeclared else {
                return self.nothing(path, format!("required property {name:?} is forbidden by additionalProperties"));
            };
            names.push(name);
            let Some(value) =
                self.atom(s, &child(path, "additionalProperties"), &format!("{hint}-{}", sanitize(name)))?
            else {
                return Ok(None);
            };
            let pair = self.pair(Expr::lit(&format!("\"{}\"", json_escape(name))), value)?;
            members.push(Member { pair, required: true, repeated: false });
        }
        if let Some(s) = extra {
            let value = self.atom(s, &child(path, "additionalProperties"), &format!("{hint}-additional"))?;
            if let Some(value) = value {
                let key =
                    if names.is_empty() { self.builtin(Builtin::String)? } else { self.key_excluding(&names, hint)? };
                let pair = self.pair(key, value)?;
                let pair = self.define(&format!("{hint}-additional-kv"), pair)?;
                members.push(Member { pair, required: false, repeated: true });
            }
        }
        let space = self.builtin(Builtin::Space)?;
        let open = Expr::cat([Expr::lit("{"), space.clone()]);
        if members.is_empty() {
            return Ok(Some(Expr::cat([open, Expr::lit("}")])));
        }
        let body = self.members(&members, hint, &space)?;
        Ok(Some(if members.iter().any(|m| m.required) {
            Expr::cat([open, body, space, Expr::lit("}")])
        } else {
            Expr::cat([open, Expr::cat([body, space]).optional(), Expr::lit("}")])
        }))
    }

    /// The members of a non-empty object, in order, separated by commas:
    /// required ones always, optional ones in any subset, the repeated
    /// extra pair any number of times. Which member comes first decides
    /// where the commas go, so there is one alternative per possible first
    /// member (those up to the first required one), each followed by a
    /// chain of `rest` rules for what may come after.
    fn members(&mut self, members: &[Member], hint: &str, space: &Expr) -> Result<Expr> {
        let seg = |m: &Member| {
            let s = Expr::cat([Expr::lit(","), space.clone(), m.pair.clone()]);
            if m.repeated {
                s.repeat(0, None)
            } else if m.required {
                s
            } else {
                s.optional()
            }
        };
        // The pair opening the body when `m` is written first.
        let first = |m: &Member| {
            if m.repeated {
                Expr::cat([m.pair.clone(), seg(m)])
            } else {
                m.pair.clone()
            }
        };
        let n = members.len();
        let firsts = members.iter().position(|m| m.required).map_or(n, |r| r + 1);
        if firsts == 1 {
            return Ok(Expr::cat(std::iter::once(first(&members[0])).chain(members[1..].iter().map(seg))));
        }
        // rest[j]: everything after member j - 1 once something is written.
        let mut rest: Vec<Option<Expr>> = vec![None; n + 1];
        if firsts < n {
            let tail = Expr::cat(members[firsts..].iter().map(seg));
            rest[firsts] = Some(self.define(&format!("{hint}-rest-{firsts}"), tail)?);
        }
        for j in (1..firsts).rev() {
            let body = Expr::cat(std::iter::once(seg(&members[j])).chain(rest[j + 1].clone()));
            rest[j] = Some(self.define(&format!("{hint}-rest-{j}"), body)?);
        }
        let alts: Vec<Expr> = (0..firsts)
            .map(|i| {
                // The repeated pair is always last, and `first` already
                // includes its repetition.
                let after = if members[i].repeated { None } else { rest[i + 1].clone() };
                Expr::cat(std::iter::once(first(&members[i])).chain(after))
            })
            .collect();
        Ok(Expr::alt(alts))
    }

    /// A quoted key other than `names`, through a trie of their JSON
    /// spellings: at each node the key may end (unless that spells a name),
    /// go on with a character leading to another name, or leave the trie
    /// with any other character. A key spelling a name with other escapes
    /// (`"\u0061"` for `"a"`) is not recognised as that name.
    fn key_excluding(&mut self, names: &[&str], hint: &str) -> Result<Expr> {
        struct Node {
            children: Vec<(String, usize)>,
            is_name: bool,
        }
        let mut nodes = vec![Node { children: Vec::new(), is_name: false }];
        for name in names {
            let mut at = 0;
            for c in name.chars() {
                let unit = json_escape(&c.to_string());
                at = match nodes[at].children.iter().find(|(u, _)| *u == unit) {
                    Some(&(_, next)) => next,
                    None => {
                        nodes.push(Node { children: Vec::new(), is_name: false });
                        let next = nodes.len() - 1;
                        nodes[at].children.push((unit, next));
                        next
                    }
                };
            }
            nodes[at].is_name = true;
        }
        let slots: Vec<Slot> = (0..nodes.len()).map(|_| self.reserve(&format!("{hint}-key"))).collect();
        let names_of: Vec<String> = slots.iter().map(|s| s.name.clone()).collect();
        let any_char = self.builtin(Builtin::Char)?;
        let quote = Expr::lit("\"");
        for (node, slot) in nodes.iter().zip(slots) {
            let mut alts = Vec::new();
            if !node.is_name {
                alts.push(quote.clone());
            }
            for (unit, next) in &node.children {
                alts.push(Expr::cat([Expr::lit(unit), Expr::atom(names_of[*next].clone())]));
            }
            alts.push(Expr::cat([other_char(&node.children), any_char.repeat(0, None), quote.clone()]));
            self.fill(slot, Expr::alt(alts))?;
        }
        Ok(Expr::cat([quote, Expr::atom(names_of[0].clone())]))
    }
}

/// Any JSON string character except the spellings in `taken` (raw
/// characters and short escapes; `\u` escapes are not told apart).
fn other_char(taken: &[(String, usize)]) -> Expr {
    let mut excluded: Vec<char> = (0..0x20u8).map(char::from).chain(['"', '\\', '\x7f']).collect();
    let mut letters: Vec<char> = vec!['"', '\\', '/', 'b', 'f', 'n', 'r', 't'];
    for (unit, _) in taken {
        let mut chars = unit.chars();
        match (chars.next(), chars.next(), chars.next()) {
            (Some('\\'), Some(l), None) => letters.retain(|&x| x != l),
            (Some(c), None, _) => excluded.push(c),
            _ => {}
        }
    }
    let raw = Expr::atom(regex::class(&regex::ranges_of(excluded), true));
    let mut escapes = vec![Expr::cat([Expr::lit("u"), Expr::atom("[0-9a-fA-F]").repeat(4, Some(4))])];
    if !letters.is_empty() {
        escapes.insert(0, Expr::atom(regex::class(&regex::ranges_of(letters), false)));
    }
    Expr::alt([raw, Expr::cat([Expr::lit("\\"), Expr::alt(escapes)])])
}

/// `%XX` escapes decoded, as a `$ref` fragment may carry them.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The regular expression of a supported `format`, anchored.
fn format_regex(format: &str) -> Option<String> {
    // RFC 3339 full-date, with the days of each month and leap years.
    const DATE: &str = concat!(
        "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29",
        "|[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])",
        "|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))",
    );
    // RFC 3339 full-time: the offset is required; no leap second.
    const TIME: &str =
        r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,9})?(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
    // A dot-atom local part and a host name: a safe subset of RFC 5321.
    // Every run is bounded (fractions to nanoseconds above, atoms and labels
    // here), so a small model cannot write an address that never ends.
    const EMAIL: &str = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]{1,32}(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]{1,32}){0,3}@[A-Za-z0-9]{1,24}(?:-[A-Za-z0-9]{1,24}){0,3}(?:\.[A-Za-z0-9]{1,24}(?:-[A-Za-z0-9]{1,24}){0,3}){0,4}";
    const UUID: &str = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
    let re = match format {
        "date" => DATE.to_owned(),
        "time" => TIME.to_owned(),
        "date-time" => format!("(?:{DATE})[Tt]{TIME}"),
        "uuid" => UUID.to_owned(),
        "email" => EMAIL.to_owned(),
        _ => return None,
    };
    Some(format!("^(?:{re})$"))
}

/// Decimal integers in `lo..=hi` (either end open), written canonically.
fn int_range(lo: Option<i128>, hi: Option<i128>) -> Expr {
    let mut alts = Vec::new();
    if lo.is_none_or(|l| l < 0) {
        let magnitude_lo = match hi {
            Some(h) if h < 0 => h.unsigned_abs(),
            _ => 1,
        };
        alts.push(Expr::cat([Expr::lit("-"), uint_range(magnitude_lo, lo.map(i128::unsigned_abs))]));
    }
    if hi.is_none_or(|h| h >= 0) {
        let from = lo.map_or(0, |l| l.max(0).unsigned_abs());
        alts.push(uint_range(from, hi.map(i128::unsigned_abs)));
    }
    Expr::alt(alts)
}

/// Decimal numbers without exponent between the bounds `(value, exclusive)`.
/// A number is an integer part and a fraction; only the integer parts equal
/// to a bound need a look at the fraction. `-0` is never written.
fn number_range(lo: Option<(i128, bool)>, hi: Option<(i128, bool)>) -> Expr {
    let mut alts = Vec::new();
    // x < 0, written "-" and its magnitude t = -x > 0.
    if lo.is_none_or(|l| l.0 < 0) {
        let t_lo = match hi {
            Some((h, exclusive)) if h < 0 => (h.unsigned_abs(), exclusive),
            _ => (0, true),
        };
        let t_hi = lo.map(|(l, exclusive)| (l.unsigned_abs(), exclusive));
        alts.extend(magnitude_range(t_lo, t_hi).map(|m| Expr::cat([Expr::lit("-"), m])));
    }
    // x >= 0.
    if hi.is_none_or(|h| h.0 > 0 || (h.0 == 0 && !h.1)) {
        let t_lo = match lo {
            Some((l, exclusive)) if l >= 0 => (l.unsigned_abs(), exclusive),
            _ => (0, false),
        };
        let t_hi = hi.map(|(h, exclusive)| (h.unsigned_abs(), exclusive));
        alts.extend(magnitude_range(t_lo, t_hi));
    }
    Expr::alt(alts)
}

/// Most digits an unbounded integer part, or any fraction, is written with
/// (llama.cpp's choice): JSON allows more, but a small model left an
/// unbounded run of digits may never stop.
const MAX_DIGITS: u64 = 16;

/// Unsigned decimals `I(.F)?` between integer bounds `(value, exclusive)`.
fn magnitude_range(lo: (u128, bool), hi: Option<(u128, bool)>) -> Option<Expr> {
    let digits = || Expr::atom("[0-9]");
    let max = Some(MAX_DIGITS);
    let any_fraction = Expr::cat([Expr::lit("."), digits().repeat(1, max)]).optional();
    let zero_fraction = Expr::cat([Expr::lit("."), Expr::lit("0").repeat(1, max)]).optional();
    let nonzero_fraction = Expr::cat([
        Expr::lit("."),
        Expr::lit("0").repeat(0, Some(MAX_DIGITS - 1)),
        Expr::atom("[1-9]"),
        digits().repeat(0, Some(MAX_DIGITS - 1)),
    ]);
    let mut alts = Vec::new();
    // Integer parts strictly inside the bounds take any fraction.
    let inner_lo = if lo.1 { lo.0 + 1 } else { lo.0 };
    match hi.map(|h| h.0.checked_sub(1)) {
        None => alts.push(Expr::cat([uint_range(inner_lo, None), any_fraction])),
        Some(Some(inner_hi)) if inner_hi >= inner_lo => {
            alts.push(Expr::cat([uint_range(inner_lo, Some(inner_hi)), any_fraction]))
        }
        Some(_) => {}
    }
    // Just above an exclusive lower bound.
    if lo.1 && hi.is_none_or(|h| lo.0 < h.0) {
        alts.push(Expr::cat([Expr::lit(&lo.0.to_string()), nonzero_fraction]));
    }
    // Exactly an inclusive upper bound.
    if let Some((h, false)) = hi {
        if h > lo.0 || (h == lo.0 && !lo.1) {
            alts.push(Expr::cat([Expr::lit(&h.to_string()), zero_fraction]));
        }
    }
    (!alts.is_empty()).then(|| Expr::alt(alts))
}

/// Decimal naturals in `lo..=hi` (`hi` open when `None`), without leading
/// zeros, as digit-by-digit ranges per length (llama.cpp's technique).
fn uint_range(lo: u128, hi: Option<u128>) -> Expr {
    let lo_digits = lo.to_string();
    let len = lo_digits.len();
    let Some(hi) = hi else {
        // From the smallest number of its length on, every longer one follows.
        let smallest = lo_digits.starts_with('1') && lo_digits[1..].bytes().all(|d| d == b'0');
        let longer = |min_rest: usize| {
            let rest = (min_rest as u64).min(MAX_DIGITS - 1);
            Expr::cat([Expr::atom("[1-9]"), Expr::atom("[0-9]").repeat(rest, Some(MAX_DIGITS - 1))])
        };
        return match (lo, smallest) {
            (0, _) => Expr::alt([Expr::lit("0"), longer(0)]),
            (_, true) => longer(len - 1),
            _ => Expr::alt([same_length(lo_digits.as_bytes(), "9".repeat(len).as_bytes()), longer(len)]),
        };
    };
    let hi_digits = hi.to_string();
    let mut alts = Vec::new();
    for l in len..=hi_digits.len() {
        let from = if l == len { lo_digits.clone() } else { format!("1{}", "0".repeat(l - 1)) };
        let to = if l == hi_digits.len() { hi_digits.clone() } else { "9".repeat(l) };
        alts.push(same_length(from.as_bytes(), to.as_bytes()));
    }
    Expr::alt(alts)
}

/// Digit strings of one length in `x..=y`: a shared first digit, or the
/// three bands x₀ then above x's rest, the digits strictly between, y₀ then
/// below y's rest.
fn same_length(x: &[u8], y: &[u8]) -> Expr {
    let digit = |d: u8| Expr::lit(&char::from(d).to_string());
    let (x0, y0) = (x[0], y[0]);
    let rest = x.len() - 1;
    if x0 == y0 {
        return if rest == 0 { digit(x0) } else { Expr::cat([digit(x0), same_length(&x[1..], &y[1..])]) };
    }
    let x_low = x[1..].iter().all(|&d| d == b'0');
    let y_high = y[1..].iter().all(|&d| d == b'9');
    let mut alts = Vec::new();
    let mid_lo = if x_low { x0 } else { x0 + 1 };
    let mid_hi = if y_high { y0 } else { y0 - 1 };
    if !x_low {
        alts.push(Expr::cat([digit(x0), same_length(&x[1..], &vec![b'9'; rest])]));
    }
    if mid_lo <= mid_hi {
        let band = if mid_lo == mid_hi {
            digit(mid_lo)
        } else {
            Expr::atom(regex::class(&[(char::from(mid_lo), char::from(mid_hi))], false))
        };
        alts.push(if rest == 0 {
            band
        } else {
            Expr::cat([band, Expr::atom("[0-9]").repeat(rest as u64, Some(rest as u64))])
        });
    }
    if !y_high {
        alts.push(Expr::cat([digit(y0), same_length(&vec![b'0'; rest], &y[1..])]));
    }
    Expr::alt(alts)
}
