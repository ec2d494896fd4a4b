//! Gated DeltaNet, the linear-attention layers of Qwen3.5's hybrids: a
//! short causal convolution over the projected queries, keys and values,
//! then the gated delta rule over a recurrent state per value head.
//!
//! The arithmetic is llama.cpp's (`ggml_ssm_conv` and its fused
//! `gated_delta_net` kernel). Value head `h` reads query and key head
//! `h % n_k_heads` (the converter tiles the value heads that way). Its state
//! `M` (`head_dim` x `head_dim`, row `j` per value element, column `i` per
//! key element) takes each token as
//!
//! ```text
//! M = exp(gate) M
//! w = beta (v - M k)
//! M = M + w kᵀ
//! o = M q / sqrt(head_dim)
//! ```
//!
//! with `q` and `k` L2-normalised. A decoded token takes that step; a prompt
//! is read in chunks ([`DeltaNet::chunk`]): within a chunk the `w` of every
//! token solve one triangular system, so the state is read once and written
//! once per chunk instead of once per token. Both give the same numbers up
//! to f32 rounding; the tests hold them together.

/// The shape of one layer's recurrent part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNet {
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    /// Elements of a key head and of a value head (llama.cpp's `ssm.state_size`).
    pub head_dim: usize,
}

impl DeltaNet {
    /// Floats of one sequence's state.
    pub fn state_len(&self) -> usize {
        self.n_v_heads * self.head_dim * self.head_dim
    }

    fn k_head(&self, h: usize) -> usize {
        h % self.n_k_heads
    }

    /// One token: `q`, `k` (`n_k_heads * head_dim`, normalised), `v`
    /// (`n_v_heads * head_dim`), per value head its log decay `gate` (<= 0)
    /// and `beta`; `out` gets `n_v_heads * head_dim`.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &self,
        state: &mut [f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        gate: &[f32],
        beta: &[f32],
        out: &mut [f32],
    ) {
        let d = self.head_dim;
        for (h, (m, o)) in state.chunks_mut(d * d).zip(out.chunks_mut(d)).enumerate() {
            self.step_head(h, m, q, k, &v[h * d..(h + 1) * d], gate[h], beta[h], o);
        }
    }

    /// [`step`](Self::step) for value head `h` alone: its state `m`
    /// (`head_dim`²), its value `v` and output `out` (`head_dim`); `q` and
    /// `k` hold every key head.
    #[allow(clippy::too_many_arguments)]
    pub fn step_head(
        &self,
        h: usize,
        m: &mut [f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        gate: f32,
        beta: f32,
        out: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        return flushing_subnormals(|| {
            if wide() {
                // SAFETY: the CPU has AVX2 and FMA.
                unsafe { self.step_head_avx2(h, m, q, k, v, gate, beta, out) }
            } else {
                self.step_head_any(h, m, q, k, v, gate, beta, out)
            }
        });
        #[cfg(not(target_arch = "x86_64"))]
        self.step_head_any(h, m, q, k, v, gate, beta, out)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn step_head_avx2(
        &self,
        h: usize,
        m: &mut [f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        gate: f32,
        beta: f32,
        out: &mut [f32],
    ) {
        self.step_head_any(h, m, q, k, v, gate, beta, out)
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn step_head_any(
        &self,
        h: usize,
        m: &mut [f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        gate: f32,
        beta: f32,
        out: &mut [f32],
    ) {
        let d = self.head_dim;
        let scale = 1.0 / (d as f32).sqrt();
        let kh = self.k_head(h);
        let (qh, kk) = (&q[kh * d..(kh + 1) * d], &k[kh * d..(kh + 1) * d]);
        let decay = gate.exp();
        for (j, row) in m.chunks_mut(d).enumerate() {
            row.iter_mut().for_each(|x| *x *= decay);
            let w = (v[j] - dot(row, kk)) * beta;
            row.iter_mut().zip(kk).for_each(|(x, b)| *x += b * w);
            out[j] = dot(row, qh) * scale;
        }
    }

    /// `t` tokens at once (rows of `step`'s inputs, `qk_stride` and
    /// `v_stride` floats apart; `gate` and `beta` rows of `n_v_heads`), the
    /// first at position `first`, in chunks that end at multiples of `chunk`:
    /// [`chunks_head`](Self::chunks_head) for every head, into rows of `out`
    /// `out_stride` apart.
    #[allow(clippy::too_many_arguments)]
    pub fn chunks(
        &self,
        state: &mut [f32],
        t: usize,
        first: usize,
        chunk: usize,
        q: &[f32],
        k: &[f32],
        qk_stride: usize,
        v: &[f32],
        v_stride: usize,
        gate: &[f32],
        beta: &[f32],
        out: &mut [f32],
        out_stride: usize,
        scratch: &mut ChunkScratch,
    ) {
        let d = self.head_dim;
        let mut head_out = vec![0.0f32; t * d];
        for (h, m) in state.chunks_mut(d * d).enumerate() {
            let io = TokenRows { q, k, qk_stride, v, v_stride, gate, beta };
            self.chunks_head(h, m, t, first, chunk, &io, &mut head_out, scratch);
            for (s, o) in head_out.chunks(d).enumerate() {
                out[s * out_stride + h * d..s * out_stride + (h + 1) * d].copy_from_slice(o);
            }
        }
    }

    /// Value head `h`'s part of [`chunks`](Self::chunks): its state `m`, its
    /// outputs to `out` (`t` rows of `head_dim`). With `Γ_t` the chunk's
    /// decay up to token `t` (`exp` of the summed gates) and `M0` the state
    /// at its start, each token's `w_t = beta_t (v_t - Γ_t M0 k_t - Σ_{s<t}
    /// (Γ_t/Γ_s) (k_s·k_t) w_s)` (forward substitution), then `o_t = (Γ_t M0
    /// q_t + Σ_{s<=t} (Γ_t/Γ_s) (k_s·q_t) w_s) / sqrt(d)` and the state at
    /// the chunk's end `Γ_C M0 + Σ_s (Γ_C/Γ_s) w_s k_sᵀ`. The ratios are
    /// taken as `exp` of differences of summed gates, which cannot overflow.
    #[allow(clippy::too_many_arguments)]
    ///
    /// The chunks lie on a grid of absolute positions (`first` is the first
    /// token's), not on where this call starts: a read resumed from a state
    /// at a grid position does the same arithmetic as one read from zero.
    pub fn chunks_head(
        &self,
        h: usize,
        m: &mut [f32],
        t: usize,
        first: usize,
        chunk: usize,
        io: &TokenRows<'_>,
        out: &mut [f32],
        sc: &mut ChunkScratch,
    ) {
        assert!(chunk > 0);
        #[cfg(target_arch = "x86_64")]
        return flushing_subnormals(|| {
            if wide() {
                // SAFETY: the CPU has AVX2 and FMA.
                unsafe { self.chunks_head_avx2(h, m, t, first, chunk, io, out, sc) }
            } else {
                self.chunks_head_any(h, m, t, first, chunk, io, out, sc)
            }
        });
        #[cfg(not(target_arch = "x86_64"))]
        self.chunks_head_any(h, m, t, first, chunk, io, out, sc)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn chunks_head_avx2(
        &self,
        h: usize,
        m: &mut [f32],
        t: usize,
        first: usize,
        chunk: usize,
        io: &TokenRows<'_>,
        out: &mut [f32],
        sc: &mut ChunkScratch,
    ) {
        self.chunks_head_any(h, m, t, first, chunk, io, out, sc)
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn chunks_head_any(
        &self,
        h: usize,
        m: &mut [f32],
        t: usize,
        first: usize,
        chunk: usize,
        io: &TokenRows<'_>,
        out: &mut [f32],
        sc: &mut ChunkScratch,
    ) {
        let mut t0 = 0;
        while t0 < t {
            let n = (chunk - (first + t0) % chunk).min(t - t0);
            self.chunk_head(h, m, t0, n, io, &mut out[t0 * self.head_dim..], sc);
            t0 += n;
        }
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn chunk_head(
        &self,
        h: usize,
        m0: &mut [f32],
        t0: usize,
        n: usize,
        io: &TokenRows<'_>,
        out: &mut [f32],
        sc: &mut ChunkScratch,
    ) {
        let (d, nv) = (self.head_dim, self.n_v_heads);
        let kh = self.k_head(h);
        let scale = 1.0 / (d as f32).sqrt();
        let key = |s: usize| &io.k[(t0 + s) * io.qk_stride + kh * d..][..d];
        let query = |s: usize| &io.q[(t0 + s) * io.qk_stride + kh * d..][..d];
        sc.cum.clear();
        let mut acc = 0.0f32;
        for s in 0..n {
            acc += io.gate[(t0 + s) * nv + h];
            sc.cum.push(acc);
        }
        // w, row by row: the state's part first, then the earlier tokens'.
        sc.w.resize(n * d, 0.0);
        for s in 0..n {
            let (ks, g) = (key(s), sc.cum[s].exp());
            let b = io.beta[(t0 + s) * nv + h];
            let v = &io.v[(t0 + s) * io.v_stride + h * d..][..d];
            for (j, row) in m0.chunks(d).enumerate() {
                sc.w[s * d + j] = v[j] - g * dot(row, ks);
            }
            let (done, rest) = sc.w.split_at_mut(s * d);
            let ws = &mut rest[..d];
            for r in 0..s {
                let c = (sc.cum[s] - sc.cum[r]).exp() * dot(key(r), ks);
                ws.iter_mut().zip(&done[r * d..(r + 1) * d]).for_each(|(x, y)| *x -= c * y);
            }
            ws.iter_mut().for_each(|x| *x *= b);
        }
        // Outputs, from the state at the chunk's start and the chunk's w.
        for s in 0..n {
            let (qs, g) = (query(s), sc.cum[s].exp());
            let o = &mut out[s * d..(s + 1) * d];
            for (x, row) in o.iter_mut().zip(m0.chunks(d)) {
                *x = g * dot(row, qs);
            }
            for r in 0..=s {
                let c = (sc.cum[s] - sc.cum[r]).exp() * dot(key(r), qs);
                o.iter_mut().zip(&sc.w[r * d..(r + 1) * d]).for_each(|(x, y)| *x += c * y);
            }
            o.iter_mut().for_each(|x| *x *= scale);
        }
        // The state at the chunk's end.
        let last = sc.cum[n - 1];
        let g = last.exp();
        m0.iter_mut().for_each(|x| *x *= g);
        for r in 0..n {
            let c = (last - sc.cum[r]).exp();
            let kr = key(r);
            for (j, row) in m0.chunks_mut(d).enumerate() {
                let wj = c * sc.w[r * d + j];
                row.iter_mut().zip(kr).for_each(|(x, y)| *x += wj * y);
            }
        }
    }
}

/// A run of tokens' inputs to the rule: rows of queries and keys
/// `qk_stride` floats apart (every key head), of values `v_stride` apart
/// (every value head), and per token a row of `n_v_heads` gates and betas.
pub struct TokenRows<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub qk_stride: usize,
    pub v: &'a [f32],
    pub v_stride: usize,
    pub gate: &'a [f32],
    pub beta: &'a [f32],
}

impl<'a> TokenRows<'a> {
    /// The rows from token `rows` on (`n_v_heads` gates and betas a token).
    pub fn skip(&self, rows: usize, n_v_heads: usize) -> TokenRows<'a> {
        TokenRows {
            q: &self.q[rows * self.qk_stride..],
            k: &self.k[rows * self.qk_stride..],
            qk_stride: self.qk_stride,
            v: &self.v[rows * self.v_stride..],
            v_stride: self.v_stride,
            gate: &self.gate[rows * n_v_heads..],
            beta: &self.beta[rows * n_v_heads..],
        }
    }
}

/// A dot product in sixteen running sums, which the compiler keeps in
/// vector registers (one sum would be a chain of dependent scalar adds).
/// Every lane adds in the same order at any vector width, so the AVX2 build
/// of the rule and the plain one give the same bits.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    let mut acc = [0.0f32; 16];
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Runs `f` with subnormal floats read and written as zero (x86's DAZ and
/// FTZ), the caller's mode restored after. A strongly decaying head drives
/// its state into the subnormal range, where each operation costs this
/// core a hundred cycles or more: a random-weight Qwen3.5-0.8B read its
/// prompts at 49 t/s with them and 174 without. What is lost is below
/// 1.2e-38 of a state whose outputs are of order one.
#[cfg(target_arch = "x86_64")]
fn flushing_subnormals<R>(f: impl FnOnce() -> R) -> R {
    #[allow(deprecated)]
    use std::arch::x86_64::{_mm_getcsr, _mm_setcsr};
    // SAFETY: MXCSR's DAZ (bit 6) and FTZ (bit 15) change only how subnormals round.
    #[allow(deprecated)]
    let saved = unsafe { _mm_getcsr() };
    #[allow(deprecated)]
    unsafe {
        _mm_setcsr(saved | 0x8040)
    };
    let r = f();
    #[allow(deprecated)]
    unsafe {
        _mm_setcsr(saved)
    };
    r
}

/// Whether the rule runs in its AVX2 build: the level ember runs at has it
/// (see `ember_quant::level`).
#[cfg(target_arch = "x86_64")]
fn wide() -> bool {
    ember_quant::level() >= ember_quant::SimdLevel::Avx2
}

/// Working memory of [`DeltaNet::chunks`], reused across calls.
#[derive(Default)]
pub struct ChunkScratch {
    cum: Vec<f32>,
    w: Vec<f32>,
}

/// The short causal convolution, per channel over the last `d_conv` inputs
/// (the current one last), then SiLU: `t` rows of `channels` in `x`, `out`
/// likewise. `w` is the file's `[channels][d_conv]`; `state` holds the
/// `d_conv - 1` inputs before `x`, oldest first (`[d_conv - 1][channels]`),
/// and is left holding the last `d_conv - 1` inputs.
pub fn conv_silu(w: &[f32], d_conv: usize, channels: usize, state: &mut [f32], x: &[f32], t: usize, out: &mut [f32]) {
    let keep = d_conv - 1;
    debug_assert_eq!(state.len(), keep * channels);
    // Input `i` of the window ending at row `r`: the state's rows, then x's.
    let input = |state: &[f32], r: usize, i: usize, c: usize| {
        let at = r + i;
        if at < keep {
            state[at * channels + c]
        } else {
            x[(at - keep) * channels + c]
        }
    };
    for r in 0..t {
        for c in 0..channels {
            let taps = &w[c * d_conv..(c + 1) * d_conv];
            let s: f32 = (0..d_conv).map(|i| input(state, r, i, c) * taps[i]).sum();
            out[r * channels + c] = s / (1.0 + (-s).exp());
        }
    }
    let mut next = vec![0.0f32; keep * channels];
    conv_state_after(state, x, channels, t, &mut next);
    state.copy_from_slice(&next);
}

/// The convolution's state after the first `t` rows of `x` were fed to
/// `state`: the last `d_conv - 1` rows of (state, x), into `out`.
pub fn conv_state_after(state: &[f32], x: &[f32], channels: usize, t: usize, out: &mut [f32]) {
    let keep = state.len() / channels;
    for (i, row) in out.chunks_mut(channels).enumerate() {
        let at = t + i;
        row.copy_from_slice(if at < keep {
            &state[at * channels..(at + 1) * channels]
        } else {
            &x[(at - keep) * channels..(at - keep + 1) * channels]
        });
    }
}

/// `x / sqrt(Σx² + eps)`: llama.cpp's L2 norm of the queries and keys
/// (`rms_norm(x, eps / n) / sqrt(n)`).
pub fn l2_norm(x: &mut [f32], eps: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let inv = 1.0 / (ss + eps).sqrt();
    x.iter_mut().for_each(|v| *v *= inv);
}

/// `ln(1 + e^x)`, as ggml computes it (the identity above 20).
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f32 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
        fn vec(&mut self, n: usize) -> Vec<f32> {
            (0..n).map(|_| self.next()).collect()
        }
    }

    /// The recurrence in f64, straight from its definition (state as `S[i][j]`,
    /// key index first, as llama.cpp's graph writes it).
    #[allow(clippy::too_many_arguments)]
    fn reference(
        dn: &DeltaNet,
        state: &mut [f64],
        t: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        gate: &[f32],
        beta: &[f32],
    ) -> Vec<f64> {
        let (d, nk, nv) = (dn.head_dim, dn.n_k_heads, dn.n_v_heads);
        let mut out = vec![0.0; t * nv * d];
        for s in 0..t {
            for h in 0..nv {
                let kh = h % nk;
                let kk: Vec<f64> = (0..d).map(|i| k[s * nk * d + kh * d + i] as f64).collect();
                let qq: Vec<f64> = (0..d).map(|i| q[s * nk * d + kh * d + i] as f64).collect();
                let st = &mut state[h * d * d..(h + 1) * d * d];
                let g = (gate[s * nv + h] as f64).exp();
                st.iter_mut().for_each(|x| *x *= g);
                for j in 0..d {
                    let sk: f64 = (0..d).map(|i| st[i * d + j] * kk[i]).sum();
                    let delta = (v[s * nv * d + h * d + j] as f64 - sk) * beta[s * nv + h] as f64;
                    for i in 0..d {
                        st[i * d + j] += kk[i] * delta;
                    }
                }
                for j in 0..d {
                    out[s * nv * d + h * d + j] =
                        (0..d).map(|i| st[i * d + j] * qq[i]).sum::<f64>() / (d as f64).sqrt();
                }
            }
        }
        out
    }

    struct Case {
        dn: DeltaNet,
        t: usize,
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        gate: Vec<f32>,
        beta: Vec<f32>,
        state: Vec<f32>,
    }

    fn case(seed: u64, t: usize) -> Case {
        let dn = DeltaNet { n_k_heads: 2, n_v_heads: 4, head_dim: 16 };
        let mut rng = Rng(seed);
        let qk = dn.n_k_heads * dn.head_dim;
        let mut q = rng.vec(t * qk);
        let mut k = rng.vec(t * qk);
        for x in q.chunks_mut(dn.head_dim).chain(k.chunks_mut(dn.head_dim)) {
            l2_norm(x, 1e-6);
        }
        let v = rng.vec(t * dn.n_v_heads * dn.head_dim);
        // Decays from strong to almost none, as softplus(..) * -exp(A_log) gives.
        let gate = (0..t * dn.n_v_heads).map(|_| -softplus(rng.next() * 3.0) * 0.8).collect();
        let beta = (0..t * dn.n_v_heads).map(|_| 0.5 + 0.5 * rng.next()).collect();
        let state = rng.vec(dn.state_len()).iter().map(|x| x * 0.3).collect();
        Case { dn, t, q, k, v, gate, beta, state }
    }

    fn worst(a: &[f32], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(x, y)| (*x as f64 - y).abs()).fold(0.0, f64::max)
    }

    /// Transposes `[h][j][i]` (ember's) to `[h][i][j]` (the reference's).
    fn to_reference(dn: &DeltaNet, m: &[f32]) -> Vec<f64> {
        let d = dn.head_dim;
        let mut r = vec![0.0; m.len()];
        for h in 0..dn.n_v_heads {
            for j in 0..d {
                for i in 0..d {
                    r[h * d * d + i * d + j] = m[h * d * d + j * d + i] as f64;
                }
            }
        }
        r
    }

    #[test]
    fn steps_follow_the_recurrence() {
        let c = case(7, 23);
        let (dn, d) = (c.dn, c.dn.head_dim);
        let (qk, vw) = (dn.n_k_heads * d, dn.n_v_heads * d);
        let mut state = c.state.clone();
        let mut want_state = to_reference(&dn, &c.state);
        let want = reference(&dn, &mut want_state, c.t, &c.q, &c.k, &c.v, &c.gate, &c.beta);
        let mut out = vec![0.0; c.t * vw];
        for s in 0..c.t {
            let nv = dn.n_v_heads;
            dn.step(
                &mut state,
                &c.q[s * qk..(s + 1) * qk],
                &c.k[s * qk..(s + 1) * qk],
                &c.v[s * vw..(s + 1) * vw],
                &c.gate[s * nv..(s + 1) * nv],
                &c.beta[s * nv..(s + 1) * nv],
                &mut out[s * vw..(s + 1) * vw],
            );
        }
        assert!(worst(&out, &want) < 1e-5, "outputs off by {}", worst(&out, &want));
        let got_state = to_reference(&dn, &state);
        let off = got_state.iter().zip(&want_state).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(off < 1e-5, "state off by {off}");
    }

    /// Chunks of every size, including one that leaves a short last chunk
    /// and one longer than the whole run, against the steps.
    #[test]
    fn chunks_equal_steps() {
        for (seed, t) in [(11u64, 37usize), (12, 1), (13, 64)] {
            let c = case(seed, t);
            let (dn, d) = (c.dn, c.dn.head_dim);
            let (qk, vw, nv) = (dn.n_k_heads * d, dn.n_v_heads * d, dn.n_v_heads);
            let mut step_state = c.state.clone();
            let mut want = vec![0.0; t * vw];
            for s in 0..t {
                dn.step(
                    &mut step_state,
                    &c.q[s * qk..(s + 1) * qk],
                    &c.k[s * qk..(s + 1) * qk],
                    &c.v[s * vw..(s + 1) * vw],
                    &c.gate[s * nv..(s + 1) * nv],
                    &c.beta[s * nv..(s + 1) * nv],
                    &mut want[s * vw..(s + 1) * vw],
                );
            }
            for (chunk, first) in [(1, 0), (5, 0), (5, 3), (16, 0), (16, 9), (100, 0), (100, 99)] {
                let mut state = c.state.clone();
                let mut out = vec![f32::NAN; t * vw];
                let mut sc = ChunkScratch::default();
                dn.chunks(
                    &mut state, t, first, chunk, &c.q, &c.k, qk, &c.v, vw, &c.gate, &c.beta, &mut out, vw, &mut sc,
                );
                let off_out = out.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                let off_state = state.iter().zip(&step_state).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                assert!(
                    off_out < 2e-5 && off_state < 2e-5,
                    "t={t} chunk {chunk} from {first}: outputs {off_out}, state {off_state}"
                );
            }
        }
    }

    /// A run cut at a grid position and resumed from the state it left is the
    /// same arithmetic as the run in one call, bit for bit; cut elsewhere it
    /// is only close (which is why a checkpoint off the grid restores
    /// within rounding, and one on it exactly).
    #[test]
    fn a_run_resumed_on_the_grid_is_the_same_run() {
        let (t, chunk, first) = (50usize, 16usize, 5usize);
        let c = case(21, t);
        let (dn, d) = (c.dn, c.dn.head_dim);
        let (qk, vw) = (dn.n_k_heads * d, dn.n_v_heads * d);
        let run = |cut: usize| {
            let mut state = c.state.clone();
            let mut out = vec![f32::NAN; t * vw];
            let mut sc = ChunkScratch::default();
            for (a, b) in [(0, cut), (cut, t)] {
                let (q, k, v) = (&c.q[a * qk..], &c.k[a * qk..], &c.v[a * vw..]);
                let (g, be) = (&c.gate[a * dn.n_v_heads..], &c.beta[a * dn.n_v_heads..]);
                let o = &mut out[a * vw..b * vw];
                dn.chunks(&mut state, b - a, first + a, chunk, q, k, qk, v, vw, g, be, o, vw, &mut sc);
            }
            (out, state)
        };
        let whole = run(t);
        // Position first + 27 = 32 is on the grid.
        assert_eq!(run(27), whole);
        let off_grid = run(20);
        assert_ne!(off_grid, whole, "a cut off the grid was expected to change the rounding");
        let off = off_grid.0.iter().zip(&whole.0).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(off < 2e-5, "a cut off the grid moved an output by {off}");
    }

    /// The convolution fed in pieces equals it over the whole run from a zero
    /// state, and the state is the last inputs.
    #[test]
    fn convolution_continues_across_calls() {
        let (d_conv, ch, t) = (4, 6, 11);
        let mut rng = Rng(5);
        let w = rng.vec(ch * d_conv);
        let x = rng.vec(t * ch);
        let direct: Vec<f32> = (0..t * ch)
            .map(|at| {
                let (r, c) = (at / ch, at % ch);
                let s: f32 = (0..d_conv)
                    .map(|i| {
                        let src = r as isize + i as isize - (d_conv as isize - 1);
                        if src < 0 {
                            0.0
                        } else {
                            x[src as usize * ch + c] * w[c * d_conv + i]
                        }
                    })
                    .sum();
                s / (1.0 + (-s).exp())
            })
            .collect();
        for split in [0, 1, 2, 5, 11] {
            let mut state = vec![0.0; (d_conv - 1) * ch];
            let mut out = vec![0.0; t * ch];
            let (a, b) = out.split_at_mut(split * ch);
            conv_silu(&w, d_conv, ch, &mut state, &x[..split * ch], split, a);
            conv_silu(&w, d_conv, ch, &mut state, &x[split * ch..], t - split, b);
            assert_eq!(out, direct, "split at {split}");
            assert_eq!(state, x[(t - (d_conv - 1)) * ch..], "state after split {split}");
        }
    }
}
