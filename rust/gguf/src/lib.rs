//! GGUF reader: memory-maps a model file, parses its metadata and tensor table,
//! and hands out tensor bytes as slices of the mapping.
//!
//! It distrusts the file: every count, length, dimension and offset is checked
//! against the bytes actually present before it is used, so a truncated or
//! hostile file yields a [`GgufError`] naming what and where, never a panic or
//! an allocation sized by the file's say-so.

mod error;
mod types;
mod value;

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

pub use error::{GgufError, Result};
pub use types::GgmlType;
pub use value::Value;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
const MAX_DIMS: u32 = 4;
/// Nested arrays deeper than this are refused (real files nest one level).
const MAX_ARRAY_DEPTH: u32 = 8;
/// Array elements the whole metadata may hold. Each costs a `Value` (32 bytes)
/// for as little as one byte of file, so without a bound a large file made of
/// one byte array would cost 32 times its size in memory. The largest real
/// tokenizers hold about a million entries across their arrays.
const MAX_METADATA_VALUES: u64 = 1 << 24;
/// The most entries reserved up front for any count the file states; beyond
/// it, collections grow as entries actually parse, so a lying count cannot
/// request a huge allocation (which aborts rather than returning an error).
const MAX_PREALLOC: u64 = 1 << 16;

fn prealloc(count: u64) -> usize {
    count.min(MAX_PREALLOC) as usize
}

/// Where a tensor lives and what it holds.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the contiguous (row) length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset from the start of the data section.
    pub offset: u64,
    /// Total bytes, computed from dims and type.
    pub n_bytes: u64,
    /// The part of a split model that holds it (0: the first, or the only file).
    pub part: usize,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// Elements in one row (the first, contiguous dimension).
    pub fn row_len(&self) -> usize {
        self.dims.first().copied().unwrap_or(1) as usize
    }
    /// Number of rows: the product of every dimension after the first.
    pub fn n_rows(&self) -> usize {
        self.dims.iter().skip(1).product::<u64>() as usize
    }
}

/// The parsed header of a GGUF file: metadata and tensor table.
#[derive(Clone, Debug)]
pub struct GgufHeader {
    pub version: u32,
    pub alignment: u64,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    /// Absolute offset of the tensor data section.
    pub data_offset: u64,
    index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

/// A bounds-checked little-endian reader over the file's bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let remaining = (self.buf.len() - self.pos) as u64;
        if n > remaining {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
                needed: n,
                file_len: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }
    fn u8(&mut self, what: &dyn Fn() -> String) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &dyn Fn() -> String) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().unwrap()))
    }
    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    /// A count or length: u32 in GGUF v1, u64 from v2 on.
    fn len(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        self.u64(what)
    }
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let at = self.pos as u64;
        let n = self.len(what)?;
        let bytes = self.take(n, what)?;
        // Real files hold valid UTF-8; llama.cpp keeps invalid bytes as they are,
        // so a lossy decode is closer to it than a refusal.
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) if bytes.len() < (1 << 20) => Ok(String::from_utf8_lossy(bytes).into_owned()),
            Err(e) => Err(GgufError::Malformed { what: what(), offset: at, problem: e.to_string() }),
        }
    }
}

fn value_min_size(type_id: u32) -> Option<u64> {
    Some(match type_id {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,  // string: its length prefix
        9 => 12, // array: type + count
        10..=12 => 8,
        _ => return None,
    })
}

/// `budget` is how many more array elements the metadata may hold.
fn read_value(c: &mut Cursor, type_id: u32, key: &str, depth: u32, budget: &mut u64) -> Result<Value> {
    let what = || format!("metadata value of {key:?}");
    Ok(match type_id {
        0 => Value::U8(c.u8(&what)?),
        1 => Value::I8(c.u8(&what)? as i8),
        2 => Value::U16(c.u16(&what)?),
        3 => Value::I16(c.u16(&what)? as i16),
        4 => Value::U32(c.u32(&what)?),
        5 => Value::I32(c.u32(&what)? as i32),
        6 => Value::F32(f32::from_bits(c.u32(&what)?)),
        7 => {
            let at = c.pos as u64;
            match c.u8(&what)? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(GgufError::Malformed {
                        what: what(),
                        offset: at,
                        problem: format!("bool byte is {b}, expected 0 or 1"),
                    })
                }
            }
        }
        8 => Value::String(c.string(&what)?),
        9 => {
            let at = c.pos as u64;
            if depth >= MAX_ARRAY_DEPTH {
                return Err(GgufError::Malformed {
                    what: what(),
                    offset: at,
                    problem: format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"),
                });
            }
            let elem_type = c.u32(&what)?;
            let Some(min) = value_min_size(elem_type) else {
                return Err(GgufError::UnknownValueType { key: key.to_owned(), type_id: elem_type, offset: at });
            };
            let count = c.len(&what)?;
            // Refuse a count the rest of the file cannot possibly hold before
            // allocating anything for it.
            if count.saturating_mul(min) > c.remaining() {
                return Err(GgufError::Truncated {
                    what: format!("array of {count} values in {key:?}"),
                    offset: c.pos as u64,
                    needed: count.saturating_mul(min),
                    file_len: c.buf.len() as u64,
                });
            }
            if count > *budget {
                return Err(GgufError::Malformed {
                    what: format!("array of {count} values in {key:?}"),
                    offset: at,
                    problem: format!("metadata may hold at most {MAX_METADATA_VALUES} array values in all"),
                });
            }
            *budget -= count;
            let mut items = Vec::with_capacity(prealloc(count));
            for _ in 0..count {
                items.push(read_value(c, elem_type, key, depth + 1, budget)?);
            }
            Value::Array(items)
        }
        10 => Value::U64(c.u64(&what)?),
        11 => Value::I64(c.u64(&what)? as i64),
        12 => Value::F64(f64::from_bits(c.u64(&what)?)),
        other => {
            return Err(GgufError::UnknownValueType {
                key: key.to_owned(),
                type_id: other,
                offset: c.pos as u64 - 4,
            })
        }
    })
}

impl GgufHeader {
    /// Parses the header of a GGUF image held in `buf` (the whole file).
    pub fn parse(buf: &[u8]) -> Result<GgufHeader> {
        let mut c = Cursor { buf, pos: 0 };
        let magic: [u8; 4] = c.take(4, &|| "magic".into())?.try_into().unwrap();
        if &magic != MAGIC {
            return Err(GgufError::BadMagic(magic));
        }
        let version = c.u32(&|| "version".into())?;
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors = c.len(&|| "tensor count".into())?;
        let n_kv = c.len(&|| "metadata count".into())?;
        // Each key-value pair takes at least 8 + 4 + 1 bytes, each tensor entry 8 + 4 + 8 + 4 + 8.
        if n_kv.saturating_mul(13) > c.remaining() || n_tensors.saturating_mul(32) > c.remaining() {
            return Err(GgufError::Malformed {
                what: "header".into(),
                offset: 8,
                problem: format!(
                    "{n_kv} metadata entries and {n_tensors} tensors cannot fit in a file of {} bytes",
                    buf.len()
                ),
            });
        }

        let mut metadata = Vec::with_capacity(prealloc(n_kv));
        let mut index = HashMap::with_capacity(prealloc(n_kv));
        let mut budget = MAX_METADATA_VALUES;
        for i in 0..n_kv {
            let key = c.string(&|| format!("key of metadata entry {i}"))?;
            let at = c.pos as u64;
            let type_id = c.u32(&|| format!("value type of {key:?}"))?;
            if value_min_size(type_id).is_none() {
                return Err(GgufError::UnknownValueType { key, type_id, offset: at });
            }
            let value = read_value(&mut c, type_id, &key, 0, &mut budget)?;
            if index.insert(key.clone(), metadata.len()).is_some() {
                return Err(GgufError::BadMetadata { key, problem: "key appears twice".into() });
            }
            metadata.push((key, value));
        }

        let alignment = match index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a,
                _ => {
                    return Err(GgufError::BadMetadata {
                        key: "general.alignment".into(),
                        problem: format!("{v} is not a power of two up to 1 MiB"),
                    })
                }
            },
        };

        let mut tensors = Vec::with_capacity(prealloc(n_tensors));
        let mut tensor_index = HashMap::with_capacity(prealloc(n_tensors));
        for i in 0..n_tensors {
            let name = c.string(&|| format!("name of tensor {i}"))?;
            let what = || format!("tensor {name}");
            let n_dims = c.u32(&what)?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(GgufError::BadTensor { name, problem: format!("{n_dims} dimensions (1 to {MAX_DIMS} allowed)") });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64(&what)?);
            }
            let type_id = c.u32(&what)?;
            let offset = c.u64(&what)?;
            let Some(ty) = GgmlType::from_id(type_id) else {
                return Err(GgufError::BadTensor { name, problem: format!("unknown type id {type_id}") });
            };
            let mut n_elem: u64 = 1;
            for &d in &dims {
                n_elem = match n_elem.checked_mul(d) {
                    Some(n) if d > 0 => n,
                    _ => return Err(GgufError::BadTensor { name, problem: format!("dimensions {dims:?} are empty or overflow") }),
                };
            }
            if dims[0] % ty.block_size() as u64 != 0 {
                return Err(GgufError::BadTensor {
                    name,
                    problem: format!("row length {} is not a multiple of {}'s block of {}", dims[0], ty, ty.block_size()),
                });
            }
            let Some(n_bytes) = ty.row_bytes(dims[0]).and_then(|r| r.checked_mul(n_elem / dims[0])) else {
                return Err(GgufError::BadTensor { name, problem: format!("size of {dims:?} {ty} overflows") });
            };
            if offset % alignment != 0 {
                return Err(GgufError::BadTensor { name, problem: format!("offset {offset} is not aligned to {alignment}") });
            }
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(GgufError::BadTensor { name, problem: "name appears twice".into() });
            }
            tensors.push(TensorInfo { name, dims, ty, offset, n_bytes, part: 0 });
        }

        let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
        let data_len = (buf.len() as u64).saturating_sub(data_offset);
        for t in &tensors {
            let end = t.offset.checked_add(t.n_bytes);
            if end.is_none_or(|e| e > data_len) {
                return Err(GgufError::BadTensor {
                    name: t.name.clone(),
                    problem: format!(
                        "data [{}, +{}) lies outside the file (data section holds {} bytes from byte {})",
                        t.offset, t.n_bytes, data_len, data_offset
                    ),
                });
            }
        }
        Ok(GgufHeader { version, alignment, metadata, tensors, data_offset, index, tensor_index })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// A required string value.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| wrong_type(key, v, "a string"))
    }

    /// An optional unsigned integer: absent is `None`, present but of another type is an error.
    pub fn get_u64_opt(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| wrong_type(key, v, "an unsigned integer")),
        }
    }

    pub fn get_f64_opt(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| wrong_type(key, v, "a number")),
        }
    }

    pub fn get_bool_opt(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| wrong_type(key, v, "a bool")),
        }
    }

    pub fn get_str_opt(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| wrong_type(key, v, "a string")),
        }
    }

    pub fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| GgufError::BadMetadata { key: key.into(), problem: "missing".into() })
    }

    /// The model's architecture name (`general.architecture`).
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")
    }
}

fn wrong_type(key: &str, v: &Value, expected: &str) -> GgufError {
    GgufError::BadMetadata { key: key.into(), problem: format!("is {} ({}), expected {expected}", v.type_name(), v) }
}

/// A GGUF model mapped into memory: one file, or the parts of a split one
/// (`NAME-00001-of-00003.gguf` and its siblings, as llama.cpp's gguf-split
/// writes them) read as one.
pub struct GgufFile {
    /// Each part's mapping and the offset of its data section.
    parts: Vec<(memmap2::Mmap, u64)>,
    /// The first part's header, with every part's tensors.
    header: GgufHeader,
}

fn map_file(path: &Path) -> Result<memmap2::Mmap> {
    let io = |source| GgufError::Io { path: path.display().to_string(), source };
    let file = File::open(path).map_err(io)?;
    // SAFETY: the mapping is read-only; a file truncated underneath us by
    // another process is outside what any mmap-based loader can defend.
    unsafe { memmap2::Mmap::map(&file) }.map_err(io)
}

/// `(prefix, part number, parts)` of a split part's file name, if it is one.
fn split_name(path: &Path) -> Option<(String, usize, usize)> {
    let name = path.file_name()?.to_str()?.strip_suffix(".gguf")?;
    let (rest, count) = name.rsplit_once("-of-")?;
    let (prefix, index) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !(digits(index) && digits(count)) {
        return None;
    }
    Some((prefix.to_string(), index.parse().ok()?, count.parse().ok()?))
}

impl GgufFile {
    /// Opens a GGUF file. A split model is opened from its first part: the
    /// others are found beside it by name, checked against the first's
    /// `split.*` keys, and their tensors joined to its table.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let map = map_file(path)?;
        let mut header = GgufHeader::parse(&map)?;
        let count = header.get_u64_opt("split.count")?.unwrap_or(1) as usize;
        let mut parts = vec![(map, header.data_offset)];
        if count <= 1 {
            return Ok(GgufFile { parts, header });
        }
        let bad = |problem: String| GgufError::BadMetadata { key: "split.count".into(), problem };
        let Some((prefix, 1, named)) = split_name(path) else {
            return Err(bad(format!(
                "{count} parts: open the first, NAME-00001-of-{count:05}.gguf (this is {})",
                path.display()
            )));
        };
        if named != count {
            return Err(bad(format!("{count} parts, but the file name says {named}")));
        }
        for no in 2..=count {
            let part_path = path.with_file_name(format!("{prefix}-{no:05}-of-{count:05}.gguf"));
            let map = map_file(&part_path)?;
            let part = GgufHeader::parse(&map)?;
            let (its_no, its_count) = (part.get_u64_opt("split.no")?, part.get_u64_opt("split.count")?);
            if its_no != Some(no as u64 - 1) || its_count != Some(count as u64) {
                return Err(bad(format!(
                    "{} says it is part {:?} of {:?}, expected {} of {count}",
                    part_path.display(),
                    its_no.map(|n| n + 1),
                    its_count,
                    no
                )));
            }
            for mut t in part.tensors {
                t.part = parts.len();
                if header.tensor_index.insert(t.name.clone(), header.tensors.len()).is_some() {
                    return Err(GgufError::BadTensor {
                        name: t.name.clone(),
                        problem: format!("is in more than one part (again in {})", part_path.display()),
                    });
                }
                header.tensors.push(t);
            }
            parts.push((map, part.data_offset));
        }
        if let Some(total) = header.get_u64_opt("split.tensors.count")? {
            if total != header.tensors.len() as u64 {
                return Err(GgufError::BadMetadata {
                    key: "split.tensors.count".into(),
                    problem: format!("says {total} tensors, but the {count} parts hold {}", header.tensors.len()),
                });
            }
        }
        Ok(GgufFile { parts, header })
    }

    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// The bytes of a tensor, bounds already checked at parse time.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let (map, data_offset) = &self.parts[t.part];
        let start = (data_offset + t.offset) as usize;
        &map[start..start + t.n_bytes as usize]
    }

    /// Bytes of every part together.
    pub fn file_len(&self) -> u64 {
        self.parts.iter().map(|(m, _)| m.len() as u64).sum()
    }

    /// How many files the model is (1 unless it is split).
    pub fn n_parts(&self) -> usize {
        self.parts.len()
    }
}

impl std::ops::Deref for GgufFile {
    type Target = GgufHeader;
    fn deref(&self) -> &GgufHeader {
        &self.header
    }
}
