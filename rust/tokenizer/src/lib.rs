//! Tokenizers built from a GGUF file's own metadata: byte-level BPE (`gpt2`)
//! and SentencePiece (`llama`), token for token what llama.cpp produces, plus
//! decoding (whole, per token, and streamed).
//!
//! ```no_run
//! let file = ember_gguf::GgufFile::open("model.gguf")?;
//! let tok = ember_tokenizer::Tokenizer::from_gguf(&file)?;
//! let ids = tok.tokenize("<|im_start|>user\nHello<|im_end|>", true, true);
//! let text = tok.detokenize(&ids, true);
//! let mut stream = tok.stream_decoder();
//! for &id in &ids {
//!     print!("{}", stream.push(&tok, id));
//! }
//! print!("{}", stream.flush());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod bpe;
mod decode;
mod error;
mod load;
mod pretokenize;
mod special;
mod spm;
mod unicode;
mod vocab;

use std::sync::Mutex;

pub use decode::StreamDecoder;
pub use error::TokenizerError;
pub use vocab::TokenType;

use special::{Fragment, Specials};
use vocab::{attr, FxHashMap, Vocab};

/// Which algorithm the file's `tokenizer.ggml.model` selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerKind {
    /// `gpt2`: byte-level BPE with a regex pre-tokenizer.
    Bpe,
    /// `llama`: SentencePiece merges by score with byte fallback.
    Spm,
    /// `gemma4`: BPE merges over the text's own UTF-8 characters, spaces
    /// written as `▁` as SentencePiece does, `<0xXX>` tokens for the rest.
    SpmBpe,
}

enum Algo {
    Bpe {
        merges: Box<bpe::Merges>,
        pre: pretokenize::PreTokenizer,
        /// Spaces become `▁` before the text is split (SentencePiece-style BPE).
        escape_spaces: bool,
    },
    Spm {
        byte_ids: Box<[Option<u32>; 256]>,
    },
}

type WordCache = FxHashMap<Box<[u8]>, Box<[u32]>>;

/// Words longer than this are not worth caching.
const CACHE_MAX_WORD: usize = 48;
const CACHE_MAX_ENTRIES: usize = 1 << 16;

/// A tokenizer read from GGUF metadata. It is `Send + Sync` and all its
/// methods take `&self`, so one can serve many threads.
pub struct Tokenizer {
    vocab: Vocab,
    algo: Algo,
    kind: TokenizerKind,
    model: String,
    pre: String,
    /// Every token's `token_to_piece(id, special = true)` bytes, back to back.
    pieces: Vec<u8>,
    piece_offsets: Vec<u32>,
    specials: Specials,
    ids: SpecialIds,
    /// End-of-generation tokens, ascending.
    eog: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    /// BPE results of recent words; prompts repeat words a lot.
    word_cache: Mutex<WordCache>,
}

/// The special token ids the metadata names (or llama.cpp infers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

impl Tokenizer {
    /// Builds the tokenizer from `tokenizer.ggml.*` metadata, as llama.cpp loads a vocabulary.
    pub fn from_gguf(header: &ember_gguf::GgufHeader) -> Result<Tokenizer, TokenizerError> {
        load::from_gguf(header)
    }

    /// Text to token ids, as llama.cpp's `llama_tokenize(text, add_special, parse_special)`.
    ///
    /// `add_special` adds BOS/EOS where the model's flags ask for them.
    /// `parse_special` lets the spellings of control tokens (`<|im_start|>`,
    /// `<start_of_turn>`...) become those tokens; without it they are plain
    /// text. User-defined tokens are matched either way, as in llama.cpp.
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.tokenize_guarded(text, add_special, parse_special, &[])
    }

    /// The spellings `tokenize` turns into control or unknown tokens only
    /// with `parse_special` (empty spellings left out).
    pub fn control_spellings(&self) -> Vec<String> {
        (0..self.vocab.len() as u32)
            .filter(|&id| self.vocab.attrs[id as usize] & (vocab::attr::CONTROL | vocab::attr::UNKNOWN) != 0)
            .map(|id| self.vocab.text(id).to_string())
            .filter(|t| !t.is_empty())
            .collect()
    }

    /// [`tokenize`](Self::tokenize) with the byte ranges `literal` read as
    /// plain text even under `parse_special`: the client's words inside a
    /// rendered chat prompt, whose spellings of control tokens must not
    /// become those tokens (a user's `<|im_end|>` would end its turn).
    pub fn tokenize_guarded(&self, text: &str, add_special: bool, parse_special: bool, literal: &[(usize, usize)]) -> Vec<u32> {
        let frags = self.specials.partition(&self.vocab, text, parse_special, literal);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            if let Some(bos) = self.ids.bos {
                out.push(bos);
            }
        }
        match &self.algo {
            Algo::Spm { byte_ids } => {
                // llama.cpp prefixes the space at the start and after every
                // special token, as if each text run began a sentence.
                let mut prev_special = true;
                let mut buf = String::new();
                for f in frags {
                    match f {
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                        Fragment::Text(a, b) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push('\u{2581}');
                            }
                            for c in text[a..b].chars() {
                                buf.push(if c == ' ' { '\u{2581}' } else { c });
                            }
                            spm::tokenize(&self.vocab, byte_ids, &buf, &mut out);
                            prev_special = false;
                        }
                    }
                }
            }
            Algo::Bpe { merges, pre, escape_spaces } => {
                let mut scratch = bpe::Scratch::default();
                let mut escaped = String::new();
                // Another thread tokenizing holds the cache: go without it
                // rather than wait.
                let mut cache = self.word_cache.try_lock().ok();
                for f in frags {
                    match f {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(a, b) => {
                            let run = if *escape_spaces {
                                escaped.clear();
                                escaped.extend(text[a..b].chars().map(|c| if c == ' ' { '\u{2581}' } else { c }));
                                escaped.as_str()
                            } else {
                                &text[a..b]
                            };
                            for word in pre.split(run) {
                                let w = word.as_bytes();
                                let cacheable = w.len() <= CACHE_MAX_WORD;
                                if let (true, Some(c)) = (cacheable, cache.as_deref()) {
                                    if let Some(ids) = c.get(w) {
                                        out.extend_from_slice(ids);
                                        continue;
                                    }
                                }
                                let start = out.len();
                                merges.tokenize_word(&self.vocab, w, &mut scratch, &mut out);
                                if let (true, Some(c)) = (cacheable, cache.as_deref_mut()) {
                                    if c.len() >= CACHE_MAX_ENTRIES {
                                        c.clear();
                                    }
                                    c.insert(w.into(), out[start..].into());
                                }
                            }
                        }
                    }
                }
            }
        }
        if add_special && self.add_eos {
            if let Some(eos) = self.ids.eos {
                out.push(eos);
            }
        }
        out
    }

    /// The bytes token `id` stands for. Control and unknown tokens give
    /// nothing unless `special`; out-of-range ids give nothing.
    pub fn token_to_piece(&self, id: u32, special: bool) -> &[u8] {
        let Some(&a) = self.vocab.attrs.get(id as usize) else {
            return &[];
        };
        if !special && a & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return &[];
        }
        self.token_bytes(id)
    }

    /// Token `id`'s bytes as text renders them, control tokens by their
    /// spelling (llama.cpp's cached `token_to_piece(id, true)`); precomputed.
    /// Out-of-range ids give nothing.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        match (self.piece_offsets.get(id as usize), self.piece_offsets.get(id as usize + 1)) {
            (Some(&a), Some(&b)) => &self.pieces[a as usize..b as usize],
            _ => &[],
        }
    }

    /// Ids to bytes, as llama.cpp's `detokenize(ids, special)`: the leading
    /// space a SentencePiece model prefixed is dropped, and models that ask
    /// for it get their spaces cleaned up (` ,` to `,` ...).
    pub fn detokenize_bytes(&self, ids: &[u32], special: bool) -> Vec<u8> {
        let mut out = Vec::new();
        let mut remove_space = self.add_space_prefix;
        for &id in ids {
            let piece = self.token_to_piece(id, special);
            let piece = if remove_space && piece.first() == Some(&b' ') { &piece[1..] } else { piece };
            remove_space = false;
            out.extend_from_slice(piece);
        }
        if self.clean_spaces {
            decode::clean_spaces(&mut out);
        }
        out
    }

    /// [`detokenize_bytes`](Self::detokenize_bytes) as text, invalid UTF-8 replaced.
    pub fn detokenize(&self, ids: &[u32], special: bool) -> String {
        match String::from_utf8(self.detokenize_bytes(ids, special)) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    /// A streaming decoder that renders control tokens as nothing.
    pub fn stream_decoder(&self) -> StreamDecoder {
        StreamDecoder::new(false)
    }

    pub fn n_vocab(&self) -> usize {
        self.vocab.len()
    }

    /// Entries in the BPE merge table (0 for SentencePiece).
    pub fn n_merges(&self) -> usize {
        match &self.algo {
            Algo::Bpe { merges, .. } => merges.len(),
            Algo::Spm { .. } => 0,
        }
    }

    /// The token's spelling in the vocabulary (GPT-2 characters for BPE, `▁`
    /// for spaces in SentencePiece). Panics on an out-of-range id.
    pub fn token_text(&self, id: u32) -> &str {
        self.vocab.text(id)
    }

    /// Panics on an out-of-range id.
    pub fn token_type(&self, id: u32) -> TokenType {
        TokenType::from_attr(self.vocab.attrs[id as usize])
    }

    /// The SentencePiece score (0 where the file has none). Panics on an out-of-range id.
    pub fn token_score(&self, id: u32) -> f32 {
        self.vocab.scores[id as usize]
    }

    /// The id whose vocabulary spelling is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.find(text)
    }

    pub fn is_control(&self, id: u32) -> bool {
        self.vocab.attrs.get(id as usize).is_some_and(|a| a & attr::CONTROL != 0)
    }

    /// Control tokens llama.cpp marks unused (e.g. Gemma's `<unused0>`).
    pub fn is_unused(&self, id: u32) -> bool {
        self.vocab.attrs.get(id as usize).is_some_and(|a| a & attr::UNUSED != 0)
    }

    /// Iterates `(id, text, bytes)` over the whole vocabulary, for building
    /// constrained-decoding tables.
    pub fn vocab(&self) -> impl ExactSizeIterator<Item = (u32, &str, &[u8])> + '_ {
        (0..self.vocab.len() as u32).map(move |id| (id, self.vocab.text(id), self.token_bytes(id)))
    }

    pub fn kind(&self) -> TokenizerKind {
        self.kind
    }

    /// `tokenizer.ggml.model` as the file names it.
    pub fn model_name(&self) -> &str {
        &self.model
    }

    /// `tokenizer.ggml.pre` as the file names it (empty when absent).
    pub fn pre_name(&self) -> &str {
        &self.pre
    }

    pub fn special_ids(&self) -> &SpecialIds {
        &self.ids
    }

    pub fn bos(&self) -> Option<u32> {
        self.ids.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.ids.eos
    }

    pub fn eot(&self) -> Option<u32> {
        self.ids.eot
    }

    pub fn eom(&self) -> Option<u32> {
        self.ids.eom
    }

    pub fn unk(&self) -> Option<u32> {
        self.ids.unk
    }

    pub fn pad(&self) -> Option<u32> {
        self.ids.pad
    }

    /// Whether `tokenize(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos && self.ids.bos.is_some()
    }

    /// Whether `tokenize(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos && self.ids.eos.is_some()
    }

    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// Whether generating `id` ends generation (EOS, EOT, EOM and the
    /// end-of-turn spellings llama.cpp recognises).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// Every end-of-generation token, ascending.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("model", &self.model)
            .field("pre", &self.pre)
            .field("n_vocab", &self.n_vocab())
            .field("ids", &self.ids)
            .field("eog", &self.eog)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokenizer_is_shareable_across_threads() {
        fn check<T: Send + Sync>() {}
        check::<super::Tokenizer>();
        check::<super::StreamDecoder>();
    }
}
