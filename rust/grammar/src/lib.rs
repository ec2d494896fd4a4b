//! Constrained decoding. A grammar (llama.cpp's GBNF, or a JSON Schema
//! compiled to GBNF) becomes a byte-level pushdown automaton; at each step the
//! automaton's state yields a mask over the whole vocabulary, so a token that
//! would break the document is refused before the draw, and the end of the turn
//! is allowed only once the document is complete.
//!
//! ```
//! use ember_grammar::Automaton;
//!
//! let a = Automaton::from_gbnf(r#"root ::= "yes" | "no""#).unwrap();
//! assert!(a.accepts(b"yes"));
//! assert!(!a.accepts(b"maybe"));
//! ```

mod automaton;
pub mod gbnf;
mod grammar;
mod mask;
mod regex;
pub mod schema;

pub use automaton::{Automaton, Matcher, StateId};
pub use grammar::{Elem, Grammar, Rule};
pub use mask::{TokenIndex, TokenMask};
pub use schema::{json_object_gbnf, json_schema_to_gbnf, schema_rules, SchemaError};

/// A grammar that cannot be used: a syntax error (with its line and column),
/// an undefined rule, left recursion, or a document too ambiguous to track.
#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    #[error("grammar syntax error at line {line}, column {col}: {msg}")]
    Syntax { line: usize, col: usize, msg: String },
    #[error("grammar rule {0:?} is used but never defined")]
    Undefined(String),
    #[error("grammar has no \"root\" rule")]
    NoRoot,
    #[error("grammar rule {0:?} is left-recursive (it can reach itself before reading a byte), which the automaton cannot track")]
    LeftRecursion(String),
    #[error("grammar is too ambiguous: more than {0} parses are alive at once")]
    TooAmbiguous(usize),
    #[error("grammar has more than {0} distinct parse states")]
    TooManyStates(usize),
    #[error(transparent)]
    Schema(#[from] SchemaError),
}
