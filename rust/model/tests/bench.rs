//! The bench keeps a test's context from run to run, as llama-bench keeps
//! its own: the held tokens read once, each run's tokens cut off after it.

mod common;

use common::{tiny_model, tokens, TINY_ARCHS};

use ember_model::bench::{prompt_processing, text_generation, Context};
use ember_model::{KvType, LoadOptions, Model};

#[test]
fn a_test_keeps_its_context_from_run_to_run() {
    let mut kept_by = Vec::new();
    for arch in TINY_ARCHS {
        let Some(path) = tiny_model(arch) else { return };
        let model = Model::load(&path, LoadOptions::default()).unwrap();
        let n_vocab = model.config.n_vocab;
        let (depth, prompt) = (tokens(20, 0, n_vocab), tokens(8, 1, n_vocab));
        let mut kept: Option<Context> = None;
        for run in 1..=2 {
            prompt_processing(&model, &mut kept, &depth, &prompt, 16, KvType::F16).unwrap();
            // A cache with a recurrent state cannot give back only a run's
            // tokens: its context is read afresh for each run.
            if let Some(c) = &kept {
                assert_eq!((c.positions(), c.runs()), (depth.len(), run), "{arch}: the held tokens, kept");
            }
        }
        if kept.is_some() {
            kept_by.push(arch);
        }
        // Other held tokens, or more room than the context has, take a new one.
        prompt_processing(&model, &mut kept, &depth[..10], &prompt, 16, KvType::F16).unwrap();
        if let Some(c) = &kept {
            assert_eq!((c.positions(), c.runs()), (10, 1), "{arch}: a new context for other held tokens");
        }
        text_generation(&model, &mut kept, &depth[..10], 1, 30, 16, KvType::F16).unwrap();
        if let Some(c) = &kept {
            assert_eq!((c.positions(), c.runs()), (10, 1), "{arch}: a new context for more room");
        }
        text_generation(&model, &mut kept, &depth[..10], 1, 30, 16, KvType::F16).unwrap();
        if let Some(c) = &kept {
            assert_eq!((c.positions(), c.runs()), (10, 2), "{arch}: the same test again");
        }
        // A cache type of its own.
        text_generation(&model, &mut kept, &depth[..10], 1, 30, 16, KvType::BF16).unwrap();
        if let Some(c) = &kept {
            assert_eq!(c.runs(), 1, "{arch}: a new context for another cache type");
        }
    }
    assert!(kept_by.contains(&"llama"), "an attention-only model keeps its context: {kept_by:?}");
}
