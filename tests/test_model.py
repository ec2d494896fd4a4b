"""The in-process API (`ember.Model`, `ember.model`) on the real test models:
tokens, logits and generation against llama.cpp's golden outputs, the API's
contracts (stop strings, limits, seeds, streaming, errors), and `Model.chat`,
which runs the chat core in-process and answers what the chat route answers."""

from __future__ import annotations

import json

import numpy as np
import pytest

import ember
from chat_cases import CHAT, WEATHER
from ember.model import StopMatcher
from server_process import ServerProcess, post_ok
from thinking_model import STEERED, build as build_thinking


@pytest.fixture(params=["smollm2", "gemma3"])
def model_and_golden(request):
    return request.getfixturevalue(request.param), request.getfixturevalue(request.param + "_golden")


def test_tokenize_matches_llama_cpp(model_and_golden):
    model, g = model_and_golden
    for case in g["tokenize"]:
        assert model.tokenize(case["text"], add_special=False) == case["ids"], case["text"]
        assert model.tokenize(case["text"], add_special=False, parse_special=True) == case["ids_parse_special"], case["text"]
    for case in g["cases"]:
        assert model.tokenize(case["prompt"], add_special=True, parse_special=True) == case["prompt_ids"]


def test_logits_follow_llama_cpp(model_and_golden):
    """Teacher-forced through the Python API (the full gate runs in rust/model/tests/parity.rs)."""
    model, g = model_and_golden
    diffs = []
    for case in g["cases"]:
        seq = case["prompt_ids"] + case["greedy_ids"]
        logits = model.logits(seq)
        assert logits.shape == (len(seq), model.n_vocab) and logits.dtype == np.float32
        for row in case["positions"]:
            ours = logits[row["pos"]]
            top = row["top_logits"]
            if top[0] - top[1] >= 1.0:
                assert int(np.argmax(ours)) == row["top_ids"][0]
            diffs.extend(abs(float(ours[i]) - l) for i, l in zip(row["top_ids"], top))
    assert np.mean(diffs) < 0.35


def test_greedy_generation_follows_llama_cpp_until_a_near_tie(model_and_golden):
    """Free-running greedy output equals llama.cpp's up to the first position
    where its top two logits are within 1.0 (there either answer is right)."""
    model, g = model_and_golden
    for case in g["cases"][:4]:
        n_sure = 0
        for row in case["positions"][: len(case["greedy_ids"])]:
            if row["top_logits"][0] - row["top_logits"][1] < 1.0:
                break
            n_sure += 1
        if n_sure == 0:
            continue
        done = model.complete(case["prompt_ids"], n_sure, temperature=0.0)
        assert done.tokens[:n_sure] == case["greedy_ids"][:n_sure]


def test_stream_equals_whole_text(smollm2):
    pieces = list(smollm2.generate("Once upon a time", 20, stream=True, temperature=0))
    assert len(pieces) > 1
    assert "".join(pieces) == smollm2.generate("Once upon a time", 20, temperature=0)


def test_logprobs_are_the_models_softmax(smollm2):
    ids = smollm2.tokenize("The capital of France is")
    pieces = [p for p in smollm2.stream_completion(ids, 3, temperature=0, n_probs=5) if isinstance(p, ember.Piece) and p.token is not None]
    row = smollm2.logits(ids)[-1].astype(np.float64)
    lse = np.log(np.exp(row - row.max()).sum()) + row.max()
    first = pieces[0]
    assert [t for t, _ in first.top] == list(np.argsort(-row)[:5])
    assert first.token == first.top[0][0]
    assert abs(first.logprob - (row[first.token] - lse)) < 1e-3
    assert all(a[1] >= b[1] for a, b in zip(first.top, first.top[1:]))


def test_max_tokens_and_finish_reason(smollm2):
    done = smollm2.complete("Once upon a time", 5, temperature=0)
    assert len(done.tokens) == 5 and done.finish_reason == "length"
    assert smollm2.complete("Hi", 0).tokens == []


def test_end_of_turn_stops_unless_ignored(smollm2):
    msgs = [{"role": "user", "content": "Say hello."}]
    ids = smollm2.chat_prompt_ids(msgs)
    done = smollm2.complete(ids, 200, temperature=0)
    assert done.finish_reason == "stop" and smollm2._native.is_eog(done.tokens[-1])
    forced = smollm2.complete(ids, len(done.tokens) + 5, temperature=0, ignore_eos=True)
    assert forced.finish_reason == "length"
    assert not any(smollm2._native.is_eog(t) for t in forced.tokens)


def test_stop_string_is_cut_and_never_streamed(smollm2):
    full = smollm2.generate("1, 2, 3, 4,", 20, temperature=0)
    assert " 6" in full
    pieces = list(smollm2.generate("1, 2, 3, 4,", 20, temperature=0, stop=[" 6"], stream=True))
    text = "".join(pieces)
    assert text == full[: full.index(" 6")]
    done = smollm2.complete("1, 2, 3, 4,", 20, temperature=0, stop=" 6")
    assert done.finish_reason == "stop" and done.stop_string == " 6"


def test_code_completion_rules_and_a_named_chain_in_process(smollm2):
    """n_indent, and llama-server's samplers by name (the infill sampler among
    them), through `ember.Model`'s keywords as through the server's fields."""
    lines = 'root ::= "a\\n  b\\nc\\n"'
    done = smollm2.complete("Hi", 20, grammar=lines, temperature=0, n_indent=2)
    assert (done.text, done.finish_reason) == ("a\n  b\n", "length")
    assert "".join(smollm2.generate("Hi", 20, grammar=lines, temperature=0, n_indent=2, stream=True)) == "a\n  b\n"
    # Without temperature in the chain, a temperature of 0 draws at 1: the seed decides.
    greedy = smollm2.complete("The weather today", 16, temperature=0).text
    named = [smollm2.complete("The weather today", 16, samplers=["top_k", "top_p"], temperature=0, seed=s).text
             for s in (1, 2, 3)]
    assert any(text != greedy for text in named)
    assert smollm2.complete("The weather today", 16, samplers=["top_k", "temperature"], temperature=0,
                            seed=1).text == greedy
    assert smollm2.complete("def f(x):", 12, samplers=["top_k", "top_p", "infill"], seed=1).tokens
    with pytest.raises(ember.InvalidRequestError, match="samplers"):
        smollm2.complete("Hi", 2, samplers=["infill"])


def test_seed_makes_sampling_repeatable(smollm2):
    a = smollm2.complete("The weather today", 16, temperature=1.0, seed=42).tokens
    b = smollm2.complete("The weather today", 16, temperature=1.0, seed=42).tokens
    c = smollm2.complete("The weather today", 16, temperature=1.0, seed=7).tokens
    assert a == b
    assert a != c


def test_chat_uses_the_template_and_one_bos(smollm2, gemma3):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = smollm2.render_chat(msgs)
    assert prompt.startswith("<|im_start|>system") and prompt.endswith("<|im_start|>assistant\n")
    ids = gemma3.chat_prompt_ids(msgs)
    assert ids[0] == gemma3._native.bos_id and ids[1] != gemma3._native.bos_id
    assert gemma3.render_chat(msgs).endswith("<start_of_turn>model\n")
    reply = smollm2.chat(msgs, 8, temperature=0)
    assert reply["role"] == "assistant" and isinstance(reply["content"], str) and reply["content"]


def test_bad_inputs_raise_named_errors(smollm2):
    with pytest.raises(ember.InvalidRequestError, match="out of range"):
        smollm2.logits([1, 10**7])
    with pytest.raises(ember.InvalidRequestError, match="temperature"):
        smollm2.complete("x", 2, temperature=float("nan"))
    with pytest.raises(ember.InvalidRequestError, match="empty"):
        smollm2.complete("", 2)
    small = ember.Model(smollm2.path, n_ctx=8)
    with pytest.raises(ember.ContextFullError):
        small.complete(list(range(1, 20)), 2)
    with pytest.raises(ember.ModelLoadError):
        ember.Model("/nonexistent/model.gguf")


def test_context_full_ends_generation(smollm2):
    small = ember.Model(smollm2.path, n_ctx=12)
    done = small.complete("Once upon a time", 100, temperature=0, ignore_eos=True)
    assert done.finish_reason == "context"
    assert done.n_prompt + len(done.tokens) <= 13


def test_stop_matcher_holds_back_partial_stops():
    m = StopMatcher(["</end>"])
    assert m.push("hello </") == ("hello ", None)
    assert m.push("en") == ("", None)
    assert m.push("d> tail") == ("", "</end>")
    m = StopMatcher(["ab"])
    assert m.push("xa") == ("x", None)
    assert m.push("c") == ("ac", None)
    assert m.flush() == ""


def test_cache_types(smollm2):
    """Q8_0 and bf16 caches (llama-server's --cache-type-k/-v q8_0, bf16)
    answer, their logits near the f16 cache's (the Rust parity tests measure
    how near); an unknown type is refused by name."""
    prompt = smollm2.tokenize("The capital of France is")
    a = np.asarray(smollm2.logits(prompt))[-1]
    for kv in ("q8_0", "bf16"):
        other = ember.Model(smollm2.path, n_ctx=64, kv_type=kv)
        b = np.asarray(other.logits(prompt))[-1]
        assert int(a.argmax()) == int(b.argmax()) and float(np.abs(a - b).max()) < 3.0, kv
        assert other.complete(prompt, 8, temperature=0).text
    with pytest.raises(ember.InvalidRequestError, match='kv_type "q4_0"'):
        ember.Model(smollm2.path, n_ctx=64, kv_type="q4_0")


# -- Model.chat against the chat route ---------------------------------------------

def route(server, body: dict) -> dict:
    return post_ok(server, "/v1/chat/completions", body)["choices"][0]["message"]


def test_model_chat_thinks_as_the_chat_route_does(tmp_path):
    """The thinking test model (its template opens the thought), steered
    through a thought and an answer by a grammar: in-process and over the
    chat route, the same thought and the same answer, whole and streamed."""
    from ember import Model

    path = build_thinking(tmp_path / "thinking.gguf")
    model = Model(str(path), n_ctx=512)
    mine = model.chat(CHAT, 40, grammar=STEERED, temperature=0)
    streamed = list(model.chat(CHAT, 40, grammar=STEERED, temperature=0, stream=True))
    with ServerProcess(path) as s:
        theirs = route(s, {"messages": CHAT, "grammar": STEERED, "max_tokens": 40, "temperature": 0})
    assert mine["reasoning_content"] and mine["content"].startswith("The answer")
    assert (mine["reasoning_content"], mine["content"]) == (theirs["reasoning_content"], theirs["content"])
    assert "".join(d.get("reasoning_content", "") for d in streamed) == mine["reasoning_content"]
    assert "".join(d.get("content", "") for d in streamed) == mine["content"]


def test_model_chat_makes_a_forced_call_as_the_chat_route_does(smollm2, smollm2_path):
    mine = smollm2.chat(CHAT, 60, tools=[WEATHER], tool_choice="required", temperature=0)
    with ServerProcess(smollm2_path) as s:
        theirs = route(s, {"messages": CHAT, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 60,
                           "temperature": 0})
    strip = lambda calls: [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
    assert mine["tool_calls"] and strip(mine["tool_calls"]) == strip(theirs["tool_calls"])
    assert mine["content"] == theirs["content"]
