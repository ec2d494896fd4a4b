//! Grammars written to hurt the compiler: deep nesting and nested
//! repetitions must be refused (or compiled) with an error, never by
//! overflowing the stack of the thread that compiles them.

use ember_grammar::Automaton;

/// Compiles on a thread with a small stack (Python's worker threads and
/// some platforms' main threads have 512 KiB to 1 MiB), so a recursion that
/// grows with the grammar shows itself here.
fn compile_small_stack(text: String) -> Result<(), String> {
    std::thread::Builder::new()
        .stack_size(512 * 1024)
        .spawn(move || Automaton::from_gbnf(&text).map(|_| ()).map_err(|e| e.to_string()))
        .unwrap()
        .join()
        .expect("compiling must not crash the thread")
}

#[test]
fn deeply_nested_groups_are_refused_by_name() {
    let depth = 20_000;
    let text = format!("root ::= {}\"a\"{}", "(".repeat(depth), ")".repeat(depth));
    let err = compile_small_stack(text).unwrap_err();
    assert!(err.contains("nested"), "{err}");
}

#[test]
fn moderately_nested_groups_still_compile() {
    let text = format!("root ::= {}\"a\"{}", "(".repeat(256), ")".repeat(256));
    compile_small_stack(text).unwrap();
}

#[test]
fn nested_repetitions_end_in_an_error_not_a_crash() {
    for (text, error) in [
        (r#"root ::= ((("a"){0,1000}){0,1000}){0,300}"#, "too ambiguous"),
        (r#"root ::= ((("a"?)*)*)*"#, "left-recursive"),
    ] {
        let err = compile_small_stack(text.to_string()).expect_err(text);
        assert!(err.contains(error), "{text}: {err}");
    }
}

#[test]
fn a_long_optional_chain_compiles() {
    compile_small_stack(r#"root ::= "a"{0,10000} "b""#.to_string()).unwrap();
    compile_small_stack(r#"root ::= ("ab"{0,3000} "c"){0,3}"#.to_string()).unwrap();
}
