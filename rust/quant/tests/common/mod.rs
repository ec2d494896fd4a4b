//! Shared test support: a small deterministic PRNG and random weight rows
//! with the scale fields of each format set to realistic values.

#![allow(dead_code)]

use ember_gguf::GgmlType;
use half::{bf16, f16};

/// All weight types ember-quant supports.
pub const SUPPORTED: [GgmlType; 16] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];

/// splitmix64: tiny, deterministic, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    pub fn normals(&mut self, n: usize, sigma: f64) -> Vec<f32> {
        (0..n).map(|_| (self.normal() * sigma) as f32).collect()
    }
}

fn put_f16(b: &mut [u8], off: usize, v: f64) {
    b[off..off + 2].copy_from_slice(&f16::from_f64(v).to_bits().to_le_bytes());
}

/// A random row of `k` weights of type `ty`: random quant bits, realistic
/// scales (as a quantizer would produce), so dequantized values are O(0.05).
pub fn random_row(ty: GgmlType, k: usize, rng: &mut Rng) -> Vec<u8> {
    match ty {
        GgmlType::F32 => {
            return rng
                .normals(k, 0.05)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
        }
        GgmlType::F16 => {
            return rng
                .normals(k, 0.05)
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_bits().to_le_bytes())
                .collect();
        }
        GgmlType::BF16 => {
            return rng
                .normals(k, 0.05)
                .iter()
                .flat_map(|&v| bf16::from_f32(v).to_bits().to_le_bytes())
                .collect();
        }
        _ => {}
    }
    let (bs, ts) = (ty.block_size(), ty.type_size());
    assert_eq!(k % bs, 0);
    let mut row = rng.bytes(k / bs * ts);
    for b in row.chunks_exact_mut(ts) {
        // Per-weight step of the format, scaled so weights come out O(0.05).
        let d = rng.range(0.5, 1.5);
        let dmin = rng.range(0.0, 1.0);
        match ty {
            GgmlType::Q4_0 => put_f16(b, 0, d * 0.012),
            GgmlType::Q5_0 => put_f16(b, 0, d * 0.006),
            GgmlType::Q8_0 => put_f16(b, 0, d * 0.0008),
            GgmlType::IQ4_NL => put_f16(b, 0, d * 0.0008),
            GgmlType::Q4_1 => {
                put_f16(b, 0, d * 0.012);
                put_f16(b, 2, -d * 0.012 * 16.0 * dmin);
            }
            GgmlType::Q5_1 => {
                put_f16(b, 0, d * 0.006);
                put_f16(b, 2, -d * 0.006 * 32.0 * dmin);
            }
            GgmlType::Q2_K => {
                put_f16(b, 80, d * 0.004);
                put_f16(b, 82, dmin * 0.004);
            }
            GgmlType::Q3_K => put_f16(b, 108, d * 0.0008),
            GgmlType::Q4_K | GgmlType::Q5_K => {
                put_f16(b, 0, d * 0.0006);
                put_f16(b, 2, dmin * 0.0015);
            }
            GgmlType::Q6_K => put_f16(b, 208, d * 0.00005),
            GgmlType::IQ4_XS => put_f16(b, 0, d * 0.00005),
            GgmlType::Q8_K => {
                let qs: Vec<i8> = (0..256)
                    .map(|_| ((rng.next_u64() % 255) as i32 - 127) as i8)
                    .collect();
                b[..4].copy_from_slice(&((d * 0.0004) as f32).to_le_bytes());
                for (o, &q) in b[4..260].iter_mut().zip(&qs) {
                    *o = q as u8;
                }
                for (j, s) in b[260..].chunks_exact_mut(2).enumerate() {
                    let sum: i16 = qs[16 * j..16 * j + 16].iter().map(|&q| q as i16).sum();
                    s.copy_from_slice(&sum.to_le_bytes());
                }
            }
            _ => panic!("no random rows for {ty}"),
        }
    }
    row
}
