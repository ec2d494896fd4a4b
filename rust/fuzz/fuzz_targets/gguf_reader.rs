//! Any bytes as a GGUF file's head: the reader refuses what it cannot trust
//! (lengths, counts, offsets past the file) with an error, never a panic,
//! an abort or an allocation the input's size does not justify; what it
//! accepts, the tokenizer's loader reads the same way.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(header) = ember_gguf::GgufHeader::parse(data) else { return };
    for name in header.tensors.iter().map(|t| t.name.as_str()) {
        if let Some(t) = header.tensor(name) {
            let _ = (t.n_elements(), t.n_rows());
        }
    }
    let _ = header.architecture();
    let _ = ember_tokenizer::Tokenizer::from_gguf(&header);
});
