// Placeholder until the JSON Schema compiler lands.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SchemaError {
    #[error("JSON Schema keyword {keyword:?} at {path} is not supported")]
    Unsupported { keyword: String, path: String },
    #[error("invalid JSON Schema at {path}: {msg}")]
    Invalid { path: String, msg: String },
}
pub fn json_schema_to_gbnf(_schema: &serde_json::Value) -> Result<String, SchemaError> {
    Err(SchemaError::Invalid { path: String::new(), msg: "not yet".into() })
}
pub fn schema_rules(_schema: &serde_json::Value, _root: &str) -> Result<String, SchemaError> {
    Err(SchemaError::Invalid { path: String::new(), msg: "not yet".into() })
}
pub fn json_object_gbnf() -> String {
    String::new()
}
