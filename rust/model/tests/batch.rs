//! Passes over several sessions at once give each session exactly what a pass
//! of its own gives: prompts of different lengths read side by side, a prompt
//! chunk beside single decoded tokens, and greedy generations run together.

mod common;

use common::{tiny_model, tokens, TINY_ARCHS};

use ember_model::{KvType, LoadOptions, Logits, Model, SeqPass, Session, Workspace};

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0 as u32
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// With an f16 cache and a bf16 one (whose attention takes other loops,
/// paired products where the core has them).
#[test]
fn a_batch_gives_each_session_its_own_results() {
    for (arch, kv) in TINY_ARCHS.iter().flat_map(|a| [(a, KvType::F16), (a, KvType::BF16)]) {
        let Some(path) = tiny_model(arch) else { return };
        let model = Model::load(&path, LoadOptions::default()).unwrap();
        let n_vocab = model.config.n_vocab;
        let session = || model.new_session(64, 16, kv);
        let prompts = [tokens(11, 0, n_vocab), tokens(3, 1, n_vocab), tokens(16, 2, n_vocab)];
        let wants = [Logits::All, Logits::Last, Logits::None];

        // Alone.
        let mut alone: Vec<Session> = prompts.iter().map(|_| session()).collect();
        let mut alone_logits = Vec::new();
        for ((s, p), &w) in alone.iter_mut().zip(&prompts).zip(&wants) {
            alone_logits.push(model.forward(s, p, w).unwrap().to_vec());
        }
        // Together.
        let mut together: Vec<Session> = prompts.iter().map(|_| session()).collect();
        let mut ws = Workspace::default();
        let mut parts: Vec<SeqPass> = together
            .iter_mut()
            .zip(&prompts)
            .zip(&wants)
            .map(|((s, p), &w)| SeqPass { session: s, tokens: p, want: w, snapshots: &mut [], media: &[] })
            .collect();
        model.forward_batch(&mut ws, &mut parts).unwrap();
        for (i, s) in together.iter().enumerate() {
            assert!(same_bits(s.logits(), &alone_logits[i]), "{arch} {kv:?}: prompt {i}");
            assert_eq!(s.len(), prompts[i].len());
        }

        // Greedy decoding of all three side by side, with one reading a
        // second prompt chunk meanwhile, against each alone.
        let mut next: Vec<u32> = vec![argmax(&alone_logits[0][10 * n_vocab..]), argmax(&alone_logits[1]), 5];
        let extra = tokens(6, 3, n_vocab);
        for step in 0..5 {
            let mut want_alone = Vec::new();
            for (i, s) in alone.iter_mut().enumerate() {
                let toks: &[u32] = if i == 2 && step == 0 { &extra } else { std::slice::from_ref(&next[i]) };
                want_alone.push(model.forward(s, toks, Logits::Last).unwrap().to_vec());
            }
            let step_tokens: Vec<Vec<u32>> =
                (0..3).map(|i| if i == 2 && step == 0 { extra.clone() } else { vec![next[i]] }).collect();
            let mut parts: Vec<SeqPass> = together
                .iter_mut()
                .zip(&step_tokens)
                .map(|(s, t)| SeqPass { session: s, tokens: t, want: Logits::Last, snapshots: &mut [], media: &[] })
                .collect();
            model.forward_batch(&mut ws, &mut parts).unwrap();
            for i in 0..3 {
                assert!(same_bits(together[i].logits(), &want_alone[i]), "{arch} {kv:?}: step {step}, session {i}");
                next[i] = argmax(&want_alone[i]);
            }
        }
    }
}

#[test]
fn a_bad_part_runs_nothing() {
    let Some(path) = tiny_model("llama") else {
        return;
    };
    let model = Model::load(&path, LoadOptions::default()).unwrap();
    let mut a = model.new_session(8, 8, KvType::F16);
    let mut b = model.new_session(8, 8, KvType::F16);
    let (good, bad) = ([1u32, 2], [model.config.n_vocab as u32]);
    let mut ws = Workspace::default();
    let mut parts = [
        SeqPass { session: &mut a, tokens: &good, want: Logits::Last, snapshots: &mut [], media: &[] },
        SeqPass { session: &mut b, tokens: &bad, want: Logits::Last, snapshots: &mut [], media: &[] },
    ];
    assert!(model.forward_batch(&mut ws, &mut parts).is_err());
    assert_eq!((a.len(), b.len()), (0, 0));
}

/// In the last layer only the rows whose logits are wanted go on past
/// attention: a prompt's last row is the same whether every row's logits
/// were asked for, only the last one's, or none until a later pass, and the
/// caches they leave continue identically (every row's key and value of the
/// last layer are still written).
#[test]
fn only_the_wanted_rows_finish_the_last_layer() {
    for arch in TINY_ARCHS {
        let Some(path) = tiny_model(arch) else { return };
        let model = Model::load(&path, LoadOptions::default()).unwrap();
        let n_vocab = model.config.n_vocab;
        let prompt = tokens(13, 4, n_vocab);
        let mut all = model.new_session(64, 16, KvType::F16);
        let every = model.forward(&mut all, &prompt, Logits::All).unwrap().to_vec();
        let want = every[12 * n_vocab..].to_vec();

        let mut last = model.new_session(64, 16, KvType::F16);
        assert!(same_bits(model.forward(&mut last, &prompt, Logits::Last).unwrap(), &want), "{arch}: last only");
        // A recurrent state read as 8 + 5 tokens was summed in other chunks
        // than one read as 13: the split agrees to rounding, not to the bit.
        let recurrent = model.config.layers.iter().any(|l| l.delta.is_some());
        let split_agrees = |got: &[f32], want: &[f32]| {
            if recurrent {
                got.len() == want.len() && got.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-3)
            } else {
                same_bits(got, want)
            }
        };
        let mut split = model.new_session(64, 16, KvType::F16);
        assert!(model.forward(&mut split, &prompt[..8], Logits::None).unwrap().is_empty(), "{arch}: no logits wanted");
        assert!(
            split_agrees(model.forward(&mut split, &prompt[8..], Logits::Last).unwrap(), &want),
            "{arch}: none, then last"
        );

        let next = argmax(&want);
        let cont = model.forward(&mut all, &[next], Logits::Last).unwrap().to_vec();
        // A pass that wants none hands back none, not an earlier pass's (the
        // session and the pass trade buffers, so two passes back).
        let mut again = model.new_session(64, 16, KvType::F16);
        model.forward(&mut again, &prompt, Logits::Last).unwrap();
        model.forward(&mut again, &[next], Logits::Last).unwrap();
        assert!(model.forward(&mut again, &[next], Logits::None).unwrap().is_empty(), "{arch}: stale logits");
        assert!(
            same_bits(model.forward(&mut last, &[next], Logits::Last).unwrap(), &cont),
            "{arch}: continuing after last only"
        );
        assert!(
            split_agrees(model.forward(&mut split, &[next], Logits::Last).unwrap(), &cont),
            "{arch}: continuing after none, then last"
        );
    }
}
