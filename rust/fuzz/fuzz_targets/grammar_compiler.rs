//! Any text as a client's GBNF grammar, and as a JSON Schema: compiling it
//! either succeeds or is a GrammarError naming the problem, never a panic,
//! and a compiled grammar can be walked over the input's own bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(a) = ember_grammar::Automaton::from_gbnf(text) {
        let _ = a.accepts(text.as_bytes());
    }
    if let Ok(schema) = serde_json::from_str::<serde_json::Value>(text) {
        if let Ok(gbnf) = ember_grammar::json_schema_to_gbnf(&schema) {
            if let Ok(a) = ember_grammar::Automaton::from_gbnf(&gbnf) {
                let _ = a.accepts(b"{}");
            }
        }
    }
});
