//! The key/value cache of one sequence: per layer, the keys and values of every
//! position the sequence holds, stored as f16 or f32.
//!
//! Built around sequences rather than a single append-only buffer: a sequence
//! can be cut back to a prefix, copied, and saved to bytes and restored, which
//! is what slots, prefix reuse and state checkpoints need. Layers with a
//! sliding window keep a ring of `window + max_batch` rows instead of the whole
//! context; rewinding such a layer into positions it has overwritten is refused
//! by [`KvCache::truncate`], which reports the furthest position that stays valid.

use half::f16;
use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
pub enum KvError {
    #[error("the context is full: {needed} positions needed, the cache holds {capacity}")]
    ContextFull { needed: usize, capacity: usize },
    #[error("a pass of {n} tokens is larger than the sliding-window ring allows ({max})")]
    BatchTooLarge { n: usize, max: usize },
    #[error("saved state does not fit this cache: {0}")]
    BadState(String),
}

/// Element type of the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    F16,
    F32,
}

impl KvType {
    pub fn parse(s: &str) -> Option<KvType> {
        match s {
            "f16" => Some(KvType::F16),
            "f32" => Some(KvType::F32),
            _ => None,
        }
    }
    fn size(self) -> usize {
        match self {
            KvType::F16 => 2,
            KvType::F32 => 4,
        }
    }
}

/// Shape of one layer's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerShape {
    /// Floats per position for keys: n_kv_heads * head_dim_k.
    pub k_width: usize,
    /// Floats per position for values: n_kv_heads * head_dim_v.
    pub v_width: usize,
    /// Sliding attention window (keys visible to a query: the last `window` positions), if any.
    pub window: Option<usize>,
}

#[derive(Clone)]
enum Store {
    F16(Vec<f16>),
    F32(Vec<f32>),
}

impl Store {
    fn new(ty: KvType, n: usize) -> Store {
        match ty {
            KvType::F16 => Store::F16(vec![f16::ZERO; n]),
            KvType::F32 => Store::F32(vec![0.0; n]),
        }
    }
    fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            Store::F16(v) => {
                for (d, s) in v[at..at + src.len()].iter_mut().zip(src) {
                    *d = f16::from_f32(*s);
                }
            }
            Store::F32(v) => v[at..at + src.len()].copy_from_slice(src),
        }
    }
    fn bytes(&self) -> &[u8] {
        match self {
            Store::F16(v) => as_bytes(v),
            Store::F32(v) => as_bytes(v),
        }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Store::F16(v) => as_bytes_mut(v),
            Store::F32(v) => as_bytes_mut(v),
        }
    }
}

fn as_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: f16 and f32 are plain old data with no padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}
fn as_bytes_mut<T: Copy>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as above; any bit pattern is a valid f16/f32.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}

/// Read access to one layer's keys or values, by position.
pub enum Rows<'a> {
    F16(&'a [f16]),
    F32(&'a [f32]),
}

#[derive(Clone)]
struct LayerKv {
    shape: LayerShape,
    /// Rows held: the whole context, or a ring of window + max_batch rows.
    rows: usize,
    k: Store,
    v: Store,
}

/// The cache of one sequence.
#[derive(Clone)]
pub struct KvCache {
    ty: KvType,
    n_ctx: usize,
    max_batch: usize,
    layers: Vec<LayerKv>,
    /// Positions held: 0..len.
    len: usize,
}

impl KvCache {
    /// A cache of `n_ctx` positions. `max_batch` bounds the tokens of one pass,
    /// which sizes the rings of sliding-window layers.
    pub fn new(ty: KvType, n_ctx: usize, max_batch: usize, layers: &[LayerShape]) -> KvCache {
        let layers = layers
            .iter()
            .map(|&shape| {
                let rows = match shape.window {
                    Some(w) => (w + max_batch).min(n_ctx),
                    None => n_ctx,
                };
                LayerKv { shape, rows, k: Store::new(ty, rows * shape.k_width), v: Store::new(ty, rows * shape.v_width) }
            })
            .collect();
        KvCache { ty, n_ctx, max_batch, layers, len: 0 }
    }

    pub fn kv_type(&self) -> KvType {
        self.ty
    }
    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }
    /// Bytes the cache holds in memory.
    pub fn memory_bytes(&self) -> usize {
        self.layers.iter().map(|l| l.rows * (l.shape.k_width + l.shape.v_width) * self.ty.size()).sum()
    }

    /// Checks that `n` more positions fit, before a pass writes any of them.
    pub fn reserve(&self, n: usize) -> Result<(), KvError> {
        if n > self.max_batch {
            return Err(KvError::BatchTooLarge { n, max: self.max_batch });
        }
        if self.len + n > self.n_ctx {
            return Err(KvError::ContextFull { needed: self.len + n, capacity: self.n_ctx });
        }
        Ok(())
    }

    /// Row index of position `pos` in layer `il`.
    #[inline]
    pub fn row_of(&self, il: usize, pos: usize) -> usize {
        pos % self.layers[il].rows
    }

    /// The rows of consecutive positions `first..first + n` (`n` at most the
    /// layer's rows, as any span a reader sees is), without a division per
    /// position: the ring wraps at most once within them.
    pub fn ring_rows(&self, il: usize, first: usize) -> RingRows {
        let ring = self.layers[il].rows;
        RingRows { first, row0: first % ring, ring }
    }

    /// Writes the keys and values of position `pos` (which must be `len()` + i
    /// for a pass in progress) into layer `il`.
    pub fn write(&mut self, il: usize, pos: usize, k: &[f32], v: &[f32]) {
        let l = &mut self.layers[il];
        debug_assert_eq!(k.len(), l.shape.k_width);
        debug_assert_eq!(v.len(), l.shape.v_width);
        let row = pos % l.rows;
        l.k.write(row * l.shape.k_width, k);
        l.v.write(row * l.shape.v_width, v);
    }

    /// Marks `n` positions written by the pass just finished as held.
    pub fn commit(&mut self, n: usize) {
        self.len += n;
        debug_assert!(self.len <= self.n_ctx);
    }

    pub fn keys(&self, il: usize) -> Rows<'_> {
        rows(&self.layers[il].k)
    }
    pub fn values(&self, il: usize) -> Rows<'_> {
        rows(&self.layers[il].v)
    }
    pub fn shape(&self, il: usize) -> LayerShape {
        self.layers[il].shape
    }

    /// The earliest position whose keys are still stored in layer `il`, given `len` positions held.
    fn oldest_kept(&self, il: usize, len: usize) -> usize {
        len.saturating_sub(self.layers[il].rows)
    }

    /// The longest prefix `p <= n` the cache can be cut back to: every layer must
    /// still hold the keys that a query at position `p` sees (`p+1-window ..= p-1`).
    /// Full layers always do; a ring has overwritten positions older than its
    /// size, and only a restart from 0 avoids needing them.
    pub fn max_truncation(&self, n: usize) -> usize {
        let p = n.min(self.len);
        for (il, l) in self.layers.iter().enumerate() {
            if let Some(w) = l.shape.window {
                if (p + 1).saturating_sub(w) < self.oldest_kept(il, self.len) {
                    return 0;
                }
            }
        }
        p
    }

    /// Keeps positions `0..n` and drops the rest. Returns the length actually
    /// kept, which is smaller than `n` when a sliding-window ring no longer
    /// holds what position `n` would need (the caller feeds the gap again).
    pub fn truncate(&mut self, n: usize) -> usize {
        let keep = self.max_truncation(n);
        self.len = keep;
        keep
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Serialises the held positions (with shapes, for checking on restore).
    pub fn save_state(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"EMKV");
        for v in [self.ty.size(), self.n_ctx, self.max_batch, self.layers.len(), self.len] {
            out.extend_from_slice(&(v as u64).to_le_bytes());
        }
        for l in &self.layers {
            for v in [l.shape.k_width, l.shape.v_width, l.shape.window.unwrap_or(0), l.rows] {
                out.extend_from_slice(&(v as u64).to_le_bytes());
            }
            out.extend_from_slice(l.k.bytes());
            out.extend_from_slice(l.v.bytes());
        }
        out
    }

    /// Restores a state written by [`save_state`](Self::save_state) of a cache of the same shape.
    pub fn restore_state(&mut self, state: &[u8]) -> Result<(), KvError> {
        let mut r = StateReader { buf: state, pos: 0 };
        if r.take(4)? != b"EMKV" {
            return Err(KvError::BadState("not a cache state".into()));
        }
        let head = [r.u()?, r.u()?, r.u()?, r.u()?];
        let len = r.u()?;
        if head != [self.ty.size(), self.n_ctx, self.max_batch, self.layers.len()] || len > self.n_ctx {
            return Err(KvError::BadState("element type, context or layer count differ".into()));
        }
        // Check every layer before writing any, so a bad state leaves the cache as it was.
        let mut chunks = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            let dims = [r.u()?, r.u()?, r.u()?, r.u()?];
            if dims != [l.shape.k_width, l.shape.v_width, l.shape.window.unwrap_or(0), l.rows] {
                return Err(KvError::BadState("layer shapes differ".into()));
            }
            let k = r.take(l.k.bytes().len())?;
            let v = r.take(l.v.bytes().len())?;
            chunks.push((k, v));
        }
        if r.pos != state.len() {
            return Err(KvError::BadState("trailing bytes".into()));
        }
        for (l, (k, v)) in self.layers.iter_mut().zip(chunks) {
            l.k.bytes_mut().copy_from_slice(k);
            l.v.bytes_mut().copy_from_slice(v);
        }
        self.len = len;
        Ok(())
    }
}

struct StateReader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> StateReader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], KvError> {
        let s = self.buf.get(self.pos..self.pos + n).ok_or_else(|| KvError::BadState("truncated".into()))?;
        self.pos += n;
        Ok(s)
    }
    fn u(&mut self) -> Result<usize, KvError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()) as usize)
    }
}

fn rows(s: &Store) -> Rows<'_> {
    match s {
        Store::F16(v) => Rows::F16(v),
        Store::F32(v) => Rows::F32(v),
    }
}

/// Row lookup for a span of positions (see [`KvCache::ring_rows`]).
#[derive(Clone, Copy, Debug)]
pub struct RingRows {
    first: usize,
    row0: usize,
    ring: usize,
}

impl RingRows {
    /// The row of position `pos`, `first <= pos < first + ring`.
    #[inline(always)]
    pub fn row(&self, pos: usize) -> usize {
        debug_assert!(pos >= self.first && pos - self.first < self.ring, "position {pos} outside the span");
        let r = self.row0 + (pos - self.first);
        if r >= self.ring {
            r - self.ring
        } else {
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes() -> Vec<LayerShape> {
        vec![
            LayerShape { k_width: 4, v_width: 4, window: Some(3) },
            LayerShape { k_width: 4, v_width: 2, window: None },
        ]
    }

    fn fill(c: &mut KvCache, n: usize) {
        if n > c.max_batch() {
            fill(c, n - c.max_batch());
            return fill(c, c.max_batch());
        }
        c.reserve(n).unwrap();
        let base = c.len();
        for i in 0..n {
            let p = (base + i) as f32;
            for il in 0..c.n_layers() {
                let s = c.shape(il);
                c.write(il, base + i, &vec![p; s.k_width], &vec![-p; s.v_width]);
            }
        }
        c.commit(n);
    }

    fn key_at(c: &KvCache, il: usize, pos: usize) -> f32 {
        let row = c.row_of(il, pos) * c.shape(il).k_width;
        match c.keys(il) {
            Rows::F16(k) => k[row].to_f32(),
            Rows::F32(k) => k[row],
        }
    }

    /// Every span a reader can see, anywhere on the ring (wrapping or not),
    /// maps its positions to the rows `row_of` gives.
    #[test]
    fn ring_rows_equal_row_of() {
        let c = KvCache::new(KvType::F32, 100, 2, &shapes());
        for il in 0..shapes().len() {
            let ring = c.layers[il].rows;
            for first in 0..3 * ring {
                let rows = c.ring_rows(il, first);
                for pos in first..first + ring {
                    assert_eq!(rows.row(pos), c.row_of(il, pos), "layer {il} first {first} pos {pos}");
                }
            }
        }
    }

    #[test]
    fn ring_keeps_window_plus_batch() {
        let mut c = KvCache::new(KvType::F32, 100, 2, &shapes());
        for _ in 0..10 {
            fill(&mut c, 2);
        }
        assert_eq!(c.len(), 20);
        // ring of 5 rows holds positions 15..20
        for p in 15..20 {
            assert_eq!(key_at(&c, 0, p), p as f32);
        }
        for p in 0..20 {
            assert_eq!(key_at(&c, 1, p), p as f32);
        }
    }

    #[test]
    fn truncate_inside_the_ring_is_exact_and_beyond_it_is_clamped() {
        let mut c = KvCache::new(KvType::F16, 100, 2, &shapes());
        fill(&mut c, 20);
        // ring holds 15..20: resuming at 19 needs 17, 18 -> fine
        assert_eq!(c.clone().truncate(19), 19);
        // resuming at 17 needs 15, 16 -> fine
        assert_eq!(c.clone().truncate(17), 17);
        // resuming at 16 needs 14: overwritten, so only a restart is valid
        assert_eq!(c.max_truncation(16), 0);
        assert_eq!(c.max_truncation(10), 0);
        let mut full_only = KvCache::new(KvType::F16, 100, 2, &shapes()[1..]);
        fill(&mut full_only, 20);
        assert_eq!(full_only.truncate(3), 3);
    }

    #[test]
    fn context_and_batch_limits_are_errors() {
        let mut c = KvCache::new(KvType::F32, 8, 4, &shapes());
        fill(&mut c, 4);
        fill(&mut c, 4);
        assert_eq!(c.reserve(1), Err(KvError::ContextFull { needed: 9, capacity: 8 }));
        assert_eq!(c.reserve(5), Err(KvError::BatchTooLarge { n: 5, max: 4 }));
    }

    #[test]
    fn save_and_restore_round_trip() {
        let mut a = KvCache::new(KvType::F16, 16, 4, &shapes());
        fill(&mut a, 7);
        let state = a.save_state();
        let mut b = KvCache::new(KvType::F16, 16, 4, &shapes());
        b.restore_state(&state).unwrap();
        assert_eq!(b.len(), 7);
        for p in 0..7 {
            assert_eq!(key_at(&b, 1, p), p as f32);
        }
        let mut other = KvCache::new(KvType::F32, 16, 4, &shapes());
        assert!(other.restore_state(&state).is_err());
        assert!(b.restore_state(&state[..state.len() - 1]).is_err());
    }
}
