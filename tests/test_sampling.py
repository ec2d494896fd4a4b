"""The options one generation runs under (`ember.SamplingParams`): built
once, converted once into the engine's, and the same whether a caller
gives the object or its fields as keywords."""

from __future__ import annotations

import pytest

from ember import SamplingParams
from ember.model import sampling_params
from ember.sampling import ThoughtBudget


def test_defaults_are_llama_servers():
    s = SamplingParams().settings()
    assert (s["temperature"], s["top_k"], s["top_p"], s["min_p"], s["typical_p"], s["repeat_last_n"]) == (
        0.8, 40, 0.95, 0.05, 1.0, 64)
    assert s["stop"] == [] and s["seed"] is None and s["n_probs"] == 0


def test_an_unknown_field_is_refused_not_dropped():
    with pytest.raises(TypeError):
        sampling_params(tempreature=0.0)
    p = SamplingParams()
    with pytest.raises(AttributeError):
        p.tempreature = 0.0  # slots: a misspelt field cannot be set on the way either


def test_keywords_build_the_same_params_as_the_object():
    kw = sampling_params(temperature=0.0, stop="##", logit_bias=None, seed=7)
    assert kw == SamplingParams(temperature=0.0, stop=["##"], seed=7)
    with pytest.raises(TypeError):
        sampling_params(SamplingParams(), temperature=0.0)


def test_the_native_options_are_built_and_their_types_checked():
    p = SamplingParams(temperature=0.5, top_k=3, logit_bias={5: -1.0}, n_probs=2,
                       thought_budget=ThoughtBudget(8, "<think>", "</think>", (1, 2), True))
    native = p.native(12)
    assert type(native).__name__ == "GenerateOptions"
    with pytest.raises(Exception):
        SamplingParams(top_k="x").native(1)  # the engine's own check of its types


def test_params_and_keywords_draw_the_same_tokens(smollm2):
    a = smollm2.complete("The capital of France is", 8, temperature=0.0, stop=["\n\n"])
    b = smollm2.complete("The capital of France is", 8, params=SamplingParams(temperature=0.0, stop=["\n\n"]))
    assert a.tokens == b.tokens and a.text == b.text
