//! The key/value cache of one sequence: per layer, the keys and values of every
//! position the sequence holds, stored as f16, bf16, f32 or Q8_0 blocks (32
//! elements to an f16 scale and 32 signed bytes, quantized as llama.cpp's
//! x86 backend copies rows into a Q8_0 cache; about half an f16 cache).
//! bf16 keeps f32's range with 8 bits of precision where f16 has 11, and is
//! what a core with AVX-512 BF16 multiplies two of at a time.
//!
//! Built around sequences rather than a single append-only buffer: a sequence
//! can be cut back to a prefix, copied, and saved to bytes and restored, which
//! is what slots, prefix reuse and state checkpoints need. Layers with a
//! sliding window keep a ring of `window + max_batch` rows instead of the whole
//! context; rewinding such a layer into positions it has overwritten is refused
//! by [`KvCache::truncate`], which reports the furthest position that stays valid.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};

use half::{bf16, f16};
use thiserror::Error;

mod checkpoint;
pub use checkpoint::{hash_tokens, Checkpoint, CheckpointPolicy, Checkpoints, RestoreRefused, Taken, CHECKPOINT_GRID};

#[derive(Debug, Error, PartialEq)]
pub enum KvError {
    #[error("the context is full: {needed} positions needed, the cache holds {capacity}")]
    ContextFull { needed: usize, capacity: usize },
    #[error("a pass of {n} tokens is larger than the sliding-window ring allows ({max})")]
    BatchTooLarge { n: usize, max: usize },
    #[error("saved state does not fit this cache: {0}")]
    BadState(String),
    /// The owner of rows held elsewhere (a device) could not write them.
    #[error("restoring the rows where they are held: {0}")]
    Placement(String),
}

/// Element type of the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    F16,
    BF16,
    F32,
    Q8_0,
}

/// Elements of one Q8_0 block, and its bytes (an f16 scale, then 32 quants).
pub const Q8_0_BLOCK: usize = 32;
pub const Q8_0_BYTES: usize = 34;

impl KvType {
    pub fn parse(s: &str) -> Option<KvType> {
        match s {
            "f16" => Some(KvType::F16),
            "bf16" => Some(KvType::BF16),
            "f32" => Some(KvType::F32),
            "q8_0" => Some(KvType::Q8_0),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::BF16 => "bf16",
            KvType::F32 => "f32",
            KvType::Q8_0 => "q8_0",
        }
    }
    /// Whether a head of `dim` elements can be stored and read on its own:
    /// a Q8_0 head must be whole blocks.
    pub fn holds_heads_of(self, dim: usize) -> bool {
        self != KvType::Q8_0 || dim.is_multiple_of(Q8_0_BLOCK)
    }
    /// Bytes of `n` elements (a whole number of blocks for Q8_0).
    pub fn bytes(self, n: usize) -> usize {
        match self {
            KvType::F16 | KvType::BF16 => 2 * n,
            KvType::F32 => 4 * n,
            KvType::Q8_0 => n / Q8_0_BLOCK * Q8_0_BYTES,
        }
    }
    /// The type's mark in a saved state (its element size for f16 and f32).
    fn code(self) -> usize {
        match self {
            KvType::F16 => 2,
            KvType::BF16 => 0xbf16,
            KvType::F32 => 4,
            KvType::Q8_0 => 34,
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
    BF16(Vec<bf16>),
    F32(Vec<f32>),
    /// Q8_0 blocks, element `i` in block `i / 32`.
    Q8_0(Vec<u8>),
    /// The rows are held by the cache's owner elsewhere (a device): this
    /// cache keeps their positions and rules alone.
    Elsewhere,
}

impl Store {
    /// Room for `n` elements, none of them there yet: the rows are made as
    /// positions reach them ([`ensure`](Self::ensure)), so a cache takes the
    /// memory of what it holds (a large allocation is the system's promise
    /// of pages, given as they are first written).
    fn new(ty: KvType, n: usize) -> Store {
        match ty {
            KvType::F16 => Store::F16(Vec::with_capacity(n)),
            KvType::BF16 => Store::BF16(Vec::with_capacity(n)),
            KvType::F32 => Store::F32(Vec::with_capacity(n)),
            KvType::Q8_0 => Store::Q8_0(Vec::with_capacity(KvType::Q8_0.bytes(n))),
        }
    }

    /// Makes elements `0..n` (whole blocks for Q8_0) readable, those new zero.
    #[inline]
    fn ensure(&mut self, n: usize) {
        match self {
            Store::F16(v) if v.len() < n => v.resize(n, f16::ZERO),
            Store::BF16(v) if v.len() < n => v.resize(n, bf16::ZERO),
            Store::F32(v) if v.len() < n => v.resize(n, 0.0),
            Store::Q8_0(v) if v.len() < KvType::Q8_0.bytes(n) => v.resize(KvType::Q8_0.bytes(n), 0),
            _ => {}
        }
    }

    /// Writes `src` at element `at` (both whole blocks for Q8_0).
    fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            Store::F16(v) => {
                for (d, s) in v[at..at + src.len()].iter_mut().zip(src) {
                    *d = f16::from_f32(*s);
                }
            }
            Store::BF16(v) => {
                for (d, s) in v[at..at + src.len()].iter_mut().zip(src) {
                    *d = to_bf16(*s);
                }
            }
            Store::F32(v) => v[at..at + src.len()].copy_from_slice(src),
            Store::Q8_0(v) => {
                let (from, n) = (KvType::Q8_0.bytes(at), KvType::Q8_0.bytes(src.len()));
                ember_quant::quantize_row_q8_0(src, &mut v[from..from + n]).expect("rows are whole blocks");
            }
            Store::Elsewhere => panic!("this cache's rows are held elsewhere; their owner writes them"),
        }
    }
    fn bytes(&self) -> &[u8] {
        match self {
            Store::F16(v) => as_bytes(v),
            Store::BF16(v) => as_bytes(v),
            Store::F32(v) => as_bytes(v),
            Store::Q8_0(v) => v,
            Store::Elsewhere => &[],
        }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Store::F16(v) => as_bytes_mut(v),
            Store::BF16(v) => as_bytes_mut(v),
            Store::F32(v) => as_bytes_mut(v),
            Store::Q8_0(v) => v,
            Store::Elsewhere => &mut [],
        }
    }
}

/// `x` to bf16, rounding to nearest even, with what would be a subnormal
/// bf16 made a zero of its sign: AVX-512's bf16 products read subnormals as
/// zero, so a cache that holds none is multiplied the same way everywhere.
/// (A key or value that small is none a model makes.)
pub fn to_bf16(x: f32) -> bf16 {
    if x.abs() < f32::MIN_POSITIVE {
        return bf16::from_bits(((x.to_bits() >> 16) & 0x8000) as u16);
    }
    bf16::from_f32(x)
}

fn as_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: f16, bf16 and f32 are plain old data with no padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}
fn as_bytes_mut<T: Copy>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as above; any bit pattern is a valid f16, bf16 or f32.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}

/// Read access to one layer's keys or values, by position: element `i` of
/// row `r` (rows `width` wide) is element `r * width + i` of the layer.
#[derive(Clone, Copy)]
pub enum Rows<'a> {
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    F32(&'a [f32]),
    /// Q8_0 blocks: element `e` is `d * q` of block `e / 32`.
    Q8_0(&'a [u8]),
}

impl<'a> Rows<'a> {
    /// Elements `at..at + n` alone (whole blocks for Q8_0): a head of a
    /// row, say.
    #[inline]
    pub fn slice(&self, at: usize, n: usize) -> Rows<'a> {
        match *self {
            Rows::F16(r) => Rows::F16(&r[at..at + n]),
            Rows::BF16(r) => Rows::BF16(&r[at..at + n]),
            Rows::F32(r) => Rows::F32(&r[at..at + n]),
            Rows::Q8_0(r) => {
                assert!(at.is_multiple_of(Q8_0_BLOCK) && n.is_multiple_of(Q8_0_BLOCK), "Q8_0 rows are read in whole blocks");
                let from = KvType::Q8_0.bytes(at);
                Rows::Q8_0(&r[from..from + KvType::Q8_0.bytes(n)])
            }
        }
    }

    /// The bytes the elements are stored in.
    #[inline]
    pub fn bytes(&self) -> &'a [u8] {
        match *self {
            Rows::F16(r) => as_bytes(r),
            Rows::BF16(r) => as_bytes(r),
            Rows::F32(r) => as_bytes(r),
            Rows::Q8_0(r) => r,
        }
    }

    /// Elements `at..at + out.len()` as f32 (exactly: an f16, a bf16, or a
    /// Q8_0 quant times its f16 scale, is exact in f32). For Q8_0, `at` and
    /// the length are whole blocks.
    pub fn widen(&self, at: usize, out: &mut [f32]) {
        match self.slice(at, out.len()) {
            Rows::F16(r) => out.iter_mut().zip(r).for_each(|(o, x)| *o = x.to_f32()),
            Rows::BF16(r) => out.iter_mut().zip(r).for_each(|(o, x)| *o = x.to_f32()),
            Rows::F32(r) => out.copy_from_slice(r),
            Rows::Q8_0(r) => {
                for (o, b) in out.chunks_exact_mut(Q8_0_BLOCK).zip(r.chunks_exact(Q8_0_BYTES)) {
                    let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                    o.iter_mut().zip(&b[2..]).for_each(|(o, &q)| *o = d * q as i8 as f32);
                }
            }
        }
    }
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
    /// The recurrent states of a hybrid model's other layers (f32, in the
    /// layout their forward pass keeps), each the sum of every position held:
    /// unlike keys and values they cannot be cut back to a shorter prefix.
    states: Vec<Vec<f32>>,
    /// The stamp of the states' last edit ([`states_stamp`](Self::states_stamp)).
    states_stamp: u64,
    /// Whether the cache's owner holds newer states than `states` (a device
    /// that carried them through its passes): they are read only once taken
    /// back ([`states_back`](Self::states_back)).
    states_elsewhere: bool,
    /// Positions held: 0..len.
    len: usize,
}

/// The last stamp given to an edit of a cache's recurrent states: stamps
/// are unique across every cache, so two caches whose states carry one hold
/// the same states (one is a copy of the other, and neither was edited
/// since).
static STATE_EDITS: AtomicU64 = AtomicU64::new(0);

fn next_state_stamp() -> u64 {
    STATE_EDITS.fetch_add(1, Ordering::Relaxed) + 1
}

impl KvCache {
    /// A cache of `n_ctx` positions. `max_batch` bounds the tokens of one pass,
    /// which sizes the rings of sliding-window layers.
    pub fn new(ty: KvType, n_ctx: usize, max_batch: usize, layers: &[LayerShape]) -> KvCache {
        Self::build(ty, n_ctx, max_batch, layers, true)
    }

    /// A cache of `new`'s shape whose rows its owner holds elsewhere (on a
    /// device, laid out as here: the row of position p is p % the layer's
    /// rows): it keeps the positions held and answers every question of
    /// room, rings and truncation as `new`'s does, and holds no row itself.
    pub fn held_elsewhere(ty: KvType, n_ctx: usize, max_batch: usize, layers: &[LayerShape]) -> KvCache {
        Self::build(ty, n_ctx, max_batch, layers, false)
    }

    /// Whether the rows are held by the cache's owner (see [`held_elsewhere`](Self::held_elsewhere)).
    pub fn rows_elsewhere(&self) -> bool {
        self.layers.first().is_some_and(|l| matches!(l.k, Store::Elsewhere))
    }

    /// Rows of layer `il`: the whole context, or a sliding window's ring.
    pub fn layer_rows(&self, il: usize) -> usize {
        self.layers[il].rows
    }

    fn build(ty: KvType, n_ctx: usize, max_batch: usize, layers: &[LayerShape], here: bool) -> KvCache {
        let store = |n: usize| if here { Store::new(ty, n) } else { Store::Elsewhere };
        let layers = layers
            .iter()
            .map(|&shape| {
                assert!(
                    shape.k_width.is_multiple_of(Q8_0_BLOCK) && shape.v_width.is_multiple_of(Q8_0_BLOCK) || ty != KvType::Q8_0,
                    "a Q8_0 cache holds rows of whole blocks"
                );
                let rows = match shape.window {
                    Some(w) => (w + max_batch).min(n_ctx),
                    None => n_ctx,
                };
                LayerKv { shape, rows, k: store(rows * shape.k_width), v: store(rows * shape.v_width) }
            })
            .collect();
        KvCache {
            ty,
            n_ctx,
            max_batch,
            layers,
            states: Vec::new(),
            states_stamp: next_state_stamp(),
            states_elsewhere: false,
            len: 0,
        }
    }

    /// The same cache with a recurrent state of `floats` f32 for each entry
    /// (zero: nothing read yet).
    pub fn with_states(mut self, floats: &[usize]) -> KvCache {
        self.states = floats.iter().map(|&n| vec![0.0; n]).collect();
        self.states_stamp = next_state_stamp();
        self.states_elsewhere = false;
        self
    }

    /// Recurrent state `i`, as the positions held left it.
    pub fn state(&self, i: usize) -> &[f32] {
        self.check_states_here();
        &self.states[i]
    }

    /// Recurrent state `i`, for the pass in progress to carry forward.
    pub fn state_mut(&mut self, i: usize) -> &mut [f32] {
        self.check_states_here();
        self.states_stamp = next_state_stamp();
        &mut self.states[i]
    }

    /// The owner's pass carried the states forward where it holds them (a
    /// device, which reads them back only when the host needs them): the
    /// cache's own are stale until [`states_back`](Self::states_back).
    /// Returns the new states' stamp, which the owner keeps beside them.
    pub fn states_moved_elsewhere(&mut self) -> u64 {
        self.states_stamp = next_state_stamp();
        self.states_elsewhere = true;
        self.states_stamp
    }

    /// Whether the owner holds newer states than the cache (see
    /// [`states_moved_elsewhere`](Self::states_moved_elsewhere)).
    pub fn states_elsewhere(&self) -> bool {
        self.states_elsewhere
    }

    /// The states the owner holds, taken back ([`copy_states_into`]'s
    /// form): the stamp stays, since they are the states it names.
    ///
    /// [`copy_states_into`]: Self::copy_states_into
    pub fn states_back(&mut self, all: &[f32]) {
        self.fill_states(all);
        self.states_elsewhere = false;
    }

    /// A read of states the owner holds newer ones of would give an
    /// earlier position's: the owner takes them back first.
    fn check_states_here(&self) {
        assert!(!self.states_elsewhere, "recurrent states read while their owner holds newer ones");
    }

    /// A stamp of the recurrent states as they are: every edit (a pass, a
    /// restore, a clear) gives them a new one, unique across every cache,
    /// and a copy of the cache keeps it. So whoever holds a copy of them
    /// elsewhere (a device between passes) knows by the stamp whether it
    /// still holds these.
    pub fn states_stamp(&self) -> u64 {
        self.states_stamp
    }

    pub fn n_states(&self) -> usize {
        self.states.len()
    }

    /// Floats of every recurrent state together.
    pub fn states_len(&self) -> usize {
        self.states.iter().map(Vec::len).sum()
    }

    /// Every recurrent state, one after another in order, appended to `out`
    /// (the form checkpoints and a device's state buffer hold them in).
    pub fn copy_states_into(&self, out: &mut Vec<f32>) {
        self.check_states_here();
        self.states.iter().for_each(|s| out.extend_from_slice(s));
    }

    /// Sets every recurrent state from `all` ([`copy_states_into`]'s form,
    /// [`states_len`] floats).
    ///
    /// [`copy_states_into`]: Self::copy_states_into
    /// [`states_len`]: Self::states_len
    pub fn set_states(&mut self, all: &[f32]) {
        self.fill_states(all);
        self.states_stamp = next_state_stamp();
        self.states_elsewhere = false;
    }

    fn fill_states(&mut self, all: &[f32]) {
        assert_eq!(all.len(), self.states_len(), "states of another cache's shape");
        let mut rest = all;
        for st in &mut self.states {
            let (head, tail) = rest.split_at(st.len());
            st.copy_from_slice(head);
            rest = tail;
        }
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
    /// Bytes the cache holds (its rows wherever they are held).
    pub fn memory_bytes(&self) -> usize {
        let kv: usize =
            self.layers.iter().map(|l| self.ty.bytes(l.rows * l.shape.k_width) + self.ty.bytes(l.rows * l.shape.v_width)).sum();
        kv + self.states.iter().map(|s| 4 * s.len()).sum::<usize>()
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
        l.k.ensure((row + 1) * l.shape.k_width);
        l.v.ensure((row + 1) * l.shape.v_width);
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
        // A recurrent state holds every position at once: it cannot lose the last few.
        if !self.states.is_empty() && n < self.len {
            return 0;
        }
        self.max_rewind(n)
    }

    /// [`max_truncation`](Self::max_truncation) for the keys and values alone:
    /// how far they can be cut back when a checkpoint supplies the states.
    fn max_rewind(&self, n: usize) -> usize {
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
        if keep == 0 {
            self.clear();
        }
        self.len = keep;
        keep
    }

    /// Cuts the keys and values back to positions `0..n`, leaving the
    /// recurrent states for a checkpoint to replace. Returns the length kept
    /// (0, with the cache cleared, when a ring no longer holds what `n` needs).
    fn rewind(&mut self, n: usize) -> usize {
        let keep = self.max_rewind(n);
        if keep == 0 {
            self.clear();
        }
        self.len = keep;
        keep
    }

    /// [`clear`](Self::clear), and the rows' memory given back: for a cache
    /// whose positions other caches may need (slots sharing one context).
    pub fn release(&mut self) {
        self.clear();
        let ty = self.ty;
        for l in &mut self.layers {
            if !matches!(l.k, Store::Elsewhere) {
                l.k = Store::new(ty, l.rows * l.shape.k_width);
                l.v = Store::new(ty, l.rows * l.shape.v_width);
            }
        }
    }

    /// Bytes of the rows made so far (see [`memory_bytes`](Self::memory_bytes)
    /// for all the cache may take).
    pub fn made_bytes(&self) -> usize {
        self.layers.iter().map(|l| l.k.bytes().len() + l.v.bytes().len()).sum()
    }

    /// Bytes the sliding-window layers' rings may take: a cache's part that
    /// does not grow with its context.
    pub fn ring_bytes(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| l.shape.window.is_some())
            .map(|l| self.ty.bytes(l.rows * l.shape.k_width) + self.ty.bytes(l.rows * l.shape.v_width))
            .sum()
    }

    pub fn clear(&mut self) {
        self.len = 0;
        self.states.iter_mut().for_each(|s| s.fill(0.0));
        self.states_stamp = next_state_stamp();
        self.states_elsewhere = false;
    }

    /// Serialises the held positions (with shapes, for checking on restore):
    /// of each layer only the rows in use, so a slot holding a few tokens
    /// saves a few tokens' keys and values, not its whole capacity.
    pub fn save_state(&self) -> Vec<u8> {
        let rows = |il: usize, used: usize| {
            let l = &self.layers[il];
            let (kb, vb) = (self.ty.bytes(l.shape.k_width), self.ty.bytes(l.shape.v_width));
            Ok::<_, std::convert::Infallible>((
                Cow::Borrowed(&l.k.bytes()[..used * kb]),
                Cow::Borrowed(&l.v.bytes()[..used * vb]),
            ))
        };
        match self.save_state_with(rows) {
            Ok(state) => state,
        }
    }

    /// [`save_state`](Self::save_state) with each layer's rows from
    /// `rows(layer, used)`: its first `used` rows of keys, then of values, as
    /// bytes in this cache's element type (what the owner of rows
    /// [held elsewhere](Self::held_elsewhere) reads back to save them).
    pub fn save_state_with<'r, E>(
        &self,
        mut rows: impl FnMut(usize, usize) -> Result<(Cow<'r, [u8]>, Cow<'r, [u8]>), E>,
    ) -> Result<Vec<u8>, E> {
        let mut out = Vec::new();
        out.extend_from_slice(STATE_MAGIC);
        for v in [self.ty.code(), self.n_ctx, self.max_batch, self.layers.len(), self.len] {
            out.extend_from_slice(&(v as u64).to_le_bytes());
        }
        for (il, l) in self.layers.iter().enumerate() {
            let used = self.len.min(l.rows);
            for v in [l.shape.k_width, l.shape.v_width, l.shape.window.unwrap_or(0), l.rows, used] {
                out.extend_from_slice(&(v as u64).to_le_bytes());
            }
            let (k, v) = rows(il, used)?;
            debug_assert_eq!(k.len(), used * self.ty.bytes(l.shape.k_width), "a layer's keys are its used rows");
            out.extend_from_slice(&k);
            out.extend_from_slice(&v);
        }
        // A hybrid's recurrent states follow (none: the format of a cache without them).
        self.check_states_here();
        for st in &self.states {
            out.extend_from_slice(&(st.len() as u64).to_le_bytes());
            st.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        }
        Ok(out)
    }

    /// Restores a state written by [`save_state`](Self::save_state) of a cache of the same shape.
    pub fn restore_state(&mut self, state: &[u8]) -> Result<(), KvError> {
        let saved = self.read_state(state)?;
        for (l, (k, v)) in self.layers.iter_mut().zip(&saved.rows) {
            // Rows past those saved hold no position the restored length reads.
            let used = saved_rows(self.ty, l.shape, k.len());
            l.k.ensure(used * l.shape.k_width);
            l.v.ensure(used * l.shape.v_width);
            l.k.bytes_mut()[..k.len()].copy_from_slice(k);
            l.v.bytes_mut()[..v.len()].copy_from_slice(v);
        }
        self.take_positions(saved);
        Ok(())
    }

    /// [`restore_state`](Self::restore_state) for a cache whose rows are
    /// [held elsewhere](Self::held_elsewhere): once the whole state is
    /// checked, `place(layer, keys, values)` writes each layer's first rows
    /// where they are held. A failure there leaves the cache holding nothing.
    pub fn restore_state_with(
        &mut self,
        state: &[u8],
        mut place: impl FnMut(usize, &[u8], &[u8]) -> Result<(), String>,
    ) -> Result<(), KvError> {
        let saved = self.read_state(state)?;
        for (il, (k, v)) in saved.rows.iter().enumerate() {
            if let Err(why) = place(il, k, v) {
                self.clear();
                return Err(KvError::Placement(why));
            }
        }
        self.take_positions(saved);
        Ok(())
    }

    /// Checks a saved state against this cache's shape, every layer before
    /// any is written, so a bad state leaves the cache as it was.
    fn read_state<'b>(&self, state: &'b [u8]) -> Result<SavedState<'b>, KvError> {
        let mut r = StateReader { buf: state, pos: 0 };
        // The first format saved every row of every layer.
        let every_row = match r.take(4)? {
            m if m == STATE_MAGIC => false,
            b"EMKV" => true,
            _ => return Err(KvError::BadState("not a cache state".into())),
        };
        let head = [r.u()?, r.u()?, r.u()?, r.u()?];
        let len = r.u()?;
        if head != [self.ty.code(), self.n_ctx, self.max_batch, self.layers.len()] || len > self.n_ctx {
            return Err(KvError::BadState("element type, context or layer count differ".into()));
        }
        let mut rows = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            let dims = [r.u()?, r.u()?, r.u()?, r.u()?];
            if dims != [l.shape.k_width, l.shape.v_width, l.shape.window.unwrap_or(0), l.rows] {
                return Err(KvError::BadState("layer shapes differ".into()));
            }
            let used = if every_row { l.rows } else { r.u()? };
            if used != len.min(l.rows) && !every_row {
                return Err(KvError::BadState("a layer's rows disagree with the positions held".into()));
            }
            let k = r.take(used * self.ty.bytes(l.shape.k_width))?;
            let v = r.take(used * self.ty.bytes(l.shape.v_width))?;
            rows.push((k, v));
        }
        let mut states = Vec::with_capacity(self.states.len());
        for st in &self.states {
            if r.u()? != st.len() {
                return Err(KvError::BadState("recurrent state sizes differ".into()));
            }
            states.push(r.take(4 * st.len())?);
        }
        if r.pos != state.len() {
            return Err(KvError::BadState("trailing bytes".into()));
        }
        Ok(SavedState { len, rows, states })
    }

    /// The positions and recurrent states of a checked state, its rows written.
    fn take_positions(&mut self, saved: SavedState<'_>) {
        for (st, bytes) in self.states.iter_mut().zip(saved.states) {
            st.iter_mut().zip(bytes.chunks_exact(4)).for_each(|(v, b)| *v = f32::from_le_bytes(b.try_into().unwrap()));
        }
        self.states_stamp = next_state_stamp();
        self.states_elsewhere = false;
        self.len = saved.len;
    }
}

/// A saved state checked against a cache: the positions held, each layer's
/// rows of keys and values, and the recurrent states, as bytes.
struct SavedState<'b> {
    len: usize,
    rows: Vec<(&'b [u8], &'b [u8])>,
    states: Vec<&'b [u8]>,
}

/// A cache state of the format that saves only the rows in use.
const STATE_MAGIC: &[u8; 4] = b"EMK2";

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

/// Rows of a layer shaped `shape` that `key_bytes` of its keys make.
fn saved_rows(ty: KvType, shape: LayerShape, key_bytes: usize) -> usize {
    key_bytes / ty.bytes(shape.k_width).max(1)
}

fn rows(s: &Store) -> Rows<'_> {
    match s {
        Store::F16(v) => Rows::F16(v),
        Store::BF16(v) => Rows::BF16(v),
        Store::F32(v) => Rows::F32(v),
        Store::Q8_0(v) => Rows::Q8_0(v),
        Store::Elsewhere => panic!("this cache's rows are held elsewhere; only their owner reads them"),
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
    /// How many positions from `pos` on sit in consecutive rows (the ring
    /// wraps after them), `first <= pos < first + ring`.
    #[inline(always)]
    pub fn consecutive_from(&self, pos: usize) -> usize {
        self.ring - self.row(pos)
    }

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
        let width = c.shape(il).k_width;
        let mut row = vec![0.0; width];
        c.keys(il).widen(c.row_of(il, pos) * width, &mut row);
        row[0]
    }

    /// A recurrent state cannot be cut back: a shorter prefix is a restart
    /// from nothing (the state zeroed), the whole held length is kept as it
    /// is; the state survives a save and restore, and a cache whose states
    /// differ in size refuses it.
    #[test]
    fn recurrent_states_restart_rather_than_rewind() {
        let mut c = KvCache::new(KvType::F16, 32, 4, &shapes()).with_states(&[3, 5]);
        assert_eq!(c.memory_bytes(), KvCache::new(KvType::F16, 32, 4, &shapes()).memory_bytes() + 4 * 8);
        fill(&mut c, 6);
        c.state_mut(1).copy_from_slice(&[1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(c.max_truncation(9), 6);
        assert_eq!(c.truncate(6), 6);
        assert_eq!(c.state(1), [1.0, 2.0, 3.0, 4.0, 5.0]);
        let saved = c.save_state();
        let mut other = KvCache::new(KvType::F16, 32, 4, &shapes()).with_states(&[3, 5]);
        other.restore_state(&saved).unwrap();
        assert_eq!((other.len(), other.state(1)), (6, &[1.0, 2.0, 3.0, 4.0, 5.0][..]));
        let mut wrong = KvCache::new(KvType::F16, 32, 4, &shapes()).with_states(&[3, 6]);
        assert!(wrong.restore_state(&saved).is_err());
        assert!(KvCache::new(KvType::F16, 32, 4, &shapes()).restore_state(&saved).is_err(), "a cache without states");
        assert_eq!(c.max_truncation(5), 0);
        assert_eq!(c.truncate(5), 0);
        assert!(c.is_empty() && c.state(1).iter().all(|&v| v == 0.0));
    }

    /// States whose owner carried them forward (a device's pass) are stamped
    /// anew and are not read until taken back, which keeps that stamp; an
    /// edit on the host (states set, a restore, a clear) makes the host's the
    /// ones that count again.
    #[test]
    fn states_held_elsewhere_are_read_only_once_taken_back() {
        use std::panic::{catch_unwind, AssertUnwindSafe};
        let mut c = KvCache::new(KvType::F16, 32, 4, &shapes()).with_states(&[3, 5]);
        let before = c.states_stamp();
        let held = c.states_moved_elsewhere();
        assert!(c.states_elsewhere() && held != before && held == c.states_stamp());
        let reads: [(&str, &dyn Fn(&KvCache)); 3] = [
            ("a state", &|c| {
                let _ = c.state(0);
            }),
            ("every state", &|c| c.copy_states_into(&mut Vec::new())),
            ("a save", &|c| {
                let _ = c.save_state();
            }),
        ];
        for (what, read) in reads {
            assert!(catch_unwind(AssertUnwindSafe(|| read(&c))).is_err(), "{what} read while held elsewhere");
        }
        let mut edited = c.clone();
        assert!(catch_unwind(AssertUnwindSafe(|| edited.state_mut(0)[0] = 1.0)).is_err(), "an edit of stale states");
        let theirs: Vec<f32> = (0..8).map(|i| i as f32).collect();
        c.states_back(&theirs);
        assert!(!c.states_elsewhere() && c.states_stamp() == held, "taken back, under the stamp they were held with");
        assert_eq!((c.state(0), c.state(1)), (&theirs[..3], &theirs[3..]));
        let saved = c.save_state();
        let edits: [(&str, &dyn Fn(&mut KvCache)); 3] = [
            ("states set", &|c| c.set_states(&[0.0; 8])),
            ("a restore", &|c| c.restore_state(&saved).unwrap()),
            ("a clear", &|c| c.clear()),
        ];
        for (what, edit) in edits {
            let mut away = c.clone();
            away.states_moved_elsewhere();
            edit(&mut away);
            assert!(!away.states_elsewhere(), "{what} leaves the host's states the ones that count");
            away.copy_states_into(&mut Vec::new());
        }
    }

    /// Every edit of the recurrent states stamps them anew, a stamp no other
    /// cache has; a copy keeps its original's until either is edited. Reads
    /// and the keys' own changes leave it.
    #[test]
    fn every_edit_of_the_states_stamps_them_anew_and_a_copy_keeps_the_stamp() {
        let mut c = KvCache::new(KvType::F16, 32, 4, &shapes()).with_states(&[3, 5]);
        let other = KvCache::new(KvType::F16, 32, 4, &shapes()).with_states(&[3, 5]);
        assert_ne!(c.states_stamp(), other.states_stamp(), "two caches of zeros, stamped apart");
        let mut seen = vec![other.states_stamp(), c.states_stamp()];
        let mut stamped = |c: &KvCache, what: &str| {
            assert!(!seen.contains(&c.states_stamp()), "{what} left the stamp or reused one");
            seen.push(c.states_stamp());
        };
        c.state_mut(0)[1] = 2.0;
        stamped(&c, "a pass's edit");
        c.set_states(&[0.5; 8]);
        stamped(&c, "states set whole");
        let saved = c.save_state();
        let copy = c.clone();
        assert_eq!(copy.states_stamp(), c.states_stamp(), "a copy holds the same states");
        let (read, _) = (c.state(1).to_vec(), c.save_state());
        assert_eq!((read.len(), c.states_stamp()), (5, copy.states_stamp()), "reads leave the stamp");
        fill(&mut c, 3);
        assert_eq!(c.states_stamp(), copy.states_stamp(), "keys and values leave the stamp");
        c.restore_state(&saved).unwrap();
        stamped(&c, "a restore");
        c.clear();
        stamped(&c, "a clear");
        assert_eq!(copy.states_stamp(), seen[3], "the copy keeps the stamp it was made with");
    }

    /// A saved state holds the rows in use, not the capacity: a few tokens
    /// save a few tokens' keys and values; a ring that wrapped saves all its
    /// rows; either restores to the same reads.
    #[test]
    fn a_saved_state_is_sized_by_the_positions_held() {
        let (few, many) = (3, 70);
        let mut small = KvCache::new(KvType::F16, 256, 4, &shapes());
        fill(&mut small, few);
        let mut big = KvCache::new(KvType::F16, 256, 4, &shapes());
        fill(&mut big, many);
        let (s, b) = (small.save_state().len(), big.save_state().len());
        let per_row: usize = shapes().iter().map(|l| 2 * (l.k_width + l.v_width)).sum();
        assert!(s < 256 + few * per_row && b > s, "{s} bytes for {few} positions, {b} for {many}");
        for (c, n) in [(&small, few), (&big, many)] {
            let mut back = KvCache::new(KvType::F16, 256, 4, &shapes());
            fill(&mut back, 200); // stale rows past the restored length are never read
            back.restore_state(&c.save_state()).unwrap();
            assert_eq!(back.len(), n);
            for il in 0..shapes().len() {
                for pos in back.len().saturating_sub(back.layers[il].rows)..n {
                    assert_eq!(key_at(&back, il, pos), pos as f32, "layer {il} pos {pos}");
                }
            }
        }
        let mut cut = small.save_state();
        cut.truncate(cut.len() - 1);
        assert!(KvCache::new(KvType::F16, 256, 4, &shapes()).restore_state(&cut).is_err());
    }

    /// A cache whose rows are held elsewhere saves, from the rows its owner
    /// gives, the state a cache holding them itself saves, restores it
    /// through its owner by layer, and answers room and truncation alike.
    #[test]
    fn rows_held_elsewhere_save_and_restore_through_their_owner() {
        let mut here = KvCache::new(KvType::F16, 64, 4, &shapes());
        fill(&mut here, 37);
        let mut away = KvCache::held_elsewhere(KvType::F16, 64, 4, &shapes());
        assert!(away.rows_elsewhere() && !here.rows_elsewhere());
        assert_eq!(away.memory_bytes(), here.memory_bytes());
        let owner = |il: usize, used: usize| {
            let (kb, vb) = (2 * here.layers[il].shape.k_width, 2 * here.layers[il].shape.v_width);
            Ok::<_, ()>((Cow::Owned(here.keys(il).bytes()[..used * kb].to_vec()), Cow::Owned(here.values(il).bytes()[..used * vb].to_vec())))
        };
        // Positions only: the owner gives no rows for an empty cache.
        assert_eq!(away.save_state_with(owner).unwrap(), KvCache::new(KvType::F16, 64, 4, &shapes()).save_state());
        let state = here.save_state();
        let mut placed = Vec::new();
        away.restore_state_with(&state, |il, k, v| {
            placed.push((il, k.len(), v.len()));
            Ok(())
        })
        .unwrap();
        assert_eq!(away.len(), 37);
        assert_eq!(placed.len(), shapes().len());
        assert_eq!(away.save_state_with(owner).unwrap(), state);
        assert_eq!(away.max_truncation(30), here.max_truncation(30));
        assert_eq!(away.reserve(4), here.reserve(4));
        // A failure where the rows are held leaves nothing held.
        let err = away.restore_state_with(&state, |il, _, _| if il == 1 { Err("out of memory".into()) } else { Ok(()) });
        assert_eq!(err, Err(KvError::Placement("out of memory".into())));
        assert_eq!(away.len(), 0);
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
                    // The run of consecutive rows from pos ends where the ring wraps.
                    let run = rows.consecutive_from(pos);
                    assert!(run >= 1 && rows.row(pos) + run == ring, "layer {il} first {first} pos {pos}");
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

    /// A Q8_0 cache stores each row as llama.cpp's Q8_0 quantizer writes it
    /// (read back as the quant crate dequantizes those bytes), within half a
    /// step of the original; it is about half an f16 cache, and its saved
    /// state restores into a Q8_0 cache only.
    #[test]
    fn q8_0_rows_are_llama_cpp_blocks() {
        let shapes = [LayerShape { k_width: 64, v_width: 32, window: Some(3) }, LayerShape { k_width: 96, v_width: 64, window: None }];
        let mut c = KvCache::new(KvType::Q8_0, 16, 4, &shapes);
        let f16 = KvCache::new(KvType::F16, 16, 4, &shapes);
        assert_eq!(c.memory_bytes() * 64, f16.memory_bytes() * 34);
        let value = |p: usize, i: usize, salt: usize| ((p * 131 + i * 37 + salt * 17) % 97) as f32 * 0.173 - 8.0;
        c.reserve(4).unwrap();
        for p in 0..4 {
            for (il, s) in shapes.iter().enumerate() {
                let k: Vec<f32> = (0..s.k_width).map(|i| value(p, i, il)).collect();
                let v: Vec<f32> = (0..s.v_width).map(|i| value(p, i, il + 5)).collect();
                c.write(il, p, &k, &v);
            }
        }
        c.commit(4);
        for (il, s) in shapes.iter().enumerate() {
            for p in 1..4 {
                let want: Vec<f32> = (0..s.k_width).map(|i| value(p, i, il)).collect();
                let mut bytes = vec![0u8; s.k_width / 32 * 34];
                ember_quant::quantize_row_q8_0(&want, &mut bytes).unwrap();
                let mut exact = vec![0.0; s.k_width];
                ember_quant::dequantize_row(ember_gguf::GgmlType::Q8_0, &bytes, &mut exact).unwrap();
                let mut got = vec![0.0; s.k_width];
                c.keys(il).widen(c.row_of(il, p) * s.k_width, &mut got);
                assert_eq!(got, exact, "layer {il} position {p}");
                for (block, g) in want.chunks(32).zip(got.chunks(32)) {
                    let step = block.iter().fold(0.0f32, |m, x| m.max(x.abs())) / 127.0;
                    assert!(block.iter().zip(g).all(|(a, b)| (a - b).abs() <= 0.5 * step * 1.01), "within half a step");
                }
            }
        }
        let state = c.save_state();
        let mut d = KvCache::new(KvType::Q8_0, 16, 4, &shapes);
        d.restore_state(&state).unwrap();
        assert_eq!(d.save_state(), state);
        assert!(KvCache::new(KvType::F16, 16, 4, &shapes).restore_state(&state).is_err());
        assert!(KvType::Q8_0.holds_heads_of(64) && !KvType::Q8_0.holds_heads_of(48) && KvType::F16.holds_heads_of(48));
    }

    /// A bf16 cache rounds each element to nearest even, keeps f32's range
    /// (where f16 would overflow), makes what would be a subnormal bf16 a
    /// zero of its sign, is as large as an f16 cache, and its saved state
    /// restores into a bf16 cache only (not an f16 one of the same size).
    #[test]
    fn bf16_rows_round_to_nearest_even() {
        assert_eq!(KvType::parse("bf16"), Some(KvType::BF16));
        assert_eq!(to_bf16(1.0 + 1.0 / 256.0).to_bits(), 0x3f80, "a tie goes to the even neighbour");
        assert_eq!(to_bf16(1.0 + 3.0 / 256.0).to_bits(), 0x3f82, "a tie goes to the even neighbour");
        assert_eq!(to_bf16(1.0e30).to_f32(), bf16::from_f32(1.0e30).to_f32(), "f32's range");
        assert_eq!(to_bf16(1.0e-39).to_bits(), 0, "a subnormal is a zero");
        assert_eq!(to_bf16(-1.0e-39).to_bits(), 0x8000, "of its sign");
        let mut c = KvCache::new(KvType::BF16, 16, 4, &shapes());
        assert_eq!(c.memory_bytes(), KvCache::new(KvType::F16, 16, 4, &shapes()).memory_bytes());
        c.reserve(3).unwrap();
        let (k, v): (Vec<f32>, Vec<f32>) = ((0..8).map(|i| 1.0e6 * i as f32 + 0.3).collect(), (0..8).map(|i| -0.1 * i as f32).collect());
        for il in 0..shapes().len() {
            c.write(il, 0, &k[..shapes()[il].k_width], &v[..shapes()[il].v_width]);
        }
        c.commit(1);
        let mut got = vec![0.0; shapes()[1].k_width];
        c.keys(1).widen(c.row_of(1, 0) * shapes()[1].k_width, &mut got);
        assert!(got.iter().zip(&k).all(|(&g, &x)| g == bf16::from_f32(x).to_f32()));
        let state = c.save_state();
        let mut d = KvCache::new(KvType::BF16, 16, 4, &shapes());
        d.restore_state(&state).unwrap();
        assert_eq!(d.save_state(), state);
        assert!(KvCache::new(KvType::F16, 16, 4, &shapes()).restore_state(&state).is_err());
    }
}
