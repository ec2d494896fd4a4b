//! Kernels trust their caller for speed, but a short row must still be a
//! panic, never an out-of-bounds read (this covers the SIMD kernels too).
//! Its own test binary, because it silences the global panic hook.

mod common;

use common::{Rng, SUPPORTED};
use ember_quant::{activation_type, dot_fn, quantize_activation};

#[test]
fn kernels_panic_on_short_rows() {
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut rng = Rng::new(10);
    let mut failures = Vec::new();
    for ty in SUPPORTED {
        let act = activation_type(ty);
        let k = 512;
        let w_row = common::random_row(ty, k, &mut rng);
        let mut xq = Vec::new();
        quantize_activation(act, &rng.normals(k, 1.0), &mut xq).unwrap();
        let dot = dot_fn(ty).unwrap();
        let short_w = &w_row[..w_row.len() - 1];
        let short_x = &xq[..xq.len() - 1];
        if std::panic::catch_unwind(|| dot(k, short_w, &xq)).is_ok()
            || std::panic::catch_unwind(|| dot(k, &w_row, short_x)).is_ok()
        {
            failures.push(ty);
        }
    }
    std::panic::set_hook(quiet);
    assert!(failures.is_empty(), "no panic on a short row: {failures:?}");
}
