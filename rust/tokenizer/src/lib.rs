//! Tokenizers built from a GGUF file's own metadata: byte-level BPE and SentencePiece.
