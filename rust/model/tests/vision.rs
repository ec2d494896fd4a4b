//! Multimodal projectors held against llama.cpp's mtmd on tiny random-weight
//! mmproj files (`tests/fixtures/make_tiny_projectors.py`; the reference,
//! `tests/fixtures/tiny/mmproj-<kind>.json`, is written by
//! make_projector_reference.py): a picture's rows from the encoder, and the
//! text model's logits at every position after the picture, with its rows
//! read both ways as Gemma 3's are. The picture here is the one of the
//! encoder's own size, which needs no resize; the resized ones are tested
//! through Pillow in the Python tests.

mod common;

use std::path::PathBuf;

use base64::Engine;
use common::*;
use ember_model::{KvType, LoadOptions, Logits, Media, Model, Pixels};
use serde_json::Value;

fn projector_fixture(kind: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/fixtures/tiny/mmproj-{kind}.json"));
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

/// The tiny projector and the text model it pairs with, loaded together.
fn load(kind: &str, text_model: Option<PathBuf>) -> Option<Model> {
    let text_model = text_model?;
    let mmproj = tiny_model(&format!("mmproj-{kind}"))?;
    Some(Model::load(text_model, LoadOptions { mmproj: Some(mmproj), ..Default::default() }).unwrap())
}

/// Normalised as llama.cpp's clip does: `(x / 255 - mean) / std`, mean and std 0.5.
fn normalised(rgb: &[u8]) -> Vec<f32> {
    rgb.iter().map(|&v| (v as f32 / 255.0 - 0.5) / 0.5).collect()
}

fn parity(kind: &str, model: Model, max_mean_diff: f64) {
    let f = projector_fixture(kind);
    let case = f["cases"].as_array().unwrap().iter().find(|c| c["picture"] == "square").unwrap();
    let rgb = base64::engine::general_purpose::STANDARD.decode(case["rgb_base64"].as_str().unwrap()).unwrap();
    let size = case["width"].as_u64().unwrap() as usize;
    let pixels = normalised(&rgb);
    let rows = model.encode_image(&Pixels { width: size, height: size, rgb: &pixels }).unwrap();
    let e = model.config.n_embd;
    let want: Vec<f32> =
        case["embeddings"].as_array().unwrap().iter().flat_map(|r| r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32)).collect();
    assert_eq!(rows.len(), want.len(), "{kind}: rows of the picture");
    // The reference's attention reads f16 keys and values (clip's flash
    // attention); the cosine of every row and the largest difference say
    // how close the encoder is.
    let mut worst_cos = 1.0f64;
    let mut max_diff = 0.0f64;
    for (a, b) in rows.chunks(e).zip(want.chunks(e)) {
        let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
        let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        worst_cos = worst_cos.min(dot / (na * nb));
        max_diff = a.iter().zip(b).fold(max_diff, |m, (x, y)| m.max((x - y).abs() as f64));
    }
    println!("{kind}: picture rows, worst cosine {worst_cos:.6}, max |diff| {max_diff:.5}");
    assert!(worst_cos > 0.9995, "{kind}: worst cosine {worst_cos}");

    // The prompt as mtmd cut it: text, the picture's rows (placeholder ids
    // the cache remembers them by), text.
    let mut ids = Vec::new();
    let mut media_at = None;
    for part in case["parts"].as_array().unwrap() {
        if let Some(t) = part.get("text_ids") {
            ids.extend(common::ids(t));
        } else {
            assert!(part["non_causal"].as_bool().unwrap(), "{kind}: Gemma 3's picture rows are read both ways");
            media_at = Some(ids.len());
            ids.extend(std::iter::repeat_n(0u32, part["image_tokens"].as_u64().unwrap() as usize));
        }
    }
    let media = [Media { at: media_at.unwrap(), rows: &rows, bidirectional: true }];
    let n_vocab = model.config.n_vocab;
    // Passes of 7 as well as one: a pass never cuts the picture's rows.
    for batch in [512, 7] {
        let mut s = model.new_session(256, batch.max(rows.len() / e), KvType::F16);
        let logits = model.prefill_with_media(&mut s, &ids, &media, Logits::All).unwrap();
        let mut agreement = Agreement::default();
        for row in case["positions"].as_array().unwrap() {
            let pos = row["pos"].as_u64().unwrap() as usize;
            agreement.add(&logits[pos * n_vocab..(pos + 1) * n_vocab], row);
        }
        agreement.check_within(&format!("{kind} after a picture, passes of {batch}"), max_mean_diff);
    }
}

#[test]
fn tiny_gemma3_picture_matches_mtmd() {
    if let Some(model) = load("gemma3", tiny_model("gemma3")) {
        parity("gemma3", model, 0.05);
    }
}

/// The 270M test model with a projector to its width, written with the
/// feed-forward pair under each other's names (told apart by shape).
#[test]
fn gemma3_270m_picture_matches_mtmd() {
    if let Some(model) = load("gemma3-270m", model_path(GEMMA3)) {
        parity("gemma3-270m", model, 0.35);
    }
}

/// Read one way only, the rows after a picture part from the reference:
/// what shows the bidirectional attention is what makes the parity.
#[test]
fn gemma3_picture_read_causally_parts_from_mtmd() {
    let Some(model) = load("gemma3", tiny_model("gemma3")) else { return };
    let f = projector_fixture("gemma3");
    let case = f["cases"].as_array().unwrap().iter().find(|c| c["picture"] == "square").unwrap();
    let rgb = base64::engine::general_purpose::STANDARD.decode(case["rgb_base64"].as_str().unwrap()).unwrap();
    let pixels = normalised(&rgb);
    let rows = model.encode_image(&Pixels { width: 128, height: 128, rgb: &pixels }).unwrap();
    let parts = case["parts"].as_array().unwrap();
    let mut ids = common::ids(&parts[0]["text_ids"]);
    let at = ids.len();
    ids.extend(std::iter::repeat_n(0u32, 16));
    ids.extend(common::ids(&parts[2]["text_ids"]));
    let mut s = model.new_session(256, 512, KvType::F16);
    let media = [Media { at, rows: &rows, bidirectional: false }];
    let logits = model.prefill_with_media(&mut s, &ids, &media, Logits::All).unwrap();
    let n_vocab = model.config.n_vocab;
    let mut agreement = Agreement::default();
    for row in case["positions"].as_array().unwrap() {
        let pos = row["pos"].as_u64().unwrap() as usize;
        agreement.add(&logits[pos * n_vocab..(pos + 1) * n_vocab], row);
    }
    println!("{}", agreement.report("read one way"));
    assert!(agreement.mean_abs_diff() > 0.05, "{}", agreement.report("read one way"));
}

/// A projector is refused by name where it does not fit: rows of another
/// width, or a text file given as the projector.
#[test]
fn a_projector_that_does_not_fit_is_refused() {
    let (Some(text), Some(wide)) = (tiny_model("gemma3"), tiny_model("mmproj-gemma3-270m")) else { return };
    let err = Model::load(&text, LoadOptions { mmproj: Some(wide), ..Default::default() }).err().unwrap().to_string();
    assert!(err.contains("640 wide") && err.contains("embedding is 64"), "{err}");
    let err = Model::load(&text, LoadOptions { mmproj: Some(text.clone()), ..Default::default() }).err().unwrap().to_string();
    assert!(err.contains("not a projector"), "{err}");
    let Some(llama) = tiny_model("llama") else { return };
    let mmproj = tiny_model("mmproj-gemma3").unwrap();
    let err = Model::load(&llama, LoadOptions { mmproj: Some(mmproj), ..Default::default() }).err().unwrap().to_string();
    assert!(err.contains("64") || err.contains("does not fit"), "{err}");
    let model = Model::load(&text, LoadOptions::default()).unwrap();
    let err = model.encode_image(&Pixels { width: 1, height: 1, rgb: &[0.0; 3] }).err().unwrap().to_string();
    assert!(err.contains("no projector"), "{err}");
}

/// Rows that do not fit their pass are refused, naming why: not whole rows,
/// runs that overlap, or a run past the pass's tokens.
#[test]
fn rows_that_do_not_fit_the_pass_are_refused() {
    let Some(model) = tiny("gemma3") else { return };
    let e = model.config.n_embd;
    let rows = vec![0.5f32; 4 * e];
    let ids = vec![2u32; 8];
    let cases: [(&[Media], &str); 3] = [
        (&[Media { at: 1, rows: &rows[..e + 3], bidirectional: true }], "not whole rows"),
        (
            &[Media { at: 1, rows: &rows, bidirectional: true }, Media { at: 3, rows: &rows, bidirectional: true }],
            "overlap",
        ),
        (&[Media { at: 6, rows: &rows, bidirectional: false }], "pass the 8 tokens"),
    ];
    for (media, why) in cases {
        let mut s = model.new_session(64, 16, KvType::F16);
        let err = model.prefill_with_media(&mut s, &ids, media, Logits::Last).err().unwrap().to_string();
        assert!(err.contains(why), "{err}");
        assert_eq!(s.cache.len(), 0, "nothing is read when the rows are refused");
    }
    // A bidirectional run longer than a pass cannot be read whole.
    let mut s = model.new_session(64, 3, KvType::F16);
    let media = [Media { at: 1, rows: &rows, bidirectional: true }];
    let err = model.prefill_with_media(&mut s, &ids, &media, Logits::Last).err().unwrap().to_string();
    assert!(err.contains("one pass"), "{err}");
}
