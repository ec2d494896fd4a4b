//! JSON Schema to GBNF, checked through the automaton: documents that
//! validate are accepted, documents that do not are refused, and keywords
//! outside the subset are refused by name.

use ember_grammar::{json_object_gbnf, json_schema_to_gbnf, schema_rules, Automaton, SchemaError};
use serde_json::{json, Map, Value};

fn grammar(schema: &Value) -> String {
    json_schema_to_gbnf(schema).unwrap_or_else(|e| panic!("{schema} does not compile: {e}"))
}

fn automaton(text: &str) -> Automaton {
    Automaton::from_gbnf(text).unwrap_or_else(|e| panic!("the grammar does not load: {e}\n{text}"))
}

/// Asserts that `schema` accepts every `good` document and refuses every `bad` one.
fn check(schema: Value, good: &[&str], bad: &[&str]) {
    let g = grammar(&schema);
    let a = automaton(&g);
    for d in good {
        assert!(a.accepts(d.as_bytes()), "should accept {d}\nschema: {schema}\n{g}");
    }
    for d in bad {
        assert!(!a.accepts(d.as_bytes()), "should refuse {d}\nschema: {schema}\n{g}");
    }
}

fn unsupported(schema: Value) -> (String, String) {
    match json_schema_to_gbnf(&schema) {
        Err(SchemaError::Unsupported { keyword, path }) => (keyword, path),
        other => panic!("expected Unsupported for {schema}, got {other:?}"),
    }
}

fn invalid(schema: Value) -> (String, String) {
    match json_schema_to_gbnf(&schema) {
        Err(SchemaError::Invalid { path, msg }) => (path, msg),
        other => panic!("expected Invalid for {schema}, got {other:?}"),
    }
}

/// `pairs` as a compact JSON object, in the order the schema's `properties`
/// map lists them (the order the grammar requires).
fn ordered(properties: &Value, pairs: &[(&str, &str)]) -> String {
    let order: Vec<&String> = properties.as_object().unwrap().keys().collect();
    let mut pairs = pairs.to_vec();
    pairs.sort_by_key(|(k, _)| order.iter().position(|o| o == k).expect("a declared property"));
    let body: Vec<String> = pairs.iter().map(|(k, v)| format!("{}: {v}", json!(k))).collect();
    format!("{{{}}}", body.join(", "))
}

#[test]
fn primitive_types() {
    check(
        json!({"type": "string"}),
        &[r#""""#, r#""a b""#, r#""\"\\\/\b\f\n\r\t\u00e9""#, "\"日本\""],
        &["\"a", "\"\n\"", r#""\x""#, "1", r#""\u12""#],
    );
    check(
        json!({"type": "integer"}),
        &["0", "-7", "1234567890123456"],
        // Unbounded integers stop at 16 digits, as llama.cpp's do: a small
        // model left an endless run of digits may never close the document.
        &["01", "1.5", "1e3", "+1", "-", "\"1\"", "12345678901234567"],
    );
    check(json!({"type": "number"}), &["0", "-0.5", "3.25", "1e5", "-2.5E-3", "10"], &["01", ".5", "1.", "1e", "--1"]);
    check(json!({"type": "boolean"}), &["true", "false"], &["True", "1", "null"]);
    check(json!({"type": "null"}), &["null"], &["nul", "\"null\""]);
    check(json!({"type": ["string", "null"]}), &["null", "\"x\""], &["1"]);
    check(json!({"type": ["integer", "number"]}), &["1", "1.5"], &["\"1\""]);
}

#[test]
fn any_value() {
    let good = ["1", "\"s\"", "null", "[1, {\"a\": [true]}]", "{}", "{\"k\": {\"j\": []}}"];
    check(json!({}), &good, &["", "{", "[1,]", "{\"a\"}"]);
    check(json!(true), &good, &["nope"]);
    check(json!({"title": "anything", "description": "no constraint"}), &good, &[]);
    assert!(invalid(json!(false)).1.contains("false"));
}

#[test]
fn json_object_grammar() {
    let a = automaton(&json_object_gbnf());
    for good in ["{}", "{ }", "{\"a\": [1, {\"b\": null}], \"c\": \"d\"}", "{\n  \"x\": 1.5e3\n}"] {
        assert!(a.accepts(good.as_bytes()), "{good}");
    }
    for bad in ["[]", "\"x\"", "1", "{\"a\" 1}", "{} "] {
        assert!(!a.accepts(bad.as_bytes()), "{bad}");
    }
}

#[test]
fn whitespace_is_bounded_and_only_inside() {
    let s = json!({"type": "object", "properties": {"a": {"type": "array"}}, "required": ["a"]});
    let tabs = "\t".repeat(20);
    check(
        s,
        &[
            r#"{"a":[]}"#,
            r#"{"a": [1, 2]}"#,
            "{\n  \"a\": [\n    1,\n    2\n  ]\n}",
            &format!("{{\n{tabs}\"a\": []}}"),
            "{ \"a\": [ ] }",
        ],
        &[
            r#" {"a":[]}"#,
            r#"{"a":[]} "#,
            r#"{"a" :[]}"#,
            r#"{"a":[1 ,2]}"#,
            r#"{  "a":[]}"#,
            &format!("{{\n{tabs}\t\"a\": []}}"),
        ],
    );
}

#[test]
fn objects_required_optional_and_extra() {
    let props = json!({"a": {"type": "integer"}, "b": {"type": "string"}});
    let s = json!({"type": "object", "properties": props, "required": ["a"]});
    check(
        s.clone(),
        &[&ordered(&props, &[("a", "1")]), &ordered(&props, &[("a", "1"), ("b", "\"x\"")])],
        &["{}", &ordered(&props, &[("b", "\"x\"")]), r#"{"a": 1, "c": 2}"#, r#"{"a": "1"}"#, r#"{"a": 1,}"#],
    );
    // additionalProperties absent (with properties) and false: declared only.
    let mut closed = s.clone();
    closed["additionalProperties"] = json!(false);
    check(closed, &[r#"{"a": 1}"#], &[r#"{"a": 1, "z": 2}"#]);
    // true: extras after the declared ones, never repeating a declared name.
    let mut open = s.clone();
    open["additionalProperties"] = json!(true);
    check(
        open,
        &[r#"{"a": 1}"#, r#"{"a": 1, "z": [2], "y": null}"#, r#"{"a": 1, "aa": 0, "": 1}"#],
        &[r#"{"a": 1, "a": 2}"#, r#"{"a": 1, "b": 2}"#, r#"{"z": 1}"#],
    );
    // A schema: extras' values follow it.
    let mut typed = s;
    typed["additionalProperties"] = json!({"type": "boolean"});
    check(typed, &[r#"{"a": 1, "z": true}"#], &[r#"{"a": 1, "z": 1}"#]);
    // No properties: any object, or objects of given values.
    check(json!({"type": "object"}), &["{}", r#"{"q": [1]}"#], &["[]"]);
    check(
        json!({"type": "object", "additionalProperties": {"type": "integer"}}),
        &["{}", r#"{"q": 1, "r": 2}"#],
        &[r#"{"q": "1"}"#],
    );
    // A required property not declared: any value.
    check(
        json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]}),
        &[r#"{"a": 1, "b": [null]}"#],
        &[r#"{"a": 1}"#, r#"{"b": 1, "a": 1}"#],
    );
    // A property whose schema is false is left out.
    check(
        json!({"type": "object", "properties": {"a": false, "b": {"type": "null"}}, "additionalProperties": true}),
        &["{}", r#"{"b": null}"#, r#"{"c": 1}"#],
        &[r#"{"a": 1}"#],
    );
    // Keys needing escapes.
    check(
        json!({"type": "object", "properties": {"q\"x": {"type": "null"}, "tab\t": {"type": "null"}}, "required": ["q\"x", "tab\t"]}),
        &[r#"{"q\"x": null, "tab\t": null}"#],
        &[r#"{"q"x": null, "tab\t": null}"#],
    );
}

#[test]
fn optional_properties_in_any_subset_in_order() {
    // a, c, e optional; b, d required.
    let props = json!({
        "a": {"const": 1}, "b": {"const": 2}, "c": {"const": 3}, "d": {"const": 4}, "e": {"const": 5}
    });
    let names = ["a", "b", "c", "d", "e"];
    let s = json!({"type": "object", "properties": props, "required": ["b", "d"]});
    let a = automaton(&grammar(&s));
    for mask in 0..32u32 {
        let chosen: Vec<usize> = (0..5).filter(|i| mask & (1 << i) != 0).collect();
        let doc = format!(
            "{{{}}}",
            chosen.iter().map(|&i| format!("\"{}\": {}", names[i], i + 1)).collect::<Vec<_>>().join(", ")
        );
        let valid = chosen.contains(&1) && chosen.contains(&3);
        assert_eq!(a.accepts(doc.as_bytes()), valid, "{doc}");
    }
    assert!(!a.accepts(br#"{"d": 4, "b": 2}"#), "out of order");
    // All optional, with extras.
    let s = json!({"type": "object", "properties": {"a": {"const": 1}, "b": {"const": 2}}, "additionalProperties": {"const": 0}});
    check(
        s,
        &[
            "{}",
            r#"{"b": 2}"#,
            r#"{"a": 1, "b": 2}"#,
            r#"{"a": 1, "x": 0}"#,
            r#"{"x": 0, "y": 0}"#,
            r#"{"b": 2, "x": 0}"#,
        ],
        &[r#"{"x": 0, "a": 1}"#, r#"{"b": 2, "a": 1}"#, r#"{,}"#, r#"{"a": 1,}"#],
    );
}

#[test]
fn arrays() {
    check(
        json!({"type": "array", "items": {"type": "integer"}}),
        &["[]", "[1]", "[1, 2, 3]", "[\n  1,\n  2\n]"],
        &["[1,]", "[\"a\"]", "[,1]", "{}"],
    );
    check(
        json!({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}),
        &["[1, 2]", "[1, 2, 3]"],
        &["[]", "[1]", "[1, 2, 3, 4]"],
    );
    check(json!({"type": "array", "minItems": 1}), &["[null]", "[1, \"a\"]"], &["[]"]);
    check(json!({"type": "array", "maxItems": 0}), &["[]", "[ ]"], &["[1]"]);
    // A tuple: shorter prefixes are allowed unless minItems says otherwise.
    let tuple = json!({"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": false});
    check(tuple.clone(), &["[]", "[\"a\"]", "[\"a\", true]"], &["[true]", "[\"a\", true, 1]", "[\"a\", 1]"]);
    let mut exact = tuple;
    exact["minItems"] = json!(2);
    check(exact, &["[\"a\", false]"], &["[\"a\"]", "[]"]);
    check(
        json!({"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"}, "minItems": 2}),
        &["[\"a\", 1]", "[\"a\", 1, 2]"],
        &["[\"a\"]", "[\"a\", \"b\"]", "[1, 1]"],
    );
    check(
        json!({"type": "array", "prefixItems": [{"type": "string"}, {"type": "string"}], "maxItems": 1}),
        &["[]", "[\"a\"]"],
        &["[\"a\", \"b\"]"],
    );
    // Large bounds stay compilable.
    check(json!({"type": "array", "items": {"type": "null"}, "maxItems": 500}), &["[null, null]"], &["[1]"]);
    // The drafts before 2020-12 spell the tuple `items: [...]`, the rest `additionalItems` (any, by default).
    check(
        json!({"items": [{"type": "integer"}]}),
        &["[]", "[-3000]", "[1, \"a\", null]"],
        &["[\"a\"]", "[1.5]"],
    );
    check(
        json!({"type": "array", "items": [{"type": "string"}], "additionalItems": false}),
        &["[]", "[\"a\"]"],
        &["[\"a\", 1]", "[2]"],
    );
    check(
        json!({"type": "array", "items": [{"type": "string"}], "additionalItems": {"type": "integer"}, "minItems": 2}),
        &["[\"a\", 1]", "[\"a\", 1, 2]"],
        &["[\"a\"]", "[\"a\", \"b\"]"],
    );
}

#[test]
fn string_lengths_count_characters() {
    let s = json!({"type": "string", "minLength": 2, "maxLength": 3});
    check(
        s,
        &[r#""ab""#, r#""abc""#, r#""a\nb""#, r#""\u00e9\"""#, "\"日本語\"", "\"😀😀\"", r#""\\\\""#],
        &[r#""a""#, r#""abcd""#, r#""\n""#, "\"日本語x\"", "\"😀\"", r#""""#],
    );
    check(json!({"type": "string", "maxLength": 0}), &[r#""""#], &[r#""a""#]);
    check(json!({"type": "string", "minLength": 1}), &[r#""a""#], &[r#""""#]);
}

#[test]
fn patterns() {
    check(json!({"type": "string", "pattern": "^[a-z]+$"}), &[r#""abc""#], &[r#""""#, r#""aBc""#, r#""abc ""#]);
    check(
        json!({"type": "string", "pattern": r"^\d{3}-\d{4}$"}),
        &[r#""555-1234""#],
        &[r#""5555-123""#, r#""555-123""#],
    );
    check(json!({"pattern": "^(cat|dog)s?$"}), &[r#""cat""#, r#""dogs""#], &[r#""cow""#, r#""catss""#, "1"]);
    // Unanchored: anywhere in the string.
    check(
        json!({"type": "string", "pattern": "ab"}),
        &[r#""ab""#, r#""xaby""#, r#""x\nab""#],
        &[r#""a b""#, r#""ba""#],
    );
    check(json!({"type": "string", "pattern": "^ab"}), &[r#""abz""#], &[r#""zab""#]);
    check(json!({"type": "string", "pattern": "ab$"}), &[r#""zab""#], &[r#""abz""#]);
    check(json!({"type": "string", "pattern": "^a$|^b"}), &[r#""a""#, r#""bcd""#], &[r#""ab""#]);
    // Characters JSON must escape are written escaped.
    check(json!({"type": "string", "pattern": r#"^a"b\\c$"#}), &[r#""a\"b\\c""#], &[r#""a"b\c""#, r#""a\"b\c""#]);
    check(
        json!({"type": "string", "pattern": "^.{2}$"}),
        &[r#""ab""#, r#""\"\\""#, "\"é日\"", r#""\t\u0001""#],
        &[r#""a""#, r#""\n\n""#, r#""abc""#],
    );
    check(json!({"type": "string", "pattern": r#"^[^"]*$"#}), &[r#""""#, r#""a\\b\n""#], &[r#""a\"b""#]);
    check(json!({"type": "string", "pattern": "^é+$"}), &["\"éé\""], &["\"e\""]);
    check(json!({"type": "string", "pattern": "(?i)^ok$"}), &[r#""oK""#, r#""OK""#], &[r#""no""#]);
    check(json!({"type": "string", "pattern": "^(a?)*$"}), &[r#""""#, r#""aaa""#], &[r#""b""#]);
    // minLength/maxLength fold into a single repetition.
    check(
        json!({"type": "string", "pattern": "^[A-Z][a-z]*$", "minLength": 2, "maxLength": 4}),
        &[r#""Ab""#, r#""Abcd""#],
        &[r#""A""#, r#""Abcde""#],
    );
    // Or are implied by the pattern.
    check(json!({"type": "string", "pattern": "^[a-z]{3}$", "maxLength": 5}), &[r#""abc""#], &[r#""ab""#]);
    let (k, _) = unsupported(json!({"type": "string", "pattern": "^(ab)+$", "maxLength": 5}));
    assert!(k.starts_with("maxLength"), "{k}");
    for bad in ["a^b", r"\bword", "(?m)^a$", "(?=a)", r"(a)\1", "[", "a{20000}"] {
        let (path, msg) = invalid(json!({"type": "object", "properties": {"p": {"type": "string", "pattern": bad}}}));
        assert_eq!(path, "/properties/p");
        assert!(msg.contains("pattern"), "{msg}");
    }
}

#[test]
fn formats() {
    check(
        json!({"type": "string", "format": "date"}),
        &[r#""2024-02-29""#, r#""2000-02-29""#, r#""1999-12-31""#, r#""2023-04-30""#],
        &[
            r#""2023-02-29""#,
            r#""1900-02-29""#,
            r#""2023-04-31""#,
            r#""2023-13-01""#,
            r#""2023-1-01""#,
            r#""20230101""#,
        ],
    );
    check(
        json!({"type": "string", "format": "time"}),
        &[r#""12:30:00Z""#, r#""23:59:59.123+05:30""#, r#""00:00:00-08:00""#],
        &[r#""24:00:00Z""#, r#""12:60:00Z""#, r#""12:30Z""#, r#""12:30:00""#],
    );
    check(
        json!({"type": "string", "format": "date-time"}),
        &[r#""2024-01-15T08:30:00Z""#, r#""2024-01-15T08:30:00.5+01:00""#],
        &[r#""2024-01-15 08:30:00Z""#, r#""2024-01-15T08:30:00""#],
    );
    check(
        json!({"type": "string", "format": "uuid"}),
        &[r#""123e4567-e89b-12d3-a456-426614174000""#, r#""123E4567-E89B-12D3-A456-426614174000""#],
        &[
            r#""123e4567e89b12d3a456426614174000""#,
            r#""123e4567-e89b-12d3-a456-42661417400""#,
            r#""g23e4567-e89b-12d3-a456-426614174000""#,
        ],
    );
    check(
        json!({"type": "string", "format": "email"}),
        &[r#""john.doe@example.com""#, r#""a+b@mail-server.example.org""#, r#""x@localhost""#],
        &[r#""john.doe""#, r#""@example.com""#, r#""a@b@c""#, r#""a@-b.com""#, r#""a..b@c.com""#],
    );
    check(json!({"type": "string", "format": "date", "maxLength": 10}), &[r#""2024-01-01""#], &[]);
    let (k, path) = unsupported(json!({"type": "object", "properties": {"ip": {"type": "string", "format": "ipv4"}}}));
    assert!(k.starts_with("format") && k.contains("ipv4"), "{k}");
    assert_eq!(path, "/properties/ip");
}

fn int_schema(lo: Option<(i64, bool)>, hi: Option<(i64, bool)>) -> Value {
    let mut s = json!({"type": "integer"});
    if let Some((v, excl)) = lo {
        s[if excl { "exclusiveMinimum" } else { "minimum" }] = json!(v);
    }
    if let Some((v, excl)) = hi {
        s[if excl { "exclusiveMaximum" } else { "maximum" }] = json!(v);
    }
    s
}

fn in_bounds(x: f64, lo: Option<(i64, bool)>, hi: Option<(i64, bool)>) -> bool {
    let above = lo.is_none_or(|(l, e)| if e { x > l as f64 } else { x >= l as f64 });
    let below = hi.is_none_or(|(h, e)| if e { x < h as f64 } else { x <= h as f64 });
    above && below
}

#[test]
fn integer_bounds_are_exact() {
    let bounds: &[(Option<i64>, Option<i64>)] = &[
        (Some(-5), Some(120)),
        (Some(0), None),
        (None, Some(-3)),
        (None, Some(0)),
        (Some(-1234), Some(-17)),
        (Some(7), Some(7)),
        (Some(95), Some(1005)),
        (Some(-999), Some(999)),
        (Some(10), Some(99)),
        (Some(1), Some(1000)),
        (Some(-100), None),
        (Some(199), None),
        (Some(200), None),
        (Some(0), Some(0)),
    ];
    for &(lo, hi) in bounds {
        for (lo_excl, hi_excl) in [(false, false), (true, false), (false, true), (true, true)] {
            let lo = lo.map(|v| (v, lo_excl));
            let hi = hi.map(|v| (v, hi_excl));
            let s = int_schema(lo, hi);
            let g = match json_schema_to_gbnf(&s) {
                Ok(g) => g,
                // An empty range, such as (7, 7).
                Err(SchemaError::Invalid { .. }) => {
                    assert!((-1500..=1500).all(|n| !in_bounds(n as f64, lo, hi)), "{s}");
                    continue;
                }
                Err(e) => panic!("{s}: {e}"),
            };
            let a = automaton(&g);
            for n in -1500i64..=1500 {
                assert_eq!(a.accepts(n.to_string().as_bytes()), in_bounds(n as f64, lo, hi), "{n} against {s}\n{g}");
            }
            for n in ["123456789012", "-123456789012", "01", "-0", "00"] {
                let expected = n.parse::<i64>().is_ok_and(|v| in_bounds(v as f64, lo, hi))
                    && !n.starts_with("0")
                    && !n.starts_with("-0");
                assert_eq!(a.accepts(n.as_bytes()), expected, "{n} against {s}");
            }
        }
    }
    // Non-integer bounds on an integer round inwards.
    check(json!({"type": "integer", "minimum": 1.5, "maximum": 3.5}), &["2", "3"], &["1", "4"]);
    // The whole i64 range.
    check(
        json!({"type": "integer", "minimum": i64::MIN, "maximum": i64::MAX}),
        &["-9223372036854775808", "9223372036854775807", "0"],
        &["-9223372036854775809", "9223372036854775808"],
    );
    // Draft-4 boolean exclusives.
    check(json!({"type": "integer", "minimum": 0, "exclusiveMinimum": true, "maximum": 3}), &["1", "3"], &["0"]);
    assert!(invalid(json!({"type": "integer", "minimum": 5, "maximum": 4})).1.contains("integer"));
}

#[test]
fn random_integer_ranges() {
    let mut r = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..60 {
        let end = |r: &mut Rng| {
            let magnitude = 10i64.pow(r.below(16) as u32);
            r.range(-1, 1) * r.range(0, magnitude)
        };
        let (a, b) = (end(&mut r), end(&mut r));
        let (lo, hi) = (a.min(b), a.max(b));
        let (lo, hi) = (Some((lo, false)), Some((hi, false)));
        let s = int_schema(lo, hi);
        let a = automaton(&grammar(&s));
        let (l, h) = (lo.unwrap().0, hi.unwrap().0);
        let mut probes = vec![l - 1, l, l + 1, h - 1, h, h + 1, 0, -1, 1];
        for _ in 0..40 {
            probes.push(r.range(l.saturating_sub(1000), h.saturating_add(1000)));
            probes.push(r.range(l, h));
        }
        for n in probes {
            assert_eq!(a.accepts(n.to_string().as_bytes()), (l..=h).contains(&n), "{n} against {s}");
        }
    }
}

#[test]
fn number_bounds_are_exact() {
    let probes = [
        "-10.5", "-3", "-2.5", "-2", "-2.0", "-1.999", "-1", "-1.0", "-0.5", "-0.001", "0", "0.0", "0.000", "0.001",
        "0.5", "1", "1.0", "1.5", "1.999", "2", "2.00", "2.01", "2.5", "3", "10", "10.5", "100", "100.25",
    ];
    let cases: &[(Option<i64>, Option<i64>)] = &[
        (Some(0), Some(1)),
        (Some(0), None),
        (None, Some(0)),
        (Some(-2), Some(2)),
        (Some(2), Some(2)),
        (Some(-3), Some(-1)),
        (None, Some(-2)),
        (Some(1), Some(10)),
        (Some(-1), None),
    ];
    for &(lo, hi) in cases {
        for (lo_excl, hi_excl) in [(false, false), (true, false), (false, true), (true, true)] {
            let lo = lo.map(|v| (v, lo_excl));
            let hi = hi.map(|v| (v, hi_excl));
            let mut s = int_schema(lo, hi);
            s["type"] = json!("number");
            let g = match json_schema_to_gbnf(&s) {
                Ok(g) => g,
                Err(SchemaError::Invalid { .. }) => continue,
                Err(e) => panic!("{s}: {e}"),
            };
            let a = automaton(&g);
            for p in probes {
                let x: f64 = p.parse().unwrap();
                assert_eq!(a.accepts(p.as_bytes()), in_bounds(x, lo, hi), "{p} against {s}\n{g}");
            }
            assert!(!a.accepts(b"1e0"), "exponents are not written under bounds");
        }
    }
    check(json!({"type": "number", "minimum": 0.0, "maximum": 1.0}), &["0.25", "1"], &["1.25"]);
    let (k, path) = unsupported(json!({"type": "object", "properties": {"t": {"type": "number", "minimum": 0.5}}}));
    assert!(k.starts_with("minimum"), "{k}");
    assert_eq!(path, "/properties/t");
    check(json!({"type": "integer", "minimum": 0.5}), &["1"], &["0"]);
}

#[test]
fn enum_and_const() {
    check(
        json!({"enum": ["red", 1, null, true, [1, 2], {"a": "b"}, "x\"y"]}),
        &[r#""red""#, "1", "null", "true", "[1,2]", r#"{"a":"b"}"#, r#""x\"y""#],
        &[r#""blue""#, "2", "false", "[1, 2, 3]"],
    );
    check(json!({"type": "string", "enum": ["a", 1]}), &[r#""a""#], &["1"]);
    check(json!({"const": "only"}), &[r#""only""#], &[r#""other""#]);
    check(json!({"const": 3, "enum": [1, 3]}), &["3"], &["1"]);
    assert!(invalid(json!({"type": "string", "enum": [1, 2]})).1.contains("enum"));
    let (k, _) = unsupported(json!({"type": "string", "enum": ["a"], "minLength": 3}));
    assert!(k.starts_with("minLength"), "{k}");
}

#[test]
fn combinators() {
    check(
        json!({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]}),
        &["1", r#""a""#],
        &[r#""ab""#, "null"],
    );
    check(json!({"oneOf": [{"type": "integer"}, {"type": "null"}]}), &["1", "null"], &["1.5"]);
    // Keywords beside anyOf apply to each alternative.
    check(
        json!({
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "anyOf": [{"required": ["a"]}, {"required": ["b"]}]
        }),
        &[r#"{"a": 1}"#, r#"{"b": 1}"#, r#"{"a": 1, "b": 2}"#],
        &["{}"],
    );
    // An alternative that contradicts its siblings drops out.
    check(json!({"type": "string", "anyOf": [{"maxLength": 1}, {"type": "null"}]}), &[r#""a""#], &["null"]);
    check(
        json!({"allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"b": {"type": "string"}}, "required": ["b"]}
        ]}),
        &[r#"{"a": 1, "b": "x"}"#],
        &[r#"{"a": 1}"#, r#"{"b": "x"}"#],
    );
    check(
        json!({"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 5}, {"type": "number", "maximum": 9}]}),
        &["0", "5"],
        &["6", "-1", "2.5"],
    );
    check(json!({"allOf": [{"type": "string"}]}), &[r#""s""#], &["1"]);
    assert!(invalid(json!({"allOf": [{"type": "string"}, {"type": "integer"}]})).1.contains("type"));
    let (k, _) = unsupported(json!({"allOf": [{"pattern": "^a"}, {"pattern": "b$"}]}));
    assert!(k.starts_with("pattern"), "{k}");
}

#[test]
fn references() {
    let s = json!({
        "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"]}},
        "definitions": {"Name": {"type": "string", "minLength": 1}},
        "type": "object",
        "properties": {"at": {"$ref": "#/$defs/Point"}, "name": {"$ref": "#/definitions/Name"}},
        "required": ["at", "name"]
    });
    check(
        s,
        &[r#"{"at": {"x": 1, "y": 2}, "name": "p"}"#],
        &[r#"{"at": {"x": 1}, "name": "p"}"#, r#"{"at": {"x": 1, "y": 2}, "name": ""}"#],
    );
    // Escaped pointers, percent-encoding, a pointer into properties.
    let s = json!({
        "$defs": {"a/b": {"type": "integer"}, "c~d": {"type": "boolean"}, "e f": {"type": "null"}},
        "type": "array",
        "prefixItems": [{"$ref": "#/$defs/a~1b"}, {"$ref": "#/$defs/c~0d"}, {"$ref": "#/$defs/e%20f"}, {"$ref": "#/prefixItems/0"}],
        "items": false
    });
    check(s, &["[1, true, null, 2]"], &["[true]"]);
    // Siblings of $ref constrain too.
    check(
        json!({"$defs": {"S": {"type": "string"}}, "$ref": "#/$defs/S", "maxLength": 2}),
        &[r#""ab""#],
        &[r#""abc""#],
    );
    assert!(invalid(json!({"$ref": "#/$defs/Nope"})).1.contains("Nope"));
    let (k, _) = unsupported(json!({"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}}));
    assert!(k.starts_with("$ref") && k.contains("other.json"), "{k}");
    // Left recursion: a reference that comes back before a character is written.
    let msg =
        invalid(json!({"$defs": {"A": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]}}, "$ref": "#/$defs/A"})).1;
    assert!(msg.contains("left recursion"), "{msg}");
}

#[test]
fn recursive_tree() {
    let s = json!({
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
                "required": ["value"]
            }
        },
        "$ref": "#/$defs/Node"
    });
    let leaf = |v: i32| ordered(&s["$defs"]["Node"]["properties"], &[("value", &v.to_string())]);
    let inner = ordered(
        &s["$defs"]["Node"]["properties"],
        &[("value", "1"), ("children", &format!("[{}, {}]", leaf(2), leaf(3)))],
    );
    let deep = ordered(&s["$defs"]["Node"]["properties"], &[("value", "0"), ("children", &format!("[{inner}]"))]);
    let bad = ordered(&s["$defs"]["Node"]["properties"], &[("value", "0"), ("children", "[{}]")]);
    check(s.clone(), &[&leaf(1), &inner, &deep], &[&bad]);
    // Recursion through the root itself.
    check(
        json!({"type": "array", "items": {"anyOf": [{"type": "integer"}, {"$ref": "#"}]}}),
        &["[]", "[1, [2, [3, []]]]"],
        &["[[1, \"a\"]]"],
    );
}

/// What Pydantic v2 writes for:
///
/// ```python
/// class Role(str, Enum): ADMIN = "admin"; USER = "user"
/// class Address(BaseModel):
///     street: str
///     city: str
///     zip_code: Optional[str] = None
/// class User(BaseModel):
///     name: str = Field(max_length=50)
///     age: Optional[int] = None
///     tags: list[str]
///     kind: Literal["person", "bot"]
///     team: Literal["core"]
///     role: Role
///     address: Address
///     score: float = Field(ge=0, le=1)
///     friends: list["User"] = []
/// ```
fn pydantic_user() -> Value {
    json!({
        "$defs": {
            "Address": {
                "properties": {
                    "street": {"title": "Street", "type": "string"},
                    "city": {"title": "City", "type": "string"},
                    "zip_code": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null, "title": "Zip Code"}
                },
                "required": ["street", "city"],
                "title": "Address",
                "type": "object"
            },
            "Role": {"enum": ["admin", "user"], "title": "Role", "type": "string"},
            "User": {
                "properties": {
                    "name": {"maxLength": 50, "title": "Name", "type": "string"},
                    "age": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": null, "title": "Age"},
                    "tags": {"items": {"type": "string"}, "title": "Tags", "type": "array"},
                    "kind": {"enum": ["person", "bot"], "title": "Kind", "type": "string"},
                    "team": {"const": "core", "title": "Team", "type": "string"},
                    "role": {"$ref": "#/$defs/Role"},
                    "address": {"$ref": "#/$defs/Address"},
                    "score": {"maximum": 1, "minimum": 0, "title": "Score", "type": "number"},
                    "friends": {"default": [], "items": {"$ref": "#/$defs/User"}, "title": "Friends", "type": "array"}
                },
                "required": ["name", "tags", "kind", "team", "role", "address", "score"],
                "title": "User",
                "type": "object"
            }
        },
        "$ref": "#/$defs/User"
    })
}

#[test]
fn pydantic_models() {
    let s = pydantic_user();
    let user_props = &s["$defs"]["User"]["properties"];
    let addr_props = &s["$defs"]["Address"]["properties"];
    let address = ordered(addr_props, &[("street", "\"1 Main St\""), ("city", "\"Springfield\"")]);
    let address_zip = ordered(addr_props, &[("street", "\"1 Main St\""), ("city", "\"X\""), ("zip_code", "null")]);
    let base = [
        ("name", "\"Ann\""),
        ("tags", "[\"a\", \"b\"]"),
        ("kind", "\"person\""),
        ("team", "\"core\""),
        ("role", "\"admin\""),
        ("address", address.as_str()),
        ("score", "0.75"),
    ];
    let with = |extra: &[(&str, &str)], without: &[&str]| {
        let mut pairs: Vec<(&str, &str)> = base.iter().copied().filter(|(k, _)| !without.contains(k)).collect();
        for &(k, v) in extra {
            pairs.retain(|(p, _)| *p != k);
            pairs.push((k, v));
        }
        ordered(user_props, &pairs)
    };
    let friend = with(&[], &[]);
    let friends = format!("[{friend}]");
    check(
        s.clone(),
        &[
            &with(&[], &[]),
            &with(&[("age", "null")], &[]),
            &with(&[("age", "42")], &[]),
            &with(&[("address", &address_zip)], &[]),
            &with(&[("friends", &friends), ("score", "1")], &[]),
            &with(&[("friends", "[]")], &[]),
        ],
        &[
            &with(&[], &["name"]),
            &with(&[("age", "\"42\"")], &[]),
            &with(&[("kind", "\"robot\"")], &[]),
            &with(&[("team", "\"other\"")], &[]),
            &with(&[("role", "\"root\"")], &[]),
            &with(&[("score", "1.5")], &[]),
            &with(&[("name", &format!("\"{}\"", "n".repeat(51)))], &[]),
            &with(&[("tags", "[1]")], &[]),
        ],
    );
}

#[test]
fn unsupported_keywords_are_named_with_their_place() {
    let cases = [
        (
            json!({"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 2}}}),
            "multipleOf",
            "/properties/a",
        ),
        (json!({"type": "object", "minProperties": 1}), "minProperties", ""),
        (json!({"type": "object", "patternProperties": {"^a": {}}}), "patternProperties", ""),
        (json!({"type": "array", "items": {"not": {"type": "string"}}}), "not", "/items"),
        (json!({"type": "object", "dependentRequired": {"a": ["b"]}}), "dependentRequired", ""),
        (json!({"type": "array", "uniqueItems": true}), "uniqueItems", ""),
        (json!({"type": "array", "contains": {"type": "integer"}}), "contains", ""),
        (json!({"type": "array", "prefixItems": [{"type": "string", "format": "ipv4"}]}), "format", "/prefixItems/0"),
        (json!({"$ref": "other.json#/x"}), "$ref", ""),
        (
            json!({"anyOf": [{"type": "string"}, {"type": "integer"}], "discriminator": {"propertyName": "t"}}),
            "discriminator",
            "",
        ),
        (
            json!({"$defs": {"A": {"type": "string", "contentEncoding": "base64"}}, "$ref": "#/$defs/A"}),
            "contentEncoding",
            "/$defs/A",
        ),
        (json!({"anyOf": [{"type": "string"}], "oneOf": [{"type": "string"}]}), "oneOf", ""),
        (json!({"type": "object", "properties": {"a/b": {"nullable": true}}}), "nullable", "/properties/a~1b"),
    ];
    for (schema, keyword, path) in cases {
        let (k, p) = unsupported(schema.clone());
        assert!(k.starts_with(keyword), "{schema}: {k}");
        assert_eq!(p, path, "{schema}");
        let message = json_schema_to_gbnf(&schema).unwrap_err().to_string();
        assert!(message.contains(keyword) && message.contains("not supported"), "{message}");
    }
    let (k, _) = unsupported(json!({"if": {"type": "string"}, "then": {"minLength": 1}, "else": {"type": "null"}}));
    assert!(["if", "then", "else"].contains(&k.as_str()), "{k}");
}

#[test]
fn invalid_schemas() {
    for (schema, path) in [
        (json!({"type": "strin"}), ""),
        (
            json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": 3, "maximum": 1}}, "required": ["a"]}),
            "/properties/a",
        ),
        (json!({"type": "string", "minLength": -1}), ""),
        (json!({"type": "string", "maxLength": 20000}), ""),
        (json!({"type": "array", "minItems": 3, "maxItems": 2}), ""),
        (json!({"type": "array", "items": [{"type": "string"}], "prefixItems": [{"type": "string"}]}), ""),
        (json!({"type": "array", "items": {"type": "string"}, "additionalItems": false}), ""),
        (json!({"type": "array", "items": [{"type": "string"}], "additionalItems": 3}), ""),
        (json!({"type": "object", "required": "a"}), ""),
        (json!({"enum": []}), ""),
        (json!({"type": "object", "properties": {"a": false}, "required": ["a"]}), "/properties/a"),
        (json!({"type": "object", "properties": {}, "additionalProperties": false, "required": ["a"]}), ""),
        (json!(42), ""),
    ] {
        let (p, msg) = invalid(schema.clone());
        assert_eq!(p, path, "{schema}: {msg}");
    }
    assert!(matches!(schema_rules(&json!({}), "bad_name"), Err(SchemaError::Invalid { .. })));
    // Too deep.
    let mut deep = json!({"type": "integer"});
    for _ in 0..200 {
        deep = json!({"type": "array", "items": deep});
    }
    assert!(invalid(deep).1.contains("levels"));
    // allOf doubling at each level would take 2^40 steps.
    let mut defs = Map::new();
    defs.insert("D0".into(), json!({"type": "object", "properties": {"a": {"type": "integer"}}}));
    for k in 1..40 {
        let r = json!({"$ref": format!("#/$defs/D{}", k - 1)});
        defs.insert(format!("D{k}"), json!({"allOf": [r, r]}));
    }
    assert!(invalid(json!({"$defs": defs, "$ref": "#/$defs/D39"})).1.contains("steps"));
    // A $ref loop through allOf.
    let looped = json!({"$defs": {"A": {"allOf": [{"$ref": "#/$defs/A"}, {"type": "object"}]}}, "$ref": "#/$defs/A"});
    assert!(json_schema_to_gbnf(&looped).is_err());
    // Too large a grammar.
    let props: Map<String, Value> =
        (0..12_000).map(|i| (format!("p{i}"), json!({"type": "string", "maxLength": 3}))).collect();
    assert!(invalid(json!({"type": "object", "properties": props})).1.contains("more than"));
}

#[test]
fn rules_compose_into_one_grammar() {
    let weather = json!({
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city"]
    });
    let search = json!({
        "type": "object",
        "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": 10}, "query": {"type": "string"}},
        "required": ["query"]
    });
    let weather_rules = schema_rules(&weather, "get-weather-args").unwrap();
    let search_rules = schema_rules(&search, "search-args").unwrap();
    for (rules, prefix) in [(&weather_rules, "get-weather-args"), (&search_rules, "search-args")] {
        for line in rules.lines() {
            let name = line.split(" ::= ").next().unwrap();
            assert!(name == prefix || name.starts_with(&format!("{prefix}-")), "{name}");
        }
        assert!(!rules.lines().any(|l| l.starts_with("root ")));
    }
    let g = format!(
        "root ::= \"<tool_call>\\n\" ( weather | search ) \"\\n</tool_call>\"\n\
         weather ::= \"{{\\\"name\\\": \\\"get_weather\\\", \\\"arguments\\\": \" get-weather-args \"}}\"\n\
         search ::= \"{{\\\"name\\\": \\\"search\\\", \\\"arguments\\\": \" search-args \"}}\"\n{weather_rules}{search_rules}"
    );
    let a = automaton(&g);
    let call =
        |name: &str, args: &str| format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {args}}}\n</tool_call>");
    let weather_args = ordered(&weather["properties"], &[("city", "\"Paris\""), ("unit", "\"c\"")]);
    let search_args = ordered(&search["properties"], &[("query", "\"rust\""), ("limit", "3")]);
    assert!(a.accepts(call("get_weather", &weather_args).as_bytes()), "{g}");
    assert!(a.accepts(call("get_weather", "{\"city\": \"Oslo\"}").as_bytes()));
    assert!(a.accepts(call("search", &search_args).as_bytes()));
    assert!(a.accepts(call("search", "{\n  \"query\": \"x\"\n}").as_bytes()));
    assert!(!a.accepts(call("search", &weather_args).as_bytes()));
    assert!(!a.accepts(call("get_weather", "{\"city\": \"Oslo\"} ").as_bytes()));
    assert!(
        !a.accepts(call("search", &ordered(&search["properties"], &[("query", "\"x\""), ("limit", "11")])).as_bytes())
    );
}

// ---------------------------------------------------------------------------
// Random schemas of the subset, each with documents made from it.

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % ((hi - lo) as u64 + 1)) as i64
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }
}

/// JSON spellings of single characters, escapes included.
const UNITS: &[&str] = &["a", "Z", "0", " ", "\\\"", "\\\\", "\\n", "\\t", "\\/", "é", "日", "😀", "\\u0041", "~"];
const NAMES: &[&str] = &["a", "b c", "q\"x", "ü", "snake_case", "dash-name", "n1", "z/y", "tab\t", ""];

/// Patterns with a generator of matching string contents (JSON text).
const PATTERNS: &[&str] = &[
    "^[a-z]{2,5}$",
    r"^\d{3}-\d{4}$",
    "^(cat|dog|bird)s?$",
    "ab",
    "^[A-Z][a-z]*$",
    r#"^a"b\\c$"#,
    "^.{0,3}$",
    r#"^[^"]*$"#,
    r"^\w+@\w+\.com$",
    "(?i)^hello$",
];

fn pattern_instance(r: &mut Rng, i: usize, min: u64, max: Option<u64>) -> String {
    let letters = |r: &mut Rng, lo: i64, hi: i64| {
        let n = r.range(lo, hi);
        (0..n).map(|_| char::from(b'a' + r.below(26) as u8)).collect::<String>()
    };
    let units = |r: &mut Rng, pool: &[&str], hi: i64| {
        let n = r.range(0, hi);
        (0..n).map(|_| *r.pick(pool)).collect::<String>()
    };
    match i {
        0 => letters(r, 2, 5),
        1 => format!("{:03}-{:04}", r.below(1000), r.below(10000)),
        2 => format!("{}{}", r.pick(&["cat", "dog", "bird"]), if r.chance(50) { "s" } else { "" }),
        3 => format!("{}ab{}", units(r, UNITS, 2), units(r, UNITS, 2)),
        4 => {
            let lo = min.max(1) as i64;
            let hi = max.map_or(lo + 4, |m| m as i64);
            let first = char::from(b'A' + r.below(26) as u8);
            format!("{first}{}", letters(r, lo - 1, hi - 1))
        }
        5 => r#"a\"b\\c"#.to_owned(),
        6 => units(r, &["a", " ", "\\\"", "\\\\", "\\t", "é", "😀"], 3),
        7 => units(r, &["a", "\\\\", "\\n", "日", "\\t"], 4),
        8 => format!("{}@{}.com", letters(r, 1, 4), letters(r, 1, 4)),
        _ => "hello".chars().map(|c| if r.chance(50) { c.to_ascii_uppercase() } else { c }).collect(),
    }
}

fn format_instance(r: &mut Rng, format: &str) -> String {
    let date = |r: &mut Rng| {
        let y = r.below(10000);
        let m = r.range(1, 12) as u64;
        let leap = y.is_multiple_of(4) && (!y.is_multiple_of(100) || y.is_multiple_of(400));
        let days = match m {
            2 if leap => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        format!("{y:04}-{m:02}-{:02}", r.range(1, days))
    };
    let time = |r: &mut Rng| {
        let frac = if r.chance(30) { format!(".{}", r.below(1000)) } else { String::new() };
        let offset = if r.chance(50) {
            "Z".to_owned()
        } else {
            format!("{}{:02}:{:02}", r.pick(&["+", "-"]), r.below(24), r.below(60))
        };
        format!("{:02}:{:02}:{:02}{frac}{offset}", r.below(24), r.below(60), r.below(60))
    };
    match format {
        "date" => date(r),
        "time" => time(r),
        "date-time" => format!("{}T{}", date(r), time(r)),
        "uuid" => {
            let hex = |r: &mut Rng, n: usize| {
                (0..n).map(|_| *r.pick(&['0', '9', 'a', 'f', 'A', 'F', '5'])).collect::<String>()
            };
            format!("{}-{}-{}-{}-{}", hex(r, 8), hex(r, 4), hex(r, 4), hex(r, 4), hex(r, 12))
        }
        _ => format!("{}.x+y@mail-{}.example.org", r.pick(&["john", "a", "x_y"]), r.below(100)),
    }
}

fn gen_schema(r: &mut Rng, depth: u32, defs: &mut Vec<Value>) -> Value {
    let kind = if depth == 0 { r.below(7) } else { r.below(13) };
    gen_kind(r, kind, depth, defs)
}

fn gen_kind(r: &mut Rng, kind: u64, depth: u32, defs: &mut Vec<Value>) -> Value {
    match kind {
        0 => match r.below(5) {
            0 => json!({"type": "string"}),
            1 => {
                let min = r.range(0, 3);
                json!({"type": "string", "minLength": min, "maxLength": min + r.range(0, 4)})
            }
            2 => {
                let i = r.below(PATTERNS.len() as u64) as usize;
                let mut s = json!({"type": "string", "pattern": PATTERNS[i]});
                if i == 4 && r.chance(50) {
                    s["minLength"] = json!(r.range(1, 3));
                    s["maxLength"] = json!(r.range(3, 6));
                }
                s
            }
            3 => json!({"type": "string", "format": r.pick(&["date", "time", "date-time", "uuid", "email"])}),
            _ => json!({"type": "string", "enum": ["x", "y\"z", "日本"]}),
        },
        1 => {
            let mut s = json!({"type": "integer"});
            if r.chance(70) {
                let lo = r.range(-300, 300);
                s[if r.chance(50) { "minimum" } else { "exclusiveMinimum" }] = json!(lo);
                if r.chance(70) {
                    s[if r.chance(50) { "maximum" } else { "exclusiveMaximum" }] = json!(lo + r.range(2, 2000));
                }
            }
            s
        }
        2 => {
            let mut s = json!({"type": "number"});
            if r.chance(70) {
                let lo = r.range(-20, 20);
                s[if r.chance(50) { "minimum" } else { "exclusiveMinimum" }] = json!(lo);
                if r.chance(70) {
                    s[if r.chance(50) { "maximum" } else { "exclusiveMaximum" }] = json!(lo + r.range(1, 30));
                }
            }
            s
        }
        3 => json!({"type": r.pick(&["boolean", "null"])}),
        4 => json!({"enum": [1, "two", null, [3], {"four": 4}, 5.5]}),
        5 => json!({"const": r.pick(&[json!("c"), json!(0), json!(false)])}),
        6 => r.pick(&[json!({}), json!(true), json!({"description": "free"})]).clone(),
        7 | 8 => {
            let mut props = Map::new();
            let mut required = Vec::new();
            for _ in 0..r.below(5) {
                let name = *r.pick(NAMES);
                props.insert(name.to_owned(), gen_schema(r, depth - 1, defs));
                if r.chance(50) && !required.contains(&name) {
                    required.push(name);
                }
            }
            let mut s = json!({"type": "object", "properties": props, "required": required});
            match r.below(4) {
                0 => {}
                1 => s["additionalProperties"] = json!(false),
                2 => s["additionalProperties"] = json!(true),
                _ => s["additionalProperties"] = gen_schema(r, 0, defs),
            }
            if r.chance(15) {
                s.as_object_mut().unwrap().remove("properties");
                s.as_object_mut().unwrap().remove("required");
            }
            s
        }
        9 => {
            if r.chance(60) {
                let min = r.range(0, 2);
                let mut s = json!({"type": "array", "items": gen_schema(r, depth - 1, defs), "minItems": min});
                if r.chance(60) {
                    s["maxItems"] = json!(min + r.range(0, 4));
                }
                s
            } else {
                let prefix: Vec<Value> = (0..r.range(1, 3)).map(|_| gen_schema(r, depth - 1, defs)).collect();
                let min = r.range(0, prefix.len() as i64);
                let items = match r.below(3) {
                    0 => json!(false),
                    1 => gen_schema(r, 0, defs),
                    _ => json!(true),
                };
                json!({"type": "array", "prefixItems": prefix, "items": items, "minItems": min})
            }
        }
        10 => {
            let alts: Vec<Value> = (0..r.range(2, 3)).map(|_| gen_schema(r, depth - 1, defs)).collect();
            let keyword = *r.pick(&["anyOf", "oneOf"]);
            json!({ keyword: alts })
        }
        11 => {
            if !defs.is_empty() && r.chance(40) {
                let i = r.below(defs.len() as u64);
                return json!({"$ref": format!("#/$defs/D{i}")});
            }
            let def = gen_schema(r, depth - 1, defs);
            defs.push(def);
            json!({"$ref": format!("#/$defs/D{}", defs.len() - 1), "description": "a reference"})
        }
        _ => {
            if r.chance(50) {
                let mut s = gen_schema(r, 0, defs);
                match s.get("type").and_then(Value::as_str) {
                    Some(t) if !s.as_object().unwrap().contains_key("enum") => s["type"] = json!([t, "null"]),
                    _ => s = json!({"anyOf": [s, {"type": "null"}], "default": null}),
                }
                s
            } else {
                let a =
                    json!({"type": "object", "properties": {"m1": gen_schema(r, depth - 1, defs)}, "required": ["m1"]});
                let b = json!({"properties": {"m2": gen_schema(r, depth - 1, defs)}});
                json!({"allOf": [a, b], "title": "Merged"})
            }
        }
    }
}

fn ws(r: &mut Rng) -> &'static str {
    const SPACES: [&str; 6] = ["", "", " ", "\n", "\n  ", "\n\t\t"];
    SPACES[r.below(6) as usize]
}

fn any_instance(r: &mut Rng, depth: u32) -> String {
    match if depth == 0 { r.below(4) } else { r.below(6) } {
        0 => "null".to_owned(),
        1 => r.pick(&["0", "-1.5e3", "42", "true"]).to_string(),
        2 => format!("\"{}\"", r.pick(UNITS)),
        3 => "false".to_owned(),
        4 => format!("[{}{}]", ws(r), any_instance(r, depth - 1)),
        _ => format!("{{\"k\":{}{}}}", ws(r), any_instance(r, depth - 1)),
    }
}

fn container(r: &mut Rng, open: &str, close: &str, items: Vec<String>) -> String {
    if items.is_empty() {
        return format!("{open}{}{close}", ws(r));
    }
    let mut out = format!("{open}{}", ws(r));
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
            out.push_str(ws(r));
        }
        out.push_str(item);
    }
    out.push_str(ws(r));
    out.push_str(close);
    out
}

fn number_instance(r: &mut Rng, m: &Map<String, Value>) -> String {
    let bound = |k: &str, ek: &str| match (m.get(k), m.get(ek)) {
        (Some(v), _) => Some((v.as_i64().unwrap(), false)),
        (_, Some(v)) => Some((v.as_i64().unwrap(), true)),
        _ => None,
    };
    let (lo, hi) = (bound("minimum", "exclusiveMinimum"), bound("maximum", "exclusiveMaximum"));
    if lo.is_none() && hi.is_none() {
        return r.pick(&["0", "-12", "3.25", "1e5", "-2.5E-3", "0.0"]).to_string();
    }
    let centre = lo.or(hi).unwrap().0;
    let mut candidates = Vec::new();
    for k in centre - 40..=centre + 40 {
        for frac in ["", ".0", ".5", ".25", ".999", ".000"] {
            let text = format!("{}{}{frac}", if k < 0 { "-" } else { "" }, k.unsigned_abs());
            let x: f64 = text.parse().unwrap();
            if in_bounds(x, lo, hi) && !(text.starts_with("-0") && x == 0.0) {
                candidates.push(text);
            }
        }
    }
    // A negative fraction of the integer part 0 (-0.5) is covered by k = 0 only
    // from the positive side; add it.
    if in_bounds(-0.5, lo, hi) {
        candidates.push("-0.5".to_owned());
    }
    r.pick(&candidates).clone()
}

fn instance(r: &mut Rng, s: &Value, root: &Value) -> String {
    let m = match s {
        Value::Bool(true) => return any_instance(r, 2),
        Value::Object(m) => m,
        _ => unreachable!("generated schemas are objects or true"),
    };
    if let Some(Value::String(p)) = m.get("$ref") {
        return instance(r, &root["$defs"][p.trim_start_matches("#/$defs/")], root);
    }
    if let Some(alts) = m.get("anyOf").or_else(|| m.get("oneOf")) {
        let alt = r.pick(alts.as_array().unwrap()).clone();
        return instance(r, &alt, root);
    }
    if let Some(all) = m.get("allOf") {
        // The generator's allOf: object members with distinct properties.
        let mut props = Map::new();
        let mut required = Vec::new();
        for member in all.as_array().unwrap() {
            props.extend(member["properties"].as_object().unwrap().clone());
            required.extend(member.get("required").and_then(Value::as_array).cloned().unwrap_or_default());
        }
        return instance(r, &json!({"type": "object", "properties": props, "required": required}), root);
    }
    if let Some(values) = m.get("enum") {
        return r.pick(values.as_array().unwrap()).to_string();
    }
    if let Some(c) = m.get("const") {
        return c.to_string();
    }
    let ty = match m.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(ts)) if r.chance(30) => ts.last().unwrap().as_str().unwrap(),
        Some(Value::Array(ts)) => ts[0].as_str().unwrap(),
        _ => return any_instance(r, 2),
    };
    match ty {
        "null" => "null".to_owned(),
        "boolean" => r.pick(&["true", "false"]).to_string(),
        "integer" => {
            let lo = m
                .get("minimum")
                .map(|v| v.as_i64().unwrap())
                .or(m.get("exclusiveMinimum").map(|v| v.as_i64().unwrap() + 1));
            let hi = m
                .get("maximum")
                .map(|v| v.as_i64().unwrap())
                .or(m.get("exclusiveMaximum").map(|v| v.as_i64().unwrap() - 1));
            let lo = lo.unwrap_or(-1_000_000);
            r.range(lo, hi.unwrap_or(lo + 1_000_000)).to_string()
        }
        "number" => number_instance(r, m),
        "string" => {
            let min = m.get("minLength").and_then(Value::as_u64).unwrap_or(0);
            let max = m.get("maxLength").and_then(Value::as_u64);
            let text = if let Some(p) = m.get("pattern").and_then(Value::as_str) {
                pattern_instance(r, PATTERNS.iter().position(|x| *x == p).unwrap(), min, max)
            } else if let Some(f) = m.get("format").and_then(Value::as_str) {
                format_instance(r, f)
            } else {
                let n = r.range(min as i64, max.map_or(min as i64 + 6, |m| m as i64));
                (0..n).map(|_| *r.pick(UNITS)).collect()
            };
            format!("\"{text}\"")
        }
        "array" => {
            let prefix = m.get("prefixItems").and_then(Value::as_array).cloned().unwrap_or_default();
            let items = m.get("items").cloned().unwrap_or(json!(true));
            let min = m.get("minItems").and_then(Value::as_u64).unwrap_or(0) as i64;
            let max = match (m.get("maxItems").and_then(Value::as_u64), &items) {
                (Some(max), _) => max as i64,
                (None, Value::Bool(false)) => prefix.len() as i64,
                _ => min.max(prefix.len() as i64) + 2,
            };
            let n = r.range(min, max) as usize;
            let elements = (0..n).map(|i| instance(r, prefix.get(i).unwrap_or(&items), root)).collect();
            container(r, "[", "]", elements)
        }
        _ => {
            let props = m.get("properties").and_then(Value::as_object);
            let required: Vec<&str> = m
                .get("required")
                .and_then(Value::as_array)
                .map_or(Vec::new(), |a| a.iter().filter_map(Value::as_str).collect());
            let mut pairs = Vec::new();
            for (name, s) in props.into_iter().flatten() {
                if required.contains(&name.as_str()) || r.chance(50) {
                    pairs.push(format!("{}:{}{}", json!(name), ws(r), instance(r, s, root)));
                }
            }
            let additional = match (m.get("additionalProperties"), props) {
                (None, Some(_)) | (Some(Value::Bool(false)), _) => None,
                (None, None) => Some(json!(true)),
                (Some(a), _) => Some(a.clone()),
            };
            if let Some(a) = additional {
                for i in 0..r.below(3) {
                    pairs.push(format!("\"extra{i}\":{}{}", ws(r), instance(r, &a, root)));
                }
            }
            container(r, "{", "}", pairs)
        }
    }
}

#[test]
fn random_schemas_accept_their_documents() {
    let mut r = Rng(0x2545_F491_4F6C_DD1D);
    for n in 0..300 {
        let mut defs = Vec::new();
        // Mostly objects, arrays and combinators at the top.
        let kind = if r.chance(80) { r.range(7, 12) as u64 } else { r.below(13) };
        let mut schema = gen_kind(&mut r, kind, 3, &mut defs);
        if !defs.is_empty() {
            if schema == json!(true) {
                schema = json!({});
            }
            let defs: Map<String, Value> = defs.into_iter().enumerate().map(|(i, d)| (format!("D{i}"), d)).collect();
            schema["$defs"] = Value::Object(defs);
        }
        let g = grammar(&schema);
        let a = automaton(&g);
        for _ in 0..4 {
            let doc = instance(&mut r, &schema, &schema);
            assert!(a.accepts(doc.as_bytes()), "schema #{n} refuses its document\n{doc}\nschema: {schema}\n{g}");
            if !doc.ends_with(char::is_whitespace) {
                assert!(!a.accepts(format!("{doc} ").as_bytes()), "schema #{n} accepts trailing whitespace");
            }
        }
    }
}
