mod common;
use std::sync::Arc;
use common::*;
use ember_model::{Gpu, KvType, LoadOptions, Logits, Model};
#[test]
fn dbg() {
    let gpu = Arc::new(Gpu::open(None).unwrap());
    for arch in ["qwen35moef32", "qwen35moe"] {
        let model = tiny(arch).unwrap();
        let mut dm = Model::load(tiny_model(arch).unwrap(), LoadOptions::default()).unwrap();
        dm.place_on(gpu.clone()).unwrap();
        let n_vocab = model.config.n_vocab;
        let ids = tokens(40, 3, n_vocab);
        for (name, n) in [("one token", 1usize), ("two", 2), ("ten", 10), ("forty", 40)] {
            let mut ds = dm.try_new_session(48, 40, KvType::F16).unwrap();
            let mut cs = model.new_session(48, 40, KvType::F16);
            let a = dm.prefill(&mut ds, &ids[..n], Logits::All).unwrap();
            let b = model.prefill(&mut cs, &ids[..n], Logits::All).unwrap();
            let mut errs = vec![];
            for r in 0..n {
                let (x, y) = (&a[r*n_vocab..(r+1)*n_vocab], &b[r*n_vocab..(r+1)*n_vocab]);
                let d: f64 = x.iter().zip(y).map(|(p, q)| ((p - q) as f64).powi(2)).sum();
                let nn: f64 = y.iter().map(|q| (*q as f64).powi(2)).sum();
                errs.push(format!("{:.3}", (d / nn).sqrt()));
            }
            println!("{arch} {name}: {}", errs.join(" "));
        }
    }
}
