"""llama-server's /infill, and the two code-completion rules its clients send
on every route (`n_indent`, `t_max_predict_ms`).

Neither test model's vocabulary names fill-in-the-middle tokens, so the
served one is a copy of SmolLM2 whose metadata names three of its unused
control tokens as FIM_PRE, FIM_SUF and FIM_MID (and one as FIM_SEP; its
`<reponame>` is FIM_REP by spelling). SmolLM2 was not trained on them, so
what the tests hold /infill to is its prompt: the reply equals /completion's
on the tokens llama-server's format builds, assembled here by hand. The
line rules are shown on text a grammar forces, so the lines are known."""

from __future__ import annotations

import json

import pytest

from api_helpers import SMOLLM2_FIM_IDS
from ember.model import LineRules
from ember.server import wire
from ember.server.protocols.llama_server import infill_prompt
from server_process import ServerProcess, error_of, http, post_ok, sse

FIM = SMOLLM2_FIM_IDS
REP = 4  # <reponame>, found by its spelling

PREFIX = "#include <cstdio>\n#include \"llama.h\"\n\nint main() {\n"
SUFFIX = "}\n"
MIDDLE = "    int n_threads = llama_"
EXTRA = [{"filename": "llama.h", "text": "LLAMA_API int32_t llama_n_threads();\n"}]


@pytest.fixture(scope="module")
def fim_server(smollm2_fim_path):
    # A slot's context (1024) less a batch and twice a reply leaves the extra files room only
    # with a batch below llama-server's 2048, as on llama-server.
    with ServerProcess(smollm2_fim_path, "-np", "2", "-b", "512") as s:
        yield s


def tokens(server, text: str) -> list[int]:
    return post_ok(server, "/tokenize", {"content": text, "add_special": False, "parse_special": False})["tokens"]


def test_infill_answers_as_completion_does_on_llama_server_s_format(fim_server):
    t = lambda text: tokens(fim_server, text)
    expected = ([REP, *t("myproject\n"), FIM["fim_sep"], *t("llama.h\n"), *t(EXTRA[0]["text"]),
                 FIM["fim_sep"], *t("filename\n"),
                 FIM["fim_pre"], *t(PREFIX), *t(MIDDLE), FIM["fim_suf"], *t(SUFFIX), FIM["fim_mid"]])
    ask = {"n_predict": 8, "temperature": 0}
    got = post_ok(fim_server, "/infill", {"input_extra": EXTRA, "input_prefix": PREFIX, "prompt": MIDDLE,
                                          "input_suffix": SUFFIX, **ask})
    by_hand = post_ok(fim_server, "/completion", {"prompt": expected, **ask})
    assert got["tokens_evaluated"] == len(expected) == by_hand["tokens_evaluated"]
    assert got["content"] == by_hand["content"] and got["tokens_predicted"] == 8
    # Streamed, the same text.
    status, _, body = http(fim_server.url + "/infill", {"input_extra": EXTRA, "input_prefix": PREFIX, "prompt": MIDDLE,
                                                        "input_suffix": SUFFIX, "stream": True, **ask})
    assert status == 200
    assert "".join(e["content"] for e in sse(body)) == got["content"]


def test_infill_without_extra_still_names_the_file(fim_server):
    t = lambda text: tokens(fim_server, text)
    expected = [REP, *t("myproject\n"), FIM["fim_sep"], *t("filename\n"), FIM["fim_pre"], *t(PREFIX),
                FIM["fim_suf"], *t(SUFFIX), FIM["fim_mid"]]
    got = post_ok(fim_server, "/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 4,
                                          "temperature": 0})
    assert got["tokens_evaluated"] == len(expected)
    assert got["content"] == post_ok(fim_server, "/completion", {"prompt": expected, "n_predict": 4,
                                                                  "temperature": 0})["content"]


def test_spm_infill_puts_the_suffix_first_and_b_sets_the_budgets(smollm2_fim_path):
    """--spm-infill's order, and -b's share for each part: the prefix its
    last 3/4 of the batch, the suffix its first 1/4 less the prompt and two
    (the logical batch, -b, not the pass's, -ub)."""
    with ServerProcess(smollm2_fim_path, "--spm-infill", "-b", "64", "-ub", "32") as s:
        t = lambda text: tokens(s, text)
        prefix, suffix = t(PREFIX * 8), t(SUFFIX * 12)
        assert len(prefix) > 48 and len(suffix) > 16
        n_suffix = 16 - 2 - len(t(MIDDLE))
        expected = [REP, *t("myproject\n"), FIM["fim_sep"], *t("filename\n"), FIM["fim_suf"], *suffix[:n_suffix],
                    FIM["fim_pre"], *prefix[-48:], *t(MIDDLE), FIM["fim_mid"]]
        ask = {"n_predict": 4, "temperature": 0}
        got = post_ok(s, "/infill", {"input_prefix": PREFIX * 8, "prompt": MIDDLE, "input_suffix": SUFFIX * 12,
                                     **ask})
        assert got["tokens_evaluated"] == len(expected)
        assert got["content"] == post_ok(s, "/completion", {"prompt": expected, **ask})["content"]


def test_ollama_generate_with_a_suffix_inserts_in_fim_tokens(fim_server):
    """Ollama's `suffix`, through the official client: the insertion between
    the prompt and the suffix, as /completion answers it on the FIM tokens."""
    import ollama

    t = lambda text: tokens(fim_server, text)
    expected = [FIM["fim_pre"], *t(PREFIX), FIM["fim_suf"], *t(SUFFIX), FIM["fim_mid"]]
    client = ollama.Client(host=fim_server.url)
    got = client.generate(model="any", prompt=PREFIX, suffix=SUFFIX, options={"temperature": 0, "num_predict": 6})
    by_hand = post_ok(fim_server, "/completion", {"prompt": expected, "n_predict": 6, "temperature": 0})
    assert got.response == by_hand["content"] and got.prompt_eval_count == len(expected)
    streamed = "".join(c.response for c in client.generate(model="any", prompt=PREFIX, suffix=SUFFIX, stream=True,
                                                           options={"temperature": 0, "num_predict": 6}))
    assert streamed == got.response


def test_openai_completions_with_a_suffix_insert_in_fim_tokens(fim_server):
    """OpenAI's insert mode (`suffix` on /v1/completions), through the official client."""
    from api_helpers import openai_client

    t = lambda text: tokens(fim_server, text)
    expected = [FIM["fim_pre"], *t(PREFIX), FIM["fim_suf"], *t(SUFFIX), FIM["fim_mid"]]
    by_hand = post_ok(fim_server, "/completion", {"prompt": expected, "n_predict": 6, "temperature": 0})
    client = openai_client(fim_server)
    got = client.completions.create(model="any", prompt=PREFIX, suffix=SUFFIX, max_tokens=6, temperature=0)
    assert got.choices[0].text == by_hand["content"] and got.usage.prompt_tokens == len(expected)
    # A prompt of token ids is the part before the insertion as it stands.
    ids = client.completions.create(model="any", prompt=t(PREFIX), suffix=SUFFIX, max_tokens=6, temperature=0)
    assert ids.choices[0].text == by_hand["content"]
    e = error_of(http(fim_server.url + "/v1/completions", {"prompt": PREFIX, "suffix": SUFFIX, "echo": True}), 400)
    assert e["param"] == "echo"


def test_openai_suffix_on_a_model_without_fim_tokens_is_refused(server):
    e = error_of(http(server.url + "/v1/completions", {"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 2}), 400)
    assert e["param"] == "suffix" and "fill-in-the-middle" in e["message"]


@pytest.mark.parametrize("extra", [{"raw": True}, {"system": "Be brief."}])
def test_ollama_suffix_refuses_what_has_no_place_beside_it(fim_server, extra):
    status, _, raw = http(fim_server.url + "/api/generate", {"prompt": PREFIX, "suffix": SUFFIX, "stream": False,
                                                              **extra})
    assert status == 400 and next(iter(extra)) in json.loads(raw)["error"]


def test_ollama_suffix_on_a_model_without_fim_tokens_is_refused(server):
    status, _, raw = http(server.url + "/api/generate", {"prompt": PREFIX, "suffix": SUFFIX, "stream": False})
    assert status == 400 and "does not support insert" in json.loads(raw)["error"]


@pytest.mark.parametrize("body, param", [
    ({"input_suffix": SUFFIX}, "input_prefix"),
    ({"input_prefix": PREFIX}, "input_suffix"),
    ({"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": [1, 2]}, "prompt"),
])
def test_infill_refuses_a_missing_or_misshapen_field_by_name(fim_server, body, param):
    e = error_of(http(fim_server.url + "/infill", body), 400)
    assert e["param"] == param and param in e["message"]


@pytest.mark.parametrize("chunk", [{}, {"filename": "ok"}, {"filename": 123}, {"filename": 123, "text": "abc"},
                                   {"filename": "a", "text": 456}])
def test_infill_refuses_a_misshapen_extra_chunk(fim_server, chunk):
    e = error_of(http(fim_server.url + "/infill", {"input_extra": [chunk], "input_prefix": PREFIX,
                                                    "input_suffix": SUFFIX}), 400)
    assert "input_extra" in e["message"]


def test_infill_on_a_model_without_fim_tokens_says_which_are_missing(server):
    e = error_of(http(server.url + "/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX}), 501)
    assert e["type"] == "not_supported_error"
    assert "pre, suf, mid" in e["message"]


# -- the format's budgets and orders, on a vocabulary of single characters --------

class _CharModel:
    """Each character a token (its code point); FIM ids from `fim`."""

    def __init__(self, fim: dict[str, int], add_bos: bool = False):
        self._native = type("N", (), {"fim_ids": fim, "add_bos": add_bos, "bos_id": 1})()

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return [ord(c) for c in text]


def _ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_infill_prompt_keeps_the_prefix_end_and_the_suffix_start_within_a_batch():
    model = _CharModel({"pre": -1, "suf": -2, "mid": -3})
    req = wire.InfillRequest(input_prefix="p" * 30 + "END", input_suffix="START" + "s" * 30, prompt="mm")
    got = infill_prompt(model, req, batch=16, n_predict=4, n_ctx=64, spm=False)
    # 3/4 of the batch for the prefix (its last 12), 16/4 - (2 + 2) = 0 for the suffix.
    assert got == [-1, *_ids("p" * 9 + "END"), *_ids("mm"), -2, -3]
    req.prompt = ""
    got = infill_prompt(model, req, batch=32, n_predict=4, n_ctx=64, spm=True)
    # The suffix's part first: its first 32/4 - 2 = 6.
    assert got == [-2, *_ids("START" + "s"), -1, *_ids("p" * 21 + "END"), -3]


def test_infill_prompt_puts_extra_chunks_first_and_keeps_their_end():
    model = _CharModel({"pre": -1, "suf": -2, "mid": -3}, add_bos=True)
    req = wire.InfillRequest(input_prefix="a", input_suffix="b",
                             input_extra=[wire.InfillChunk(text="one"), wire.InfillChunk(text="two")])
    sep = "\n\n--- snippet ---\n\n"
    whole = _ids(sep + "one" + sep + "two")
    got = infill_prompt(model, req, batch=16, n_predict=4, n_ctx=200, spm=False)
    assert got == whole + [1, -1, *_ids("a"), -2, *_ids("b"), -3]
    # Room for the extra is the context less the batch and twice the reply: its last 10 tokens.
    got = infill_prompt(model, req, batch=16, n_predict=5, n_ctx=36, spm=False)
    assert got[:10] == whole[-10:] and got[10] == 1


# -- n_indent and t_max_predict_ms --------------------------------------------------

LINES = 'root ::= "a\\n  b\\n    c\\nd\\n"'


@pytest.mark.parametrize("n_indent, text", [(0, "a\n  b\n    c\nd\n"), (1, "a\n  b\n    c\n"), (2, "a\n  b\n    c\n"),
                                             (3, "a\n  ")])
@pytest.mark.parametrize("stream", [False, True])
def test_n_indent_ends_the_text_at_a_line_indented_less(server, n_indent, text, stream):
    """The cut line's text is never sent, streamed or not; the end is a limit, as llama-server's."""
    body = {"prompt": "Hi", "grammar": LINES, "n_predict": 32, "temperature": 0, "n_indent": n_indent,
            "stream": stream}
    status, _, raw = http(server.url + "/completion", body)
    assert status == 200, raw
    final = sse(raw)[-1] if stream else json.loads(raw)
    content = "".join(e["content"] for e in sse(raw)) if stream else final["content"]
    assert content == text
    assert final["stop_type"] == ("eos" if n_indent == 0 else "limit")


def test_n_indent_holds_on_the_chat_route_too(server):
    r = post_ok(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "grammar": LINES,
                                                 "max_tokens": 32, "temperature": 0, "n_indent": 3})
    assert r["choices"][0]["message"]["content"] == "a\n  " and r["choices"][0]["finish_reason"] == "length"


def test_t_max_predict_ms_ends_the_text_at_a_newline_after_the_time(server):
    many = 'root ::= ("line\\n")+'
    ask = {"prompt": "Hi", "grammar": many, "n_predict": 24, "temperature": 0}
    whole = post_ok(server, "/completion", ask)
    assert whole["content"].count("\n") >= 4
    # A token takes well over a millisecond: the first newline after the first token ends it.
    r = post_ok(server, "/completion", {**ask, "t_max_predict_ms": 1})
    assert r["content"] == "line\n" and r["stop_type"] == "limit"
    # At its off value (0, or less), no limit.
    assert post_ok(server, "/completion", {**ask, "t_max_predict_ms": 0})["content"] == whole["content"]


@pytest.mark.parametrize("body, param", [({"n_indent": -1}, "n_indent"),
                                         ({"t_max_predict_ms": "soon"}, "t_max_predict_ms")])
def test_line_rules_refuse_bad_values_by_name(server, body, param):
    e = error_of(http(server.url + "/completion", {"prompt": "Hi", "n_predict": 2, **body}), 400)
    assert param in e["message"]


@pytest.mark.parametrize("pieces", [["a\n  b\nc"], ["a", "\n", " ", " b", "\n", "c"], ["a\n ", " b\n", "c"]])
def test_line_rules_hold_a_line_while_it_is_indenting(pieces):
    rules = LineRules(n_indent=2)
    shown, ended = [], False
    for p in pieces:
        out, ended = rules.push(p, 0.0)
        shown.append(out)
        if ended:
            break
    assert ended and "".join(shown) == "a\n  b\n"
    # While the line is only indentation, that indentation is held back.
    rules = LineRules(n_indent=2)
    assert rules.push("x\n ", 0.0) == ("x\n", False)
    assert rules.flush() == " "


# -- samplers: llama-server's chain, as editor plugins name it ----------------------

def test_a_named_chain_runs_its_stages_and_reports_them(server):
    ask = {"prompt": "The best way to learn is", "n_predict": 16, "seed": 3, "temperature": 0}
    greedy = post_ok(server, "/completion", ask)["content"]
    # Without "temperature" in the chain, a temperature of 0 is not applied: the draw is at 1.
    named = post_ok(server, "/completion", {**ask, "samplers": ["top_k", "top_p"]})
    assert named["content"] != greedy
    assert named["generation_settings"]["samplers"] == ["top_k", "top_p"]
    # The same chain by its letters, and the idle stages (DRY, XTC, top-n-sigma at their off values) left out.
    assert post_ok(server, "/completion", {**ask, "samplers": "dkpx"})["content"] == named["content"]
    # With it, greedy again.
    assert post_ok(server, "/completion", {**ask, "samplers": ["top_k", "temperature"]})["content"] == greedy
    assert post_ok(server, "/completion", ask)["generation_settings"]["samplers"] == [
        "penalties", "top_k", "typ_p", "top_p", "min_p", "temperature"]


def test_the_server_s_chain_is_every_request_s_default(smollm2_path):
    with ServerProcess(smollm2_path, "--sampler-seq", "kt") as s:
        ask = {"prompt": "The best way to learn is", "n_predict": 8, "seed": 3}
        r = post_ok(s, "/completion", ask)
        assert r["generation_settings"]["samplers"] == ["top_k", "temperature"]
        assert post_ok(s, "/completion", {**ask, "samplers": ["top_k", "top_p"]})["generation_settings"][
            "samplers"] == ["top_k", "top_p"]


def test_an_editor_plugin_s_infill_request_is_served(fim_server):
    """The body llama.vim sends (its sampler chain ends in llama.cpp's infill
    sampler, and it asks for a few fields of the result)."""
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": EXTRA, "prompt": MIDDLE,
            "n_predict": 16, "n_indent": 4, "top_k": 40, "top_p": 0.90, "samplers": ["top_k", "top_p", "infill"],
            "stream": False, "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1000,
            "response_fields": ["content", "timings/prompt_n", "timings/predicted_n", "tokens_cached",
                                "truncated"]}
    r = post_ok(fim_server, "/infill", body)
    assert set(r) == {"content", "timings/prompt_n", "timings/predicted_n", "tokens_cached", "truncated"}
    assert 1 <= r["timings/predicted_n"] <= 16


@pytest.mark.parametrize("samplers, says", [
    (["top_k", "mirostat"], "no sampler is named 'mirostat'"),
    ("kq", "no sampler has the letter 'q'"),
    (["top_k", "penalties"], "only first"),
    (["infill", "top_k"], "needs top_k"),
    (["adaptive_p"], "adaptive"),
    (7, "expected a list"),
])
def test_a_chain_ember_cannot_run_is_refused_by_name(server, samplers, says):
    e = error_of(http(server.url + "/completion", {"prompt": "Hi", "n_predict": 2, "samplers": samplers}), 400)
    assert e["param"] == "samplers" and says in e["message"]


def test_the_infill_sampler_needs_a_bounded_top_k(server):
    e = error_of(http(server.url + "/completion", {"prompt": "Hi", "n_predict": 2, "top_k": 0,
                                                   "samplers": ["top_k", "infill"]}), 400)
    assert e["param"] == "samplers"
