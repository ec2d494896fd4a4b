//! Seeded mutation testing of `GgufHeader::parse` on the headers of the real
//! test models: whatever the bytes, parsing must return `Ok` or `Err`, never
//! panic, and never let a stated count or length turn into a large allocation.
//!
//! Each image is a real file's header (everything before the tensor data)
//! followed by a zero-filled data section of the real size. The zeros come
//! from a lazily mapped allocation, so they cost address space, not memory,
//! and every tensor bound the reader checks is the real one.
//!
//! Knobs: `EMBER_FUZZ_SEED` (default fixed) and `EMBER_FUZZ_SCALE` (multiplies
//! the iteration counts, for longer runs by hand). A failure prints the seed,
//! iteration and mutations, which replay exactly.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::Instant;

use ember_gguf::{GgufError, GgufFile, GgufHeader, Value};

const DEFAULT_SEED: u64 = 0x5eed_9a1f_0e3b_2024;

/// Iterations per target at scale 1, sized so the whole file runs in about
/// ten seconds in the debug build on two busy cores: a clean parse of the full
/// Gemma 3 header (262k-entry vocabulary) takes 0.1-0.2 s there, of SmolLM2's
/// 40-60 ms, of a compacted header about 0.1 ms.
const ITERS_FULL_SMOLLM2: u64 = 200;
const ITERS_FULL_GEMMA3: u64 = 50;
const ITERS_COMPACT: u64 = 15_000;

/// xorshift64*: tiny, seedable, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
}

/// A fixed-width integer field of the header: a count, a length, a type id,
/// a dimension or an offset.
#[derive(Clone, Copy, Debug)]
struct Field {
    at: usize,
    width: u8,
}

/// Where the structural fields of a header lie, found by walking the parsed
/// header with the format's layout rules.
struct Layout {
    /// Header counts, key lengths, value types, array headers, scalar values
    /// and the tensor table.
    core: Vec<Field>,
    /// String lengths inside arrays (the vocabulary): many, so kept apart to
    /// be drawn less often.
    elems: Vec<Field>,
    /// Byte range of the tensor table.
    table: (usize, usize),
}

fn scalar_size(v: &Value) -> Option<usize> {
    Some(match v {
        Value::U8(_) | Value::I8(_) | Value::Bool(_) => 1,
        Value::U16(_) | Value::I16(_) => 2,
        Value::U32(_) | Value::I32(_) | Value::F32(_) => 4,
        Value::U64(_) | Value::I64(_) | Value::F64(_) => 8,
        Value::String(_) | Value::Array(_) => return None,
    })
}

/// Records the fields of one metadata value starting at `pos` and moves past it.
fn walk_value(v: &Value, pos: &mut usize, lay: &mut Layout, in_array: bool) {
    match v {
        Value::String(s) => {
            let f = Field { at: *pos, width: 8 };
            if in_array {
                lay.elems.push(f)
            } else {
                lay.core.push(f)
            }
            *pos += 8 + s.len();
        }
        Value::Array(items) => {
            lay.core.push(Field { at: *pos, width: 4 });
            lay.core.push(Field { at: *pos + 4, width: 8 });
            *pos += 12;
            for it in items {
                walk_value(it, pos, lay, true);
            }
        }
        other => {
            let n = scalar_size(other).unwrap();
            if n >= 4 && !in_array {
                lay.core.push(Field { at: *pos, width: n as u8 });
            }
            *pos += n;
        }
    }
}

fn layout(h: &GgufHeader) -> Layout {
    let core = vec![Field { at: 4, width: 4 }, Field { at: 8, width: 8 }, Field { at: 16, width: 8 }];
    let mut lay = Layout { core, elems: Vec::new(), table: (0, 0) };
    let mut pos = 24;
    for (key, v) in &h.metadata {
        lay.core.push(Field { at: pos, width: 8 });
        pos += 8 + key.len();
        lay.core.push(Field { at: pos, width: 4 });
        pos += 4;
        walk_value(v, &mut pos, &mut lay, false);
    }
    let table_start = pos;
    for t in &h.tensors {
        lay.core.push(Field { at: pos, width: 8 });
        pos += 8 + t.name.len();
        lay.core.push(Field { at: pos, width: 4 });
        pos += 4;
        for _ in &t.dims {
            lay.core.push(Field { at: pos, width: 8 });
            pos += 8;
        }
        lay.core.push(Field { at: pos, width: 4 });
        lay.core.push(Field { at: pos + 4, width: 8 });
        pos += 12;
    }
    assert_eq!(
        (pos as u64).div_ceil(h.alignment) * h.alignment,
        h.data_offset,
        "the test's walk of the header disagrees with the reader"
    );
    lay.table = (table_start, pos);
    lay
}

#[derive(Debug, Clone)]
enum Mutation {
    FlipByte { at: usize, xor: u8 },
    FlipBit { at: usize, bit: u8 },
    SetField { at: usize, width: u8, value: u64 },
    /// Eight arbitrary bytes written anywhere, aligned or not.
    SetU64 { at: usize, value: u64 },
    /// Overwrites `len` bytes at `to` with the bytes at `from`.
    Copy { from: usize, to: usize, len: usize },
    /// Inserts a copy of `len` bytes from `from` at `to`, shifting the rest.
    Insert { from: usize, to: usize, len: usize },
    Delete { at: usize, len: usize },
}

fn interesting(rng: &mut Rng, width: u8, orig: u64, image_len: u64) -> u64 {
    let v = match rng.below(20) {
        0 => 0,
        1 => 1,
        2 => orig.wrapping_add(1),
        3 => orig.wrapping_sub(1),
        4 => orig.wrapping_mul(2),
        5 => orig ^ (1 << rng.below(width as u64 * 8)),
        6 => u64::MAX,
        7 => u64::MAX - rng.below(64),
        8 => 1 << 63,
        9 => i64::MAX as u64,
        10 => 0xffff_ffff,
        11 => 1 << 32,
        12 => 1 << (32 + rng.below(31)),
        13 => rng.below(16),
        14 => rng.below(256),
        15 => image_len.wrapping_add(rng.below(64)).wrapping_sub(32),
        16 => rng.below(image_len.max(1)),
        17 => 0x8000_0000,
        18 => [31, 32, 33, 39, 40, 64, 4096][rng.below(7) as usize],
        _ => rng.next(),
    };
    if width == 4 {
        v & 0xffff_ffff
    } else {
        v
    }
}

fn pick_field(rng: &mut Rng, lay: &Layout) -> Field {
    if lay.elems.is_empty() || rng.below(4) != 0 {
        lay.core[rng.below(lay.core.len() as u64) as usize]
    } else {
        lay.elems[rng.below(lay.elems.len() as u64) as usize]
    }
}

/// A position to mutate: a structural field most of the time, otherwise
/// anywhere, with the tensor table drawn more often than its size would earn.
fn pick_pos(rng: &mut Rng, lay: &Layout, len: usize) -> usize {
    let p = match rng.below(4) {
        0 | 1 => pick_field(rng, lay).at,
        2 => lay.table.0 + rng.below((lay.table.1 - lay.table.0) as u64) as usize,
        _ => rng.below(len as u64) as usize,
    };
    p.min(len.saturating_sub(1))
}

fn draw_mutations(rng: &mut Rng, lay: &Layout, header: &[u8], image_len: u64) -> Vec<Mutation> {
    let n = 1 + rng.below(3) as usize;
    let len = header.len();
    (0..n)
        .map(|_| match rng.below(10) {
            0 => Mutation::FlipByte { at: pick_pos(rng, lay, len), xor: 1 + rng.below(255) as u8 },
            1 => {
                let f = pick_field(rng, lay);
                Mutation::FlipBit { at: f.at + rng.below(f.width as u64) as usize, bit: rng.below(8) as u8 }
            }
            2..=5 => {
                let f = pick_field(rng, lay);
                let mut b = [0u8; 8];
                b[..f.width as usize].copy_from_slice(&header[f.at..f.at + f.width as usize]);
                let orig = u64::from_le_bytes(b);
                Mutation::SetField { at: f.at, width: f.width, value: interesting(rng, f.width, orig, image_len) }
            }
            6 => Mutation::SetU64 { at: pick_pos(rng, lay, len), value: interesting(rng, 8, 0, image_len) },
            7 => {
                Mutation::Copy { from: pick_pos(rng, lay, len), to: pick_pos(rng, lay, len), len: 1 + rng.below(64) as usize }
            }
            8 => Mutation::Insert {
                from: pick_pos(rng, lay, len),
                to: pick_field(rng, lay).at,
                len: 1 + rng.below(48) as usize,
            },
            _ => Mutation::Delete { at: pick_pos(rng, lay, len), len: 1 + rng.below(48) as usize },
        })
        .collect()
}

fn apply(h: &mut Vec<u8>, m: &Mutation) {
    let len = h.len();
    match *m {
        Mutation::FlipByte { at, xor } => {
            if at < len {
                h[at] ^= xor
            }
        }
        Mutation::FlipBit { at, bit } => {
            if at < len {
                h[at] ^= 1 << bit
            }
        }
        Mutation::SetField { at, width, value } => {
            let w = width as usize;
            if at + w <= len {
                h[at..at + w].copy_from_slice(&value.to_le_bytes()[..w]);
            }
        }
        Mutation::SetU64 { at, value } => {
            let end = (at + 8).min(len);
            if at < end {
                h[at..end].copy_from_slice(&value.to_le_bytes()[..end - at]);
            }
        }
        // Positions were drawn for the unmutated header; an earlier deletion
        // may have moved the end before them.
        Mutation::Copy { from, to, len: n } => {
            if from < len && to < len {
                let n = n.min(len - from).min(len - to);
                h.copy_within(from..from + n, to);
            }
        }
        Mutation::Insert { from, to, len: n } => {
            let from = from.min(len);
            let n = n.min(len - from);
            let chunk = h[from..from + n].to_vec();
            let to = to.min(h.len());
            h.splice(to..to, chunk);
        }
        Mutation::Delete { at, len: n } => {
            let end = (at + n).min(len);
            if at < end {
                h.drain(at..end);
            }
        }
    }
}

/// A real header plus a lazily zeroed data section, and a scratch image to
/// mutate it in.
struct Target {
    name: String,
    header: Vec<u8>,
    data_len: usize,
    layout: Layout,
    /// Mutated header followed by zeros; reused across iterations.
    image: Vec<u8>,
    /// How far `image` may hold non-zero bytes past the current header.
    dirty: usize,
}

/// Slack after the data section, for mutations that lengthen the header.
const SLACK: usize = 1 << 16;

impl Target {
    fn new(name: &str, header: Vec<u8>, data_len: usize) -> Target {
        let total = header.len() + data_len;
        // vec![0; n] asks the allocator for zeroed memory, which for large
        // sizes is fresh pages that stay unbacked until written.
        let mut image = vec![0u8; total + SLACK];
        image[..header.len()].copy_from_slice(&header);
        let parsed = GgufHeader::parse(&image[..total]).unwrap_or_else(|e| panic!("{name}: unmutated image: {e}"));
        let layout = layout(&parsed);
        let dirty = header.len();
        Target { name: name.into(), header, data_len, layout, image, dirty }
    }

    /// Builds the mutated image and returns its length.
    fn stage(&mut self, h: &[u8]) -> usize {
        self.image[..h.len()].copy_from_slice(h);
        if self.dirty > h.len() {
            self.image[h.len()..self.dirty].fill(0);
        }
        self.dirty = h.len();
        h.len() + self.data_len
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    let parsed = match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={v} is not a number")))
}

fn seed() -> u64 {
    env_u64("EMBER_FUZZ_SEED").unwrap_or(DEFAULT_SEED)
}

fn scaled(iters: u64) -> u64 {
    iters * env_u64("EMBER_FUZZ_SCALE").unwrap_or(1).max(1)
}

/// The seed of one iteration, derived so any iteration replays alone.
fn iter_seed(seed: u64, target: &str, i: u64) -> u64 {
    let mut x = seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for b in target.bytes() {
        x = (x ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    x
}

#[derive(Default, Debug)]
struct Tally {
    ok: u64,
    err: u64,
    panics: Vec<String>,
    /// The slowest iteration: how long, and what it was.
    slowest: (std::time::Duration, String),
    /// How many refusals of each kind, to show the mutations reach every check.
    kinds: std::collections::BTreeMap<&'static str, u64>,
}

fn kind(e: &GgufError) -> &'static str {
    match e {
        GgufError::Io { .. } => "io",
        GgufError::BadMagic(_) => "magic",
        GgufError::UnsupportedVersion(_) => "version",
        GgufError::Truncated { .. } => "truncated",
        GgufError::UnknownValueType { .. } => "value type",
        GgufError::Malformed { .. } => "malformed",
        GgufError::BadTensor { .. } => "tensor",
        GgufError::BadMetadata { .. } => "metadata",
    }
}

fn fuzz(t: &mut Target, iters: u64, seed: u64) -> Tally {
    let mut tally = Tally::default();
    let total = t.header.len() + t.data_len;
    let mut h = Vec::with_capacity(t.header.len() + SLACK);
    for i in 0..iters {
        let mut rng = Rng::new(iter_seed(seed, &t.name, i));
        let muts = draw_mutations(&mut rng, &t.layout, &t.header, total as u64);
        h.clear();
        h.extend_from_slice(&t.header);
        for m in &muts {
            apply(&mut h, m);
        }
        h.truncate(t.header.len() + SLACK);
        let mut len = t.stage(&h);
        // Truncations: mostly inside the header, sometimes inside the data.
        let cut = match rng.below(6) {
            0 => Some(rng.below(h.len() as u64 + 1) as usize),
            1 if rng.chance(4) => Some(h.len() + rng.below(t.data_len as u64) as usize),
            _ => None,
        };
        if let Some(c) = cut {
            len = c.min(len);
        }
        let img = &t.image[..len];
        let t0 = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| GgufHeader::parse(img)));
        let took = t0.elapsed();
        if took > tally.slowest.0 {
            let what = match &outcome {
                Ok(Ok(_)) => "Ok".to_string(),
                Ok(Err(e)) => e.to_string().chars().take(160).collect(),
                Err(_) => "panic".to_string(),
            };
            tally.slowest = (took, format!("iteration {i}: {muts:?}, cut {cut:?} -> {what}"));
        }
        match outcome {
            Ok(Ok(_)) => tally.ok += 1,
            Ok(Err(e)) => {
                // Building the message must not panic either.
                let _ = e.to_string();
                tally.err += 1;
                *tally.kinds.entry(kind(&e)).or_default() += 1;
            }
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                tally.panics.push(format!(
                    "{}: seed {seed:#x} iteration {i}: mutations {muts:?}, cut {cut:?}: panicked: {msg}",
                    t.name
                ));
            }
        }
    }
    tally
}

fn report(t: &Target, tally: &Tally, iters: u64, started: Instant) {
    eprintln!(
        "{}: {iters} iterations in {:.2?}: {} Ok, {} Err, {} panics; peak memory {} MiB",
        t.name,
        started.elapsed(),
        tally.ok,
        tally.err,
        tally.panics.len(),
        peak_rss_mib().map_or("?".into(), |m| m.to_string())
    );
    eprintln!("{}: refusals {:?}", t.name, tally.kinds);
    eprintln!("{}: slowest parse {:.2?}, {}", t.name, tally.slowest.0, tally.slowest.1);
    assert!(tally.panics.is_empty(), "parse panicked:\n{}", tally.panics.join("\n"));
    // A run where every image is refused, or none is, is not probing the
    // reader; short runs on the full headers may see no Ok by chance.
    assert!(tally.err > 0 && (tally.ok > 0 || iters < 1000), "{}: degenerate run: {tally:?}", t.name);
    check_memory();
}

/// Peak resident memory of this process, where the platform says.
fn peak_rss_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// The whole test process (every target at once) must stay far below what an
/// allocation sized by a hostile count would take. The zero-filled data
/// sections are address space only; what is resident is the headers, their
/// copies and what parsing builds from them. A mutated count that stays
/// within the reader's metadata budget (2^24 values) may legitimately make
/// one parse build about half a gigabyte of values out of the zeros, and the
/// targets run in parallel, hence the bound; without the budget a single
/// such count costs 32 bytes per byte of file.
fn check_memory() {
    if let Some(mib) = peak_rss_mib() {
        assert!(mib < 2048, "peak resident memory {mib} MiB: something allocated by a stated size");
    }
}

// ---------------------------------------------------------------------------
// Targets

fn models_dir() -> PathBuf {
    match std::env::var_os("EMBER_TEST_MODELS") {
        Some(d) => PathBuf::from(d),
        None => std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default().join(".cache/ember/models"),
    }
}

/// A real model's header bytes and the size of its data section, or `None`
/// when model tests are skipped. A missing model fails: see tests/reader.rs
/// for where the models come from.
fn real_header(file: &str) -> Option<(Vec<u8>, usize, GgufHeader)> {
    if std::env::var("EMBER_SKIP_MODEL_TESTS").is_ok_and(|v| v == "1") {
        eprintln!("EMBER_SKIP_MODEL_TESTS=1: skipping {file}");
        return None;
    }
    let path = models_dir().join(file);
    assert!(
        path.is_file(),
        "test model {} is missing (set EMBER_SKIP_MODEL_TESTS=1 to skip; tests/reader.rs says how to fetch it)",
        path.display()
    );
    let f = GgufFile::open(&path).unwrap();
    let data_len = (f.file_len() - f.data_offset) as usize;
    let mut header = vec![0u8; f.data_offset as usize];
    std::io::Read::read_exact(&mut std::fs::File::open(&path).unwrap(), &mut header).unwrap();
    Some((header, data_len, f.header().clone()))
}

fn fuzz_full(file: &str, name: &str, iters: u64) {
    let Some((header, data_len, _)) = real_header(file) else { return };
    let started = Instant::now();
    let mut t = Target::new(name, header, data_len);
    let t0 = Instant::now();
    GgufHeader::parse(&t.image[..t.header.len() + t.data_len]).unwrap();
    eprintln!("{name}: one clean parse takes {:.2?}", t0.elapsed());
    let iters = scaled(iters);
    let tally = fuzz(&mut t, iters, seed());
    report(&t, &tally, iters, started);
}

#[test]
fn fuzz_smollm2_header() {
    fuzz_full("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2", ITERS_FULL_SMOLLM2);
}

#[test]
fn fuzz_gemma3_header() {
    fuzz_full("gemma-3-270m-q4_k_m.gguf", "gemma3", ITERS_FULL_GEMMA3);
}

// Compacted headers: the real keys, scalar values and tensor table, with each
// array cut to a few entries. Parsing one takes microseconds, so many more
// mutations reach the tensor table and the metadata around it.

fn encode_value(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => {
            out.extend_from_slice(&(s.len() as u64).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        Value::Array(items) => {
            let elem = items.first().map_or(0, type_id);
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for it in items {
                encode_value(it, out);
            }
        }
    }
}

fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn compact(header: &[u8], h: &GgufHeader) -> Vec<u8> {
    let lay = layout(h);
    let mut out = header[..24].to_vec();
    for (key, v) in &h.metadata {
        let v = match v {
            Value::Array(items) => Value::Array(items.iter().take(8).cloned().collect()),
            other => other.clone(),
        };
        encode_value(&Value::String(key.clone()), &mut out);
        out.extend_from_slice(&type_id(&v).to_le_bytes());
        encode_value(&v, &mut out);
    }
    out.extend_from_slice(&header[lay.table.0..lay.table.1]);
    let pad = (out.len() as u64).div_ceil(h.alignment) * h.alignment;
    out.resize(pad as usize, 0);
    out
}

#[test]
fn fuzz_compact_headers() {
    for (file, name) in [("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-compact"), ("gemma-3-270m-q4_k_m.gguf", "gemma3-compact")]
    {
        let Some((header, data_len, parsed)) = real_header(file) else { return };
        let started = Instant::now();
        let small = compact(&header, &parsed);
        assert!(small.len() < 64 << 10, "{name}: compacted header is {} bytes", small.len());
        let mut t = Target::new(name, small, data_len);
        let again = GgufHeader::parse(&t.image[..t.header.len() + t.data_len]).unwrap();
        assert_eq!(again.tensors.len(), parsed.tensors.len());
        assert_eq!(again.metadata.len(), parsed.metadata.len());
        let iters = scaled(ITERS_COMPACT);
        let tally = fuzz(&mut t, iters, seed());
        report(&t, &tally, iters, started);
    }
}
