//! Tile kernels over row groups (see `crate::packed`): each weight block
//! of a group is unpacked once and met by every column of the tile, and the
//! group's eight dot products are built in the eight lanes of one register.
//!
//! Per four elements and column: one broadcast load of the activation bytes
//! and one unsigned-by-signed byte product against all eight rows, in one of
//! two forms ([`Isa`]). AVX2's `maddubs` gives 16-bit pair sums: 4- and 5-bit
//! blocks keep them (they cannot overflow: 8 x 2 x 15 x 127 and 4 x 2 x 31 x
//! 127 are below 32,768) and widen them once per block (4-bit) or per
//! half-block (5-bit); 8-bit blocks widen each `maddubs` since two would
//! overflow. AVX-512 VNNI's `dpbusd` sums the products straight into 32 bits,
//! one instruction where AVX2 takes two or three (at 256 bits: the layout of
//! eight rows a register stays, and the EVEX forms bring sixteen more
//! registers and broadcasts folded into the multiply). Both give the same
//! integers, so one scalar twin serves both. Then one conversion and one FMA
//! per block and column scale all eight rows.
//!
//! Every kernel also runs over the unpacked layout (`X = true`, see
//! `crate::packed`): the same arithmetic with each register of quants loaded
//! as bytes instead of built from nibbles and high bits, for passes of many
//! columns that unpack a tile once and meet it with every column group.

use std::arch::x86_64::*;

use super::avx2::available;
use crate::kernels::tile::{check_tile, TileFn, UnpackedTile};
use crate::packed::{PackedFormat, GROUP, Q4_K_QUANTS, Q6_K_QUANTS};

/// `I::CHAINS` running sums, and their join: step `i` of a block adds to sum
/// `i % I::CHAINS`.
struct Chains<I: Isa> {
    sums: [__m256i; 4],
    isa: std::marker::PhantomData<I>,
}

impl<I: Isa> Chains<I> {
    #[inline(always)]
    unsafe fn new() -> Self {
        Chains { sums: [_mm256_setzero_si256(); 4], isa: std::marker::PhantomData }
    }
    #[inline(always)]
    unsafe fn dot(&mut self, step: usize, x: __m256i, y: __m256i) {
        let s = &mut self.sums[step % I::CHAINS];
        *s = I::dot(*s, x, y);
    }
    #[inline(always)]
    unsafe fn dot_wide(&mut self, step: usize, x: __m256i, y: __m256i) {
        let s = &mut self.sums[step % I::CHAINS];
        *s = I::dot_wide(*s, x, y);
    }
    #[inline(always)]
    unsafe fn madd_add(&mut self, step: usize, t: __m256i, sc: __m256i) {
        let s = &mut self.sums[step % I::CHAINS];
        *s = I::madd_add(*s, t, sc);
    }
    /// The sums joined, as they stand (16-bit in AVX2's form).
    #[inline(always)]
    unsafe fn joined(&self) -> __m256i {
        (1..I::CHAINS).fold(self.sums[0], |a, i| I::join(a, self.sums[i]))
    }
    /// The 32-bit sums joined (after `dot_wide` or `madd_add`).
    #[inline(always)]
    unsafe fn joined32(&self) -> __m256i {
        (1..I::CHAINS).fold(self.sums[0], |a, i| _mm256_add_epi32(a, self.sums[i]))
    }
}

/// The byte products the kernels are built from (see the module's notes).
/// `dot` adds `x y` (unsigned by signed bytes, four to a 32-bit lane) to a
/// column's running `sum`, whose lanes [`Isa::widen`] gives as eight 32-bit
/// sums; in AVX2's form the sum is 16-bit, so a kernel bounds how many steps
/// it takes before widening.
pub(super) trait Isa {
    /// Independent running sums a kernel keeps per column and block. A
    /// `dpbusd` waits for the one before it on the same sum (five cycles
    /// here), so one sum per column left VNNI's unpacked Q4_K tile at 125
    /// GOP/s against AVX2's 163, whose dependent step is a one-cycle add;
    /// AVX2's sixteen registers hold one sum per column.
    const CHAINS: usize;
    unsafe fn dot(sum: __m256i, x: __m256i, y: __m256i) -> __m256i;
    /// Two running sums as one.
    unsafe fn join(a: __m256i, b: __m256i) -> __m256i;
    unsafe fn widen(sum: __m256i) -> __m256i;
    /// `acc + x y` in 32-bit lanes, for products whose 16-bit pair sums
    /// would overflow a second step (8-bit quants).
    unsafe fn dot_wide(acc: __m256i, x: __m256i, y: __m256i) -> __m256i;
    /// `acc + madd(t, s)`: pairs of 16-bit products summed into 32 bits.
    unsafe fn madd_add(acc: __m256i, t: __m256i, s: __m256i) -> __m256i;
}

struct Avx2;

impl Isa for Avx2 {
    const CHAINS: usize = 1;
    #[inline(always)]
    unsafe fn join(a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi16(a, b)
    }
    #[inline(always)]
    unsafe fn dot(sum: __m256i, x: __m256i, y: __m256i) -> __m256i {
        _mm256_add_epi16(sum, _mm256_maddubs_epi16(x, y))
    }
    #[inline(always)]
    unsafe fn widen(sum: __m256i) -> __m256i {
        _mm256_madd_epi16(sum, _mm256_set1_epi16(1))
    }
    #[inline(always)]
    unsafe fn dot_wide(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1)))
    }
    #[inline(always)]
    unsafe fn madd_add(acc: __m256i, t: __m256i, s: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(t, s))
    }
}

/// AVX-512 VNNI at 256 bits (with AVX-512VL).
pub(super) struct Vnni;

impl Isa for Vnni {
    const CHAINS: usize = 4;
    #[inline(always)]
    unsafe fn join(a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn dot(sum: __m256i, x: __m256i, y: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(sum, x, y)
    }
    #[inline(always)]
    unsafe fn widen(sum: __m256i) -> __m256i {
        sum
    }
    #[inline(always)]
    unsafe fn dot_wide(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, x, y)
    }
    #[inline(always)]
    unsafe fn madd_add(acc: __m256i, t: __m256i, s: __m256i) -> __m256i {
        _mm256_dpwssd_epi32(acc, t, s)
    }
}

/// Whether this CPU has the AVX-512 subsets the VNNI kernels are compiled for.
pub(crate) fn vnni_available() -> bool {
    available()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// The AVX2 tile kernel for `fmt`, when this CPU has AVX2; `vnni` asks for
/// the AVX-512 VNNI form, when it has that too.
pub(crate) fn tile_fn(fmt: PackedFormat, vnni: bool) -> Option<TileFn> {
    if vnni {
        return vnni_available().then_some(match fmt {
            PackedFormat::Q4_0 => vnni::tile_q4_0,
            PackedFormat::Q4_1 => vnni::tile_q4_1,
            PackedFormat::Q5_0 => vnni::tile_q5_0,
            PackedFormat::Q8_0 => vnni::tile_q8_0,
            PackedFormat::Q4_K => vnni::tile_q4_k,
            PackedFormat::Q6_K => vnni::tile_q6_k,
        });
    }
    available().then_some(match fmt {
        PackedFormat::Q4_0 => avx2::tile_q4_0,
        PackedFormat::Q4_1 => avx2::tile_q4_1,
        PackedFormat::Q5_0 => avx2::tile_q5_0,
        PackedFormat::Q8_0 => avx2::tile_q8_0,
        PackedFormat::Q4_K => avx2::tile_q4_k,
        PackedFormat::Q6_K => avx2::tile_q6_k,
    })
}

/// The unpacking and the tile kernel over unpacked groups, for the formats
/// whose quants are not bytes already: at the VNNI level, over pairs of
/// groups where `tile16` has the format.
pub(crate) fn unpacked_tile(fmt: PackedFormat, vnni: bool) -> Option<UnpackedTile> {
    let unpack = match fmt {
        PackedFormat::Q4_0 => unpack_q4_0,
        PackedFormat::Q4_1 => unpack_q4_1,
        PackedFormat::Q5_0 => unpack_q5_0,
        PackedFormat::Q4_K => unpack_q4_k,
        PackedFormat::Q6_K => unpack_q6_k,
        PackedFormat::Q8_0 => return None,
    };
    let tile = if vnni {
        if let Some(paired) = super::tile16::unpacked_tile(fmt) {
            return Some(paired);
        }
        if !vnni_available() {
            return None;
        }
        match fmt {
            PackedFormat::Q4_0 => vnni::tile_q4_0_x,
            PackedFormat::Q4_1 => vnni::tile_q4_1_x,
            PackedFormat::Q5_0 => vnni::tile_q5_0_x,
            PackedFormat::Q4_K => vnni::tile_q4_k_x,
            _ => vnni::tile_q6_k_x,
        }
    } else {
        if !available() {
            return None;
        }
        match fmt {
            PackedFormat::Q4_0 => avx2::tile_q4_0_x,
            PackedFormat::Q4_1 => avx2::tile_q4_1_x,
            PackedFormat::Q5_0 => avx2::tile_q5_0_x,
            PackedFormat::Q4_K => avx2::tile_q4_k_x,
            _ => avx2::tile_q6_k_x,
        }
    };
    Some(UnpackedTile { unpack, tile })
}

/// The entry points of one form: safe [`TileFn`]s that check the slices,
/// then run a kernel body compiled for `$features` over every group.
macro_rules! tile_entries {
    ($module:ident, $isa:ty, $features:literal, [$(($name:ident, $body:ident, $fmt:expr, $x:expr)),* $(,)?]) => {
        mod $module {
            use super::*;
            $(
                #[allow(clippy::too_many_arguments)]
                pub(super) fn $name(
                    k: usize,
                    w: &[u8],
                    rows: usize,
                    acts: &[u8],
                    act_stride: usize,
                    n: usize,
                    out: &mut [f32],
                    out_stride: usize,
                ) {
                    let gb = check_tile($fmt, $x, k, w, rows, acts, act_stride, n, out, out_stride);
                    #[target_feature(enable = $features)]
                    #[allow(clippy::too_many_arguments)]
                    unsafe fn groups(
                        k: usize,
                        gb: usize,
                        w: *const u8,
                        rows: usize,
                        a: *const u8,
                        act_stride: usize,
                        n: usize,
                        o: *mut f32,
                        out_stride: usize,
                    ) {
                        for g in 0..rows.div_ceil(GROUP) {
                            let (w, o, lanes) = (w.add(g * gb), o.add(g * GROUP), (rows - g * GROUP).min(GROUP));
                            match n {
                                1 => store(&$body::<$isa, 1, $x>(k / 32, w, a, act_stride), o, out_stride, lanes),
                                2 => store(&$body::<$isa, 2, $x>(k / 32, w, a, act_stride), o, out_stride, lanes),
                                3 => store(&$body::<$isa, 3, $x>(k / 32, w, a, act_stride), o, out_stride, lanes),
                                _ => store(&$body::<$isa, 4, $x>(k / 32, w, a, act_stride), o, out_stride, lanes),
                            }
                        }
                    }
                    // SAFETY: handed out only by `tile_fn` and `unpacked_tile`
                    // after the CPU was seen to have `$features`; the slices
                    // were checked to cover everything the kernel reads/writes.
                    unsafe { groups(k, gb, w.as_ptr(), rows, acts.as_ptr(), act_stride, n, out.as_mut_ptr(), out_stride) }
                }
            )*
        }
    };
}

macro_rules! both_forms {
    ($($module:ident: $isa:ty, $features:literal;)*) => {$(
        tile_entries!($module, $isa, $features, [
            (tile_q4_0, q4_0_impl, PackedFormat::Q4_0, false),
            (tile_q4_1, q4_1_impl, PackedFormat::Q4_1, false),
            (tile_q5_0, q5_0_impl, PackedFormat::Q5_0, false),
            (tile_q8_0, q8_0_impl, PackedFormat::Q8_0, false),
            (tile_q4_k, q4_k_impl, PackedFormat::Q4_K, false),
            (tile_q6_k, q6_k_impl, PackedFormat::Q6_K, false),
            (tile_q4_0_x, q4_0_impl, PackedFormat::Q4_0, true),
            (tile_q4_1_x, q4_1_impl, PackedFormat::Q4_1, true),
            (tile_q5_0_x, q5_0_impl, PackedFormat::Q5_0, true),
            (tile_q4_k_x, q4_k_impl, PackedFormat::Q4_K, true),
            (tile_q6_k_x, q6_k_impl, PackedFormat::Q6_K, true),
        ]);
    )*};
}

both_forms! {
    avx2: Avx2, "avx2,fma,f16c";
    vnni: Vnni, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni";
}

macro_rules! unpacker {
    ($name:ident, $impl:ident, $fmt:expr) => {
        fn $name(k: usize, w: &[u8], groups: usize, dst: &mut [u8]) {
            let (gb, xb) = (
                $fmt.group_bytes(k).expect("k is a whole number of blocks"),
                $fmt.unpacked_group_bytes(k).expect("an unpacked layout"),
            );
            assert!(w.len() >= groups * gb && dst.len() >= groups * xb, "unpacking {groups} groups");
            let blocks = groups * (k / $fmt.block_elems());
            // SAFETY: handed out only by `unpacked_tile` after `available()`;
            // both slices were checked to hold `groups` groups.
            unsafe { $impl(blocks, w.as_ptr(), dst.as_mut_ptr()) }
        }
    };
}

unpacker!(unpack_q4_0, unpack_q4_0_impl, PackedFormat::Q4_0);
unpacker!(unpack_q4_1, unpack_q4_1_impl, PackedFormat::Q4_1);
unpacker!(unpack_q5_0, unpack_q5_0_impl, PackedFormat::Q5_0);
unpacker!(unpack_q4_k, unpack_q4_k_impl, PackedFormat::Q4_K);
unpacker!(unpack_q6_k, unpack_q6_k_impl, PackedFormat::Q6_K);

/// Column `j`'s eight row results to `out[j * stride..]`, the first `lanes`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn store<const N: usize>(res: &[__m256; N], out: *mut f32, stride: usize, lanes: usize) {
    for (j, &v) in res.iter().enumerate() {
        if lanes == GROUP {
            _mm256_storeu_ps(out.add(j * stride), v);
        } else {
            let mut tmp = [0.0f32; GROUP];
            _mm256_storeu_ps(tmp.as_mut_ptr(), v);
            std::ptr::copy_nonoverlapping(tmp.as_ptr(), out.add(j * stride), lanes);
        }
    }
}

/// An activation column of `nb` blocks: scales, Q8_1 sums, exact sums,
/// half-block sums, quants (see `crate::packed::act_row_bytes`).
#[derive(Clone, Copy)]
pub(super) struct Col {
    pub(super) d: *const f32,
    pub(super) s: *const f32,
    pub(super) dsum: *const f32,
    pub(super) hsum: *const u8,
    pub(super) qs: *const u8,
}

#[inline(always)]
pub(super) unsafe fn cols<const N: usize>(nb: usize, a: *const u8, stride: usize) -> [Col; N] {
    std::array::from_fn(|j| {
        let base = a.add(j * stride);
        let d = base.cast::<f32>();
        Col { d, s: d.add(nb), dsum: d.add(2 * nb), hsum: base.add(12 * nb), qs: base.add(16 * nb) }
    })
}

/// Bytes ahead of the block being read that a kernel over packed weights
/// asks the memory system for. A decoded token (or one token from each of a
/// few conversations) streams every weight once, and on its own a core here
/// barely overlaps its arithmetic with the wait for memory (one thread
/// decoded at about the rate that streaming and computing one after the
/// other would give); asking 1-2 KiB ahead, a dozen blocks, took SmolLM2's
/// generation from about 67 to 84 t/s on one thread and from 110 to 125 on
/// two (4 KiB ahead measured slower), and a pass of two decoded tokens from
/// 15.4 to 10.4 ms. On a Zen 5, 4 KiB ahead took Gemma 3 270M's generation
/// (a 178 MB Q8_0 head, streamed in one run) from about 215 to 245 t/s and
/// left SmolLM2's as it was; 8 KiB slowed SmolLM2's by 5%.
const PREFETCH_AHEAD: usize = 4096;

/// Asks for the `len` bytes at `p + PREFETCH_AHEAD`, a line at a time, when
/// reading packed weights (an unpacked tile is in cache already). Past the
/// end of the weights it asks for lines nobody reads, which costs little and
/// cannot fault.
#[inline(always)]
unsafe fn prefetch_ahead<const X: bool>(p: *const u8, len: usize) {
    if !X {
        let mut off = 0;
        while off < len {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD + off).cast());
            off += 64;
        }
    }
}

/// Four activation bytes in every 32-bit lane.
#[inline(always)]
unsafe fn bcast4(p: *const u8) -> __m256i {
    _mm256_set1_epi32(p.cast::<i32>().read_unaligned())
}

/// Packed register `p` of 4-bit quants at `regs` as its two registers of
/// bytes (elements `4p..` and `16 + 4p..`), or those two read from an
/// unpacked block.
#[inline(always)]
unsafe fn q4_regs<const X: bool>(regs: *const u8, p: usize) -> (__m256i, __m256i) {
    if X {
        return (_mm256_loadu_si256(regs.add(64 * p).cast()), _mm256_loadu_si256(regs.add(64 * p + 32).cast()));
    }
    let m4 = _mm256_set1_epi8(0xF);
    let v = _mm256_loadu_si256(regs.add(32 * p).cast());
    (_mm256_and_si256(v, m4), _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4))
}

/// Unpacks `blocks` blocks of 4-bit registers: each block's `head` bytes
/// (scales) copied, then its `subs` sub-blocks of four packed registers as
/// eight registers of bytes.
#[inline(always)]
unsafe fn unpack_q4(blocks: usize, head: usize, subs: usize, src: *const u8, dst: *mut u8) {
    unpack_q4_padded(blocks, head, head, subs, src, dst)
}

/// [`unpack_q4`] with the unpacked head `out_head` bytes long (the scales
/// copied, the rest zero), so that the quants start aligned.
#[inline(always)]
unsafe fn unpack_q4_padded(blocks: usize, head: usize, out_head: usize, subs: usize, src: *const u8, dst: *mut u8) {
    let (bb, xb) = (head + subs * 128, out_head + subs * 256);
    for b in 0..blocks {
        let (s, d) = (src.add(b * bb), dst.add(b * xb));
        std::ptr::copy_nonoverlapping(s, d, head);
        std::ptr::write_bytes(d.add(head), 0, out_head - head);
        for j in 0..subs {
            for p in 0..4 {
                let (xl, xh) = q4_regs::<false>(s.add(head + 128 * j), p);
                _mm256_storeu_si256(d.add(out_head + 256 * j + 64 * p).cast(), xl);
                _mm256_storeu_si256(d.add(out_head + 256 * j + 64 * p + 32).cast(), xh);
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn unpack_q4_0_impl(blocks: usize, src: *const u8, dst: *mut u8) {
    unpack_q4_padded(blocks, 16, 32, 1, src, dst)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn unpack_q4_1_impl(blocks: usize, src: *const u8, dst: *mut u8) {
    unpack_q4(blocks, 32, 1, src, dst)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn unpack_q4_k_impl(blocks: usize, src: *const u8, dst: *mut u8) {
    unpack_q4(blocks, Q4_K_QUANTS, 8, src, dst)
}

/// One 32-element block of 4-bit quants (four nibble-pair registers at
/// `regs`, or eight byte registers where `X`) for every column: `acc +=
/// (dx d_y) Σ q q_y`, then `acc += mx sums[b]` (one accumulator per column:
/// at four columns a second would not fit in the sixteen registers).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn q4_block<I: Isa, const N: usize, const X: bool>(
    regs: *const u8,
    dx: __m256,
    mx: __m256,
    b: usize,
    c: &[Col; N],
    sums: impl Fn(&Col) -> *const f32,
    acc: &mut [__m256; N],
) {
    let mut chains: [Chains<I>; N] = std::array::from_fn(|_| Chains::new());
    for p in 0..4 {
        let (xl, xh) = q4_regs::<X>(regs, p);
        for (s, c) in chains.iter_mut().zip(c) {
            let y = c.qs.add(32 * b + 4 * p);
            s.dot(2 * p, xl, bcast4(y));
            s.dot(2 * p + 1, xh, bcast4(y.add(16)));
        }
    }
    for j in 0..N {
        let isum = _mm256_cvtepi32_ps(I::widen(chains[j].joined()));
        acc[j] = _mm256_fmadd_ps(_mm256_mul_ps(dx, _mm256_set1_ps(*c[j].d.add(b))), isum, acc[j]);
        acc[j] = _mm256_fmadd_ps(mx, _mm256_set1_ps(*sums(&c[j]).add(b)), acc[j]);
    }
}

/// Q4_0: as Q4_1, the min `-8 d` made from the scale (exact in f32) and met
/// by the activation block's exact sum.
#[inline(always)]
pub(super) unsafe fn q4_0_impl<I: Isa, const N: usize, const X: bool>(
    nb: usize,
    g: *const u8,
    a: *const u8,
    stride: usize,
) -> [__m256; N] {
    let min = |_: *const u8, dx: __m256| _mm256_mul_ps(dx, _mm256_set1_ps(-8.0));
    q4_scaled::<I, N, X>(PackedFormat::Q4_0, if X { 32 } else { 16 }, min, |c| c.dsum, nb, g, a, stride)
}

#[inline(always)]
pub(super) unsafe fn q4_1_impl<I: Isa, const N: usize, const X: bool>(
    nb: usize,
    g: *const u8,
    a: *const u8,
    stride: usize,
) -> [__m256; N] {
    let min = |blk: *const u8, _: __m256| _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16).cast()));
    q4_scaled::<I, N, X>(PackedFormat::Q4_1, 32, min, |c| c.s, nb, g, a, stride)
}

/// A 32-element block format of scale, min and nibbles (quants at byte
/// `quants` of a block): the rows' min from the block (and the scale), met
/// by the activation sum `sums` names.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn q4_scaled<I: Isa, const N: usize, const X: bool>(
    fmt: PackedFormat,
    quants: usize,
    min: impl Fn(*const u8, __m256) -> __m256,
    sums: impl Fn(&Col) -> *const f32,
    nb: usize,
    g: *const u8,
    a: *const u8,
    stride: usize,
) -> [__m256; N] {
    let bb = block_bytes::<X>(fmt);
    let c = cols::<N>(nb, a, stride);
    let mut acc = [_mm256_setzero_ps(); N];
    for b in 0..nb {
        let blk = g.add(b * bb);
        prefetch_ahead::<X>(blk, bb);
        let dx = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
        q4_block::<I, N, X>(blk.add(quants), dx, min(blk, dx), b, &c, &sums, &mut acc);
    }
    acc
}

/// Q4_K as 32-element blocks: each sub-block's scale `d sc` and min
/// `dmin m` (exact in f32) built for the eight rows, the min met by the
/// activation block's exact sum.
#[inline(always)]
pub(super) unsafe fn q4_k_impl<I: Isa, const N: usize, const X: bool>(
    nb: usize,
    g: *const u8,
    a: *const u8,
    stride: usize,
) -> [__m256; N] {
    let bb = block_bytes::<X>(PackedFormat::Q4_K);
    let sub = if X { 256 } else { 128 };
    let c = cols::<N>(nb, a, stride);
    let mut acc = [_mm256_setzero_ps(); N];
    let bytes8 = |p: *const u8| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast())));
    for sb in 0..nb / 8 {
        let blk = g.add(sb * bb);
        let d = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
        let neg_dmin = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16).cast())));
        for j in 0..8 {
            prefetch_ahead::<X>(blk.add(j * bb / 8), bb / 8);
            let dx = _mm256_mul_ps(d, bytes8(blk.add(32 + 8 * j)));
            let mx = _mm256_mul_ps(neg_dmin, bytes8(blk.add(96 + 8 * j)));
            q4_block::<I, N, X>(blk.add(Q4_K_QUANTS + sub * j), dx, mx, 8 * sb + j, &c, |c| c.dsum, &mut acc);
        }
    }
    acc
}

/// Q6_K: unsigned six-bit quants; two `maddubs` (at most 2 x 2 x 63 x 127 <
/// 32,768) per 16-bit sum, widened by `madd` against the sub-block's integer
/// scale, so a 32-element block's sum stays exact in 32 bits; the `- 32` of
/// every quant comes back as `32 Σ sc Σq_y` over the half-block sums.
#[inline(always)]
pub(super) unsafe fn q6_k_impl<I: Isa, const N: usize, const X: bool>(
    nb: usize,
    g: *const u8,
    a: *const u8,
    stride: usize,
) -> [__m256; N] {
    let bb = block_bytes::<X>(PackedFormat::Q6_K);
    let c = cols::<N>(nb, a, stride);
    let mut acc = [_mm256_setzero_ps(); N];
    for sb in 0..nb / 8 {
        let blk = g.add(sb * bb);
        let d = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
        for j in 0..8 {
            prefetch_ahead::<X>(blk.add(j * bb / 8), bb / 8);
            let b = 8 * sb + j;
            let sub = blk.add(Q6_K_QUANTS + if X { 256 } else { 192 } * j);
            let sa = _mm_loadl_epi64(blk.add(16 + 8 * (2 * j)).cast());
            let sbb = _mm_loadl_epi64(blk.add(16 + 8 * (2 * j + 1)).cast());
            // Row r's scale in 16-bit lanes 2r and 2r+1: `madd` then scales
            // and widens in one step.
            let sc_a = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sa, sa));
            let sc_b = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sbb, sbb));
            let sc_ab = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sa, sbb));
            let mut isum: [Chains<I>; N] = std::array::from_fn(|_| Chains::new());
            for pp in [0, 2] {
                let [xl0, xl1, xh0, xh1] = q6_regs::<X>(sub, pp);
                for (s, c) in isum.iter_mut().zip(&c) {
                    let y = c.qs.add(32 * b + 4 * pp);
                    let ta = _mm256_add_epi16(
                        _mm256_maddubs_epi16(xl0, bcast4(y)),
                        _mm256_maddubs_epi16(xl1, bcast4(y.add(4))),
                    );
                    let tb = _mm256_add_epi16(
                        _mm256_maddubs_epi16(xh0, bcast4(y.add(16))),
                        _mm256_maddubs_epi16(xh1, bcast4(y.add(20))),
                    );
                    s.madd_add(pp, ta, sc_a);
                    s.madd_add(pp + 1, tb, sc_b);
                }
            }
            for jj in 0..N {
                let off = _mm256_madd_epi16(sc_ab, bcast4(c[jj].hsum.add(4 * b)));
                let total = _mm256_sub_epi32(isum[jj].joined32(), _mm256_slli_epi32::<5>(off));
                acc[jj] = _mm256_fmadd_ps(
                    _mm256_mul_ps(d, _mm256_set1_ps(*c[jj].d.add(b))),
                    _mm256_cvtepi32_ps(total),
                    acc[jj],
                );
            }
        }
    }
    acc
}

/// Sub-block registers `pp, pp + 1` of Q6_K quants at `sub` as four
/// registers of bytes (low elements `pp`, `pp + 1`, then high), or those
/// four read from an unpacked sub-block.
#[inline(always)]
unsafe fn q6_regs<const X: bool>(sub: *const u8, pp: usize) -> [__m256i; 4] {
    if X {
        return std::array::from_fn(|i| _mm256_loadu_si256(sub.add(64 * pp + 32 * i).cast()));
    }
    let (m4, m30) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(0x30));
    // Bits 2p, 2p+1 of each plane byte to bits 4, 5 (within the byte: a
    // 16-bit shift of at most 4 carries nothing across into bits 4 and 5).
    let high = |plane: __m256i, p: usize| {
        _mm256_and_si256(
            match p {
                0 => _mm256_slli_epi16::<4>(plane),
                1 => _mm256_slli_epi16::<2>(plane),
                2 => plane,
                _ => _mm256_srli_epi16::<2>(plane),
            },
            m30,
        )
    };
    let (plane_a, plane_b) = (_mm256_loadu_si256(sub.add(128).cast()), _mm256_loadu_si256(sub.add(160).cast()));
    let v0 = _mm256_loadu_si256(sub.add(32 * pp).cast());
    let v1 = _mm256_loadu_si256(sub.add(32 * pp + 32).cast());
    [
        _mm256_or_si256(_mm256_and_si256(v0, m4), high(plane_a, pp)),
        _mm256_or_si256(_mm256_and_si256(v1, m4), high(plane_a, pp + 1)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(v0), m4), high(plane_b, pp)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(v1), m4), high(plane_b, pp + 1)),
    ]
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn unpack_q6_k_impl(blocks: usize, src: *const u8, dst: *mut u8) {
    let (bb, xb) = (PackedFormat::Q6_K.block_bytes(), block_bytes::<true>(PackedFormat::Q6_K));
    for b in 0..blocks {
        let (s, d) = (src.add(b * bb), dst.add(b * xb));
        std::ptr::copy_nonoverlapping(s, d, Q6_K_QUANTS);
        for j in 0..8 {
            for pp in [0, 2] {
                for (i, x) in q6_regs::<false>(s.add(Q6_K_QUANTS + 192 * j), pp).into_iter().enumerate() {
                    _mm256_storeu_si256(d.add(Q6_K_QUANTS + 256 * j + 64 * pp + 32 * i).cast(), x);
                }
            }
        }
    }
}

/// Register `p` of a Q5_0 block (nibble pairs at `blk + 48`, fifth bits
/// `h`) as its two registers of bytes, or those two read from an unpacked
/// block.
#[inline(always)]
unsafe fn q5_regs<const X: bool>(blk: *const u8, h: __m256i, p: usize) -> (__m256i, __m256i) {
    if X {
        return (_mm256_loadu_si256(blk.add(16 + 64 * p).cast()), _mm256_loadu_si256(blk.add(16 + 64 * p + 32).cast()));
    }
    let (m4, bit4) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(0x10));
    // Bit g of each byte of `h` is the fifth bit of register g's element:
    // moved to bit 4 by a shift within the byte (a 16-bit shift of at most 4
    // brings nothing from the neighbouring byte into bit 4). Shifted where
    // they are used: eight shifted copies of `h` held for the whole block
    // would not fit in the registers beside four columns' sums.
    let (hl, hh) = match p {
        0 => (_mm256_slli_epi16::<4>(h), h),
        1 => (_mm256_slli_epi16::<3>(h), _mm256_srli_epi16::<1>(h)),
        2 => (_mm256_slli_epi16::<2>(h), _mm256_srli_epi16::<2>(h)),
        _ => (_mm256_slli_epi16::<1>(h), _mm256_srli_epi16::<3>(h)),
    };
    let v = _mm256_loadu_si256(blk.add(48 + 32 * p).cast());
    let xl = _mm256_or_si256(_mm256_and_si256(v, m4), _mm256_and_si256(hl, bit4));
    let xh = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(v), m4), _mm256_and_si256(hh, bit4));
    (xl, xh)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn unpack_q5_0_impl(blocks: usize, src: *const u8, dst: *mut u8) {
    let (bb, xb) = (PackedFormat::Q5_0.block_bytes(), block_bytes::<true>(PackedFormat::Q5_0));
    for b in 0..blocks {
        let (s, d) = (src.add(b * bb), dst.add(b * xb));
        std::ptr::copy_nonoverlapping(s, d, 16);
        let h = _mm256_loadu_si256(s.add(16).cast());
        for p in 0..4 {
            let (xl, xh) = q5_regs::<false>(s, h, p);
            _mm256_storeu_si256(d.add(16 + 64 * p).cast(), xl);
            _mm256_storeu_si256(d.add(16 + 64 * p + 32).cast(), xh);
        }
    }
}

/// Bytes of a block of `fmt` as the kernel reads it: packed, or unpacked where `X`.
#[inline(always)]
pub(super) fn block_bytes<const X: bool>(fmt: PackedFormat) -> usize {
    if X {
        fmt.unpacked_block_bytes().expect("an unpacked layout")
    } else {
        fmt.block_bytes()
    }
}

#[inline(always)]
pub(super) unsafe fn q5_0_impl<I: Isa, const N: usize, const X: bool>(
    nb: usize,
    g: *const u8,
    a: *const u8,
    stride: usize,
) -> [__m256; N] {
    let bb = block_bytes::<X>(PackedFormat::Q5_0);
    let c = cols::<N>(nb, a, stride);
    let mut acc = [_mm256_setzero_ps(); N];
    for b in 0..nb {
        let blk = g.add(b * bb);
        prefetch_ahead::<X>(blk, bb);
        let h = if X { _mm256_setzero_si256() } else { _mm256_loadu_si256(blk.add(16).cast()) };
        let mut lo16: [Chains<I>; N] = std::array::from_fn(|_| Chains::new());
        let mut hi16: [Chains<I>; N] = std::array::from_fn(|_| Chains::new());
        for p in 0..4 {
            let (xl, xh) = q5_regs::<X>(blk, h, p);
            for j in 0..N {
                let y = c[j].qs.add(32 * b + 4 * p);
                lo16[j].dot(p, xl, bcast4(y));
                hi16[j].dot(p, xh, bcast4(y.add(16)));
            }
        }
        let dx = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
        for j in 0..N {
            let (d, dsum) = (c[j].d, c[j].dsum);
            let isum = _mm256_add_epi32(I::widen(lo16[j].joined()), I::widen(hi16[j].joined()));
            // The quants were stored offset by 16: take 16 d_y Σq_y back.
            let t = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(isum),
                _mm256_set1_ps(*d.add(b)),
                _mm256_set1_ps(-16.0 * *dsum.add(b)),
            );
            acc[j] = _mm256_fmadd_ps(dx, t, acc[j]);
        }
    }
    acc
}

/// Signed by signed through `maddubs`: |x| once per register, x's sign moved
/// onto each column's y (exact: no quant is -128).
#[inline(always)]
unsafe fn q8_0_impl<I: Isa, const N: usize, const X: bool>(
    nb: usize,
    g: *const u8,
    a: *const u8,
    stride: usize,
) -> [__m256; N] {
    let bb = PackedFormat::Q8_0.block_bytes();
    let c = cols::<N>(nb, a, stride);
    let mut acc = [_mm256_setzero_ps(); N];
    for b in 0..nb {
        let blk = g.add(b * bb);
        prefetch_ahead::<X>(blk, bb);
        let mut s32: [Chains<I>; N] = std::array::from_fn(|_| Chains::new());
        for r in 0..8 {
            let x = _mm256_loadu_si256(blk.add(16 + 32 * r).cast());
            let ax = _mm256_sign_epi8(x, x);
            for (s, c) in s32.iter_mut().zip(&c) {
                let y = bcast4(c.qs.add(32 * b + 4 * r));
                s.dot_wide(r, ax, _mm256_sign_epi8(y, x));
            }
        }
        let dx = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
        for j in 0..N {
            let d = c[j].d;
            acc[j] = _mm256_fmadd_ps(
                _mm256_mul_ps(dx, _mm256_set1_ps(*d.add(b))),
                _mm256_cvtepi32_ps(s32[j].joined32()),
                acc[j],
            );
        }
    }
    acc
}
