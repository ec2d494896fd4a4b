//! Grammars for constrained decoding, compiled once and shared by every
//! request that names the same grammar or schema.

use std::sync::Arc;

use ember_grammar::{Automaton, GrammarError as Error, SchemaError};
use pyo3::prelude::*;

use crate::{GrammarError, InvalidSchemaError};

fn grammar_err(e: Error) -> PyErr {
    match e {
        Error::Schema(SchemaError::Invalid { .. }) => InvalidSchemaError::new_err(e.to_string()),
        _ => GrammarError::new_err(e.to_string()),
    }
}

fn parse_json(text: &str) -> PyResult<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| GrammarError::new_err(format!("the JSON Schema is not valid JSON: {e}")))
}

/// A compiled grammar: GBNF text, a JSON Schema, or any JSON object.
#[pyclass(module = "ember._native", frozen)]
pub struct Grammar {
    pub(crate) inner: Arc<Automaton>,
    gbnf: String,
}

impl Grammar {
    fn compile(py: Python<'_>, gbnf: String) -> PyResult<Grammar> {
        let a = py.detach(|| Automaton::from_gbnf(&gbnf)).map_err(grammar_err)?;
        Ok(Grammar { inner: Arc::new(a), gbnf })
    }
}

#[pymethods]
impl Grammar {
    /// Compiles llama.cpp grammar text (rule `root` is the document).
    #[staticmethod]
    fn from_gbnf(py: Python<'_>, text: String) -> PyResult<Grammar> {
        Grammar::compile(py, text)
    }

    /// Compiles a JSON Schema given as JSON text.
    #[staticmethod]
    fn from_json_schema(py: Python<'_>, schema: &str) -> PyResult<Grammar> {
        let gbnf = json_schema_to_gbnf(schema)?;
        Grammar::compile(py, gbnf)
    }

    /// Any JSON object (`response_format: {"type": "json_object"}`).
    #[staticmethod]
    fn json_object(py: Python<'_>) -> PyResult<Grammar> {
        Grammar::compile(py, ember_grammar::json_object_gbnf())
    }

    /// The GBNF text the automaton was compiled from.
    #[getter]
    fn gbnf(&self) -> &str {
        &self.gbnf
    }

    /// Whether `text` is a whole document of the grammar.
    fn accepts(&self, text: &[u8]) -> bool {
        self.inner.accepts(text)
    }

    /// Whether `text` can begin a document of the grammar.
    fn accepts_prefix(&self, text: &[u8]) -> bool {
        ember_grammar::Matcher::new(self.inner.clone()).advance(text).unwrap_or(false)
    }

    /// Parse states explored so far (they and their masks are cached).
    #[getter]
    fn n_states(&self) -> usize {
        self.inner.n_states()
    }
}

/// A JSON Schema (JSON text) as GBNF text with rule `root`.
#[pyfunction]
pub fn json_schema_to_gbnf(schema: &str) -> PyResult<String> {
    let value = parse_json(schema)?;
    ember_grammar::json_schema_to_gbnf(&value).map_err(|e| grammar_err(e.into()))
}

/// GBNF rules defining `root` as a document of the schema, helper rules
/// prefixed with `root-`, to splice into a larger grammar.
#[pyfunction]
pub fn json_schema_rules(schema: &str, root: &str) -> PyResult<String> {
    let value = parse_json(schema)?;
    ember_grammar::schema_rules(&value, root).map_err(|e| grammar_err(e.into()))
}
