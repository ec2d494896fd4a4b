//! Sampling parameters with llama.cpp's common defaults, and the checks that
//! turn a bad request into an error naming the offending field before any
//! token is drawn.

use thiserror::Error;

/// How to pick the next token. The defaults are llama.cpp's
/// (`common_params_sampling`), so a request that sets nothing behaves like
/// `llama-cli` with no sampling flags.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// `<= 0` picks the most likely token (after bias and penalties).
    pub temperature: f32,
    /// `<= 0` turns top-k off.
    pub top_k: i32,
    /// `>= 1` turns top-p off.
    pub top_p: f32,
    /// `<= 0` turns min-p off.
    pub min_p: f32,
    /// `>= 1` turns locally typical sampling off.
    pub typical_p: f32,
    /// `1.0` turns the repetition penalty off.
    pub repeat_penalty: f32,
    /// How many of the most recently accepted tokens the penalties look at:
    /// `0` turns all three penalties off, `-1` means every token accepted
    /// since the last reset (llama.cpp's "context size").
    pub repeat_last_n: i32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    /// Added to the raw logit of each token. `-inf` bans a token; a token
    /// named twice gets both biases.
    pub logit_bias: Vec<(u32, f32)>,
    /// `None` seeds from OS entropy and the clock.
    pub seed: Option<u64>,
    /// The stages in the order a request named them (llama-server's
    /// `samplers`), each with the parameters above; a stage left out does
    /// not run (the penalties included), and the draw from what is left
    /// closes the chain. `None`: llama.cpp's default chain.
    pub chain: Option<Vec<Stage>>,
}

/// One stage of a named chain, by llama.cpp's sampler names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Penalties,
    TopK,
    TypicalP,
    TopP,
    MinP,
    /// `temperature <= 0` keeps only the most likely candidate, as llama.cpp's stage does.
    Temperature,
    /// llama.cpp's infill sampler, for code completion: it ends the
    /// insertion when the end of generation is likely enough, and merges
    /// candidates whose text starts another's.
    Infill,
}

/// The most candidates the infill stage compares pairwise: it needs a
/// top-k stage of at most this many before it.
pub const MAX_INFILL_CANDIDATES: i32 = 1024;

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            typical_p: 1.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
            chain: None,
        }
    }
}

impl SamplingParams {
    /// Parameters for plain argmax decoding.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum SampleError {
    #[error("invalid sampling parameter {field} = {value}: {reason}")]
    InvalidParam {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("logit_bias names token {token}, but the vocabulary has only {n_vocab} tokens")]
    BiasTokenOutOfRange { token: u32, n_vocab: usize },
    #[error("vocabulary size {0} is not usable: it must be between 1 and 4294967295")]
    BadVocab(usize),
}

impl SampleError {
    /// The parameter at fault, for mapping onto an API's field names.
    pub fn field(&self) -> &'static str {
        match self {
            SampleError::InvalidParam { field, .. } => field,
            SampleError::BiasTokenOutOfRange { .. } => "logit_bias",
            SampleError::BadVocab(_) => "n_vocab",
        }
    }
}

/// A named chain ember can run as llama.cpp would: the penalties, which
/// ember takes as the row is read, only first; the infill stage only after
/// a top-k that bounds its pairwise comparison.
fn validate_chain(chain: &[Stage], top_k: i32) -> Result<(), SampleError> {
    let named =
        |reason: &'static str| SampleError::InvalidParam { field: "samplers", value: format!("{chain:?}"), reason };
    if chain.iter().skip(1).any(|&s| s == Stage::Penalties) {
        return Err(named("the penalties run only first in the chain"));
    }
    if let Some(at) = chain.iter().position(|&s| s == Stage::Infill) {
        if !chain[..at].contains(&Stage::TopK) || !(1..=MAX_INFILL_CANDIDATES).contains(&top_k) {
            return Err(named("the infill sampler compares every pair of candidates: it needs top_k \
                              (between 1 and 1024) before it"));
        }
    }
    Ok(())
}

fn bad(field: &'static str, value: f32, reason: &'static str) -> SampleError {
    SampleError::InvalidParam {
        field,
        value: value.to_string(),
        reason,
    }
}

fn finite(field: &'static str, value: f32) -> Result<(), SampleError> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(bad(field, value, "must be a finite number"))
    }
}

fn non_negative(field: &'static str, value: f32) -> Result<(), SampleError> {
    finite(field, value)?;
    if value < 0.0 {
        return Err(bad(field, value, "must not be negative"));
    }
    Ok(())
}

pub(crate) fn validate(p: &SamplingParams, n_vocab: usize) -> Result<(), SampleError> {
    if n_vocab == 0 || n_vocab > u32::MAX as usize {
        return Err(SampleError::BadVocab(n_vocab));
    }
    finite("temperature", p.temperature)?;
    non_negative("top_p", p.top_p)?;
    // min_p <= 0 is documented as "off", so negative values are accepted.
    finite("min_p", p.min_p)?;
    non_negative("typical_p", p.typical_p)?;
    finite("repeat_penalty", p.repeat_penalty)?;
    if p.repeat_penalty <= 0.0 {
        // Dividing by zero or a negative number would flip or blow up logits.
        return Err(bad(
            "repeat_penalty",
            p.repeat_penalty,
            "must be greater than 0",
        ));
    }
    if p.repeat_last_n < -1 {
        return Err(SampleError::InvalidParam {
            field: "repeat_last_n",
            value: p.repeat_last_n.to_string(),
            reason: "must be -1 (the whole sequence), 0 (off) or a window length",
        });
    }
    finite("frequency_penalty", p.frequency_penalty)?;
    finite("presence_penalty", p.presence_penalty)?;
    if let Some(chain) = &p.chain {
        validate_chain(chain, p.top_k)?;
    }
    for &(token, bias) in &p.logit_bias {
        if token as usize >= n_vocab {
            return Err(SampleError::BiasTokenOutOfRange { token, n_vocab });
        }
        // -inf is how a client bans a token; NaN and +inf have no meaning.
        if bias.is_nan() || bias == f32::INFINITY {
            return Err(SampleError::InvalidParam {
                field: "logit_bias",
                value: format!("{bias} (token {token})"),
                reason: "must be a finite number or -inf",
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err_field(p: SamplingParams) -> &'static str {
        validate(&p, 10).unwrap_err().field()
    }

    #[test]
    fn defaults_match_llama_cpp() {
        let p = SamplingParams::default();
        assert_eq!(p.temperature, 0.8);
        assert_eq!(p.top_k, 40);
        assert_eq!(p.top_p, 0.95);
        assert_eq!(p.min_p, 0.05);
        assert_eq!(p.typical_p, 1.0);
        assert_eq!(p.repeat_penalty, 1.0);
        assert_eq!(p.repeat_last_n, 64);
        assert_eq!(p.frequency_penalty, 0.0);
        assert_eq!(p.presence_penalty, 0.0);
        assert!(p.logit_bias.is_empty());
        assert_eq!(p.seed, None);
        assert!(validate(&p, 10).is_ok());
    }

    #[test]
    fn rejects_non_finite_values_by_name() {
        let d = SamplingParams::default;
        assert_eq!(
            err_field(SamplingParams {
                temperature: f32::NAN,
                ..d()
            }),
            "temperature"
        );
        assert_eq!(
            err_field(SamplingParams {
                temperature: f32::INFINITY,
                ..d()
            }),
            "temperature"
        );
        assert_eq!(
            err_field(SamplingParams {
                top_p: f32::NAN,
                ..d()
            }),
            "top_p"
        );
        assert_eq!(
            err_field(SamplingParams {
                min_p: f32::NEG_INFINITY,
                ..d()
            }),
            "min_p"
        );
        assert_eq!(
            err_field(SamplingParams {
                typical_p: f32::NAN,
                ..d()
            }),
            "typical_p"
        );
        assert_eq!(
            err_field(SamplingParams {
                repeat_penalty: f32::INFINITY,
                ..d()
            }),
            "repeat_penalty"
        );
        assert_eq!(
            err_field(SamplingParams {
                frequency_penalty: f32::NAN,
                ..d()
            }),
            "frequency_penalty"
        );
        assert_eq!(
            err_field(SamplingParams {
                presence_penalty: f32::NAN,
                ..d()
            }),
            "presence_penalty"
        );
    }

    #[test]
    fn rejects_out_of_range_values() {
        let d = SamplingParams::default;
        assert_eq!(err_field(SamplingParams { top_p: -0.1, ..d() }), "top_p");
        assert_eq!(
            err_field(SamplingParams {
                typical_p: -1.0,
                ..d()
            }),
            "typical_p"
        );
        assert_eq!(
            err_field(SamplingParams {
                repeat_penalty: 0.0,
                ..d()
            }),
            "repeat_penalty"
        );
        assert_eq!(
            err_field(SamplingParams {
                repeat_penalty: -1.1,
                ..d()
            }),
            "repeat_penalty"
        );
    }

    #[test]
    fn accepts_documented_off_values() {
        let p = SamplingParams {
            temperature: -1.0,
            top_k: -5,
            top_p: 1.5,
            min_p: -0.2,
            typical_p: 2.0,
            frequency_penalty: -2.0,
            presence_penalty: -2.0,
            repeat_last_n: -1,
            ..Default::default()
        };
        assert!(validate(&p, 10).is_ok());
    }

    #[test]
    fn logit_bias_checks() {
        let d = SamplingParams::default;
        let e = validate(
            &SamplingParams {
                logit_bias: vec![(10, 1.0)],
                ..d()
            },
            10,
        )
        .unwrap_err();
        assert_eq!(
            e,
            SampleError::BiasTokenOutOfRange {
                token: 10,
                n_vocab: 10
            }
        );
        assert!(e.to_string().contains("token 10"), "{e}");
        assert_eq!(
            err_field(SamplingParams {
                logit_bias: vec![(1, f32::NAN)],
                ..d()
            }),
            "logit_bias"
        );
        assert_eq!(
            err_field(SamplingParams {
                logit_bias: vec![(1, f32::INFINITY)],
                ..d()
            }),
            "logit_bias"
        );
        assert!(validate(
            &SamplingParams {
                logit_bias: vec![(9, f32::NEG_INFINITY)],
                ..d()
            },
            10
        )
        .is_ok());
    }

    #[test]
    fn rejects_unusable_vocab() {
        assert_eq!(
            validate(&SamplingParams::default(), 0),
            Err(SampleError::BadVocab(0))
        );
    }

    #[test]
    fn message_names_field_and_value() {
        let e = validate(
            &SamplingParams {
                top_p: -0.5,
                ..Default::default()
            },
            10,
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("top_p") && msg.contains("-0.5"), "{msg}");
    }
}
