"""Checkpoints of a hybrid's recurrent states, served: the tiny random-weight
qwen35 (tests/fixtures/make_tiny_models.py) under Qwen3.5's own chat
template, which rewrites a reply once it is history (its thought is
dropped), so every turn's prompt parts from what the slot holds a few
tokens before the last prompt's end. A slot keeps copies of its state
where the next turn will part (the chat layer renders that turn to find
it), where a prompt parted from the one before, and every so many
positions; a prompt that parts resumes from the newest copy before the
parting. The counts the clients see (`usage.prompt_tokens_details.
cached_tokens`, llama-server's `timings`) are held to exactly that."""

from __future__ import annotations

import json
import sys

import openai
import pytest

from paths import FIXTURES
from server_process import ServerProcess, http, post_ok

sys.path.insert(0, str(FIXTURES))
import make_tiny_models  # noqa: E402

TEMPLATE = FIXTURES / "Qwen3.5-4B.chat_template.jinja"


@pytest.fixture(scope="module")
def model_path():
    return make_tiny_models.ensure("qwen35")


def serve(model_path, *extra: str) -> ServerProcess:
    return ServerProcess(model_path, "-np", "1", "--chat-template-file", str(TEMPLATE), *extra, ctx=4096)


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def prompt_ids(server, messages: list[dict]) -> list[int]:
    """The prompt a chat request becomes, as the server's own routes give it."""
    text = post_ok(server, "/apply-template", {"messages": messages})["prompt"]
    return post_ok(server, "/tokenize", {"content": text, "add_special": True, "parse_special": True})["tokens"]


def shared(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def conversation(turns: int) -> list[dict]:
    msgs: list[dict] = [{"role": "system", "content": "You are a terse assistant for a village of five."}]
    for i in range(turns):
        msgs.append({"role": "user", "content": f"Question {i}: what does the miller say about the weather today?"})
        msgs.append({"role": "assistant", "content": f"Answer {i}: rain by noon, says the miller."})
    return msgs


def test_ten_turns_each_read_only_their_new_tokens(model_path):
    """From the second turn on, a turn reads only what follows where it parts
    from the turn before (the reply, the new question, the generation
    prompt): the checkpoint the last turn's read took there is restored."""
    with serve(model_path) as s:
        c = client(s)
        messages = [{"role": "system", "content": "You are a terse assistant."}]
        before = None
        for turn in range(10):
            messages.append({"role": "user", "content": f"Turn {turn}: what comes after {turn}?"})
            ids = prompt_ids(s, messages)
            r = c.chat.completions.create(model="m", messages=messages, max_tokens=4, temperature=0)
            usage, timings = r.usage, r.model_extra["timings"]
            assert usage.prompt_tokens == len(ids)
            if before is not None:
                parting = shared(before, ids)
                assert 0 < parting < len(before), "the template was expected to rewrite the reply's turn"
                assert usage.prompt_tokens_details.cached_tokens == parting, (turn, timings)
                assert timings["prompt_n"] == len(ids) - parting, (turn, timings)
            messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})
            before = ids
        assert s.saw("restored the checkpoint at ")
        assert s.saw("(where the next turn parts)")


def test_without_checkpoints_every_turn_reads_from_zero(model_path):
    with serve(model_path, "--ctx-checkpoints", "0") as s:
        c = client(s)
        messages = [{"role": "user", "content": "Turn 0?"}]
        r = c.chat.completions.create(model="m", messages=messages, max_tokens=3, temperature=0)
        messages += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                     {"role": "user", "content": "Turn 1?"}]
        r = c.chat.completions.create(model="m", messages=messages, max_tokens=3, temperature=0)
        assert r.usage.prompt_tokens_details.cached_tokens == 0
        assert s.saw("no checkpoint at or before it, read from the start")
        assert s.saw("checkpoints: none (--ctx-checkpoints 0)")


def test_an_edited_earlier_message_reads_from_the_newest_checkpoint_before_it():
    """Six turns, then the third question edited: the read resumes from the
    checkpoint the second turn took (where the third turn parted from it),
    not from zero, and the answer is a fresh server's on the same prompt (in
    f32 weights, to 1e-4 in every log-probability: the resumed read sums the
    delta rule's chunk around that checkpoint in two parts)."""
    f32 = make_tiny_models.ensure("qwen35f32")
    history = conversation(6)
    edited = [dict(m) for m in history] + [{"role": "user", "content": "And tomorrow?"}]
    edited[5]["content"] = "Question 2: what does the baker say about the bread today?"
    with serve(f32) as s:
        c = client(s)
        turns = [history[:1 + 2 * i + 1] for i in range(6)]
        ids = [prompt_ids(s, t) for t in turns]
        for t in turns:
            c.chat.completions.create(model="m", messages=t, max_tokens=2, temperature=0)
        want_resume = shared(ids[1], ids[2])  # where the third turn parted from the second's prompt
        edited_ids = prompt_ids(s, edited)
        assert want_resume < shared(edited_ids, ids[5]) < len(ids[5])
        got = c.chat.completions.create(model="m", messages=edited, max_tokens=4, temperature=0, logprobs=True,
                                        top_logprobs=3)
        assert got.usage.prompt_tokens_details.cached_tokens == want_resume
        status, _, raw = http(s.url + "/slots")
        held = json.loads(raw)[0]["checkpoints"]["held"]
        assert {"pos": want_resume, "taken": "where the next turn parts"} in held
    with serve(f32) as fresh:
        want = client(fresh).chat.completions.create(model="m", messages=edited, max_tokens=4, temperature=0,
                                                     logprobs=True, top_logprobs=3)
        assert want.usage.prompt_tokens_details.cached_tokens == 0
    a, b = got.choices[0].logprobs.content, want.choices[0].logprobs.content
    assert [t.token for t in a] == [t.token for t in b]
    for x, y in zip(a, b):
        assert abs(x.logprob - y.logprob) < 1e-4
        for p, q in zip(x.top_logprobs, y.top_logprobs):
            assert p.token == q.token and abs(p.logprob - q.logprob) < 1e-4


SHEET = [1] + [(i * 53 + 7) % 1400 + 30 for i in range(300)]


def village(server, rounds: int) -> list[dict]:
    """golem's village on one slot: five characters, each asked a prompt that
    starts with the same long sheet and then says what is happening now,
    which is new every time."""
    timings = []
    for r in range(rounds):
        for who in range(5):
            now = [(who * 97 + r * 31 + i * 13) % 1400 + 40 for i in range(24)]
            status, _, raw = http(server.url + "/completion", {"prompt": SHEET + now, "n_predict": 3,
                                                               "temperature": 0, "cache_prompt": True})
            assert status == 200, raw
            timings.append(json.loads(raw)["timings"])
    return timings


def test_the_village_reads_each_later_turn_from_where_the_sheet_ends(model_path):
    with serve(model_path, "--ctx-checkpoints-interval", "0") as s:
        t = village(s, 2)
        assert s.saw("restored the checkpoint at 301 (where a prompt parted)")
    assert t[0]["cache_n"] == 0
    # The second character parts where the sheet ends: no checkpoint there
    # yet, so it reads from zero, and takes one.
    assert t[1]["cache_n"] == 0
    for later in t[2:]:
        assert later["cache_n"] == len(SHEET) and later["prompt_n"] == 24, later
    with serve(model_path, "--ctx-checkpoints", "0") as s:
        assert all(x["cache_n"] == 0 for x in village(s, 1)[1:])


def test_the_start_line_gives_a_checkpoints_size_and_cuts_the_count_to_the_budget(model_path):
    """Every slot's checkpoints come out of the host prompt cache's budget: a
    budget of 1 MiB holds 31 per slot of the tiny model's two slots, not the
    32 asked, and the start line says so and why."""
    with ServerProcess(model_path, "-np", "2", "--cache-ram", "1") as s:
        status, _, raw = http(s.url + "/slots")
        slots = json.loads(raw)
        each = slots[0]["recurrent_state_bytes"]
        fits = 2**20 // (2 * each)
        assert 0 < fits < 32, each
        assert all(sl["checkpoints"]["max"] == fits for sl in slots)
        assert s.saw(f"checkpoints: up to {fits} per slot, not the 32 asked: 32 per slot would take "
                     f"{32 * 2 * each / 2**20:.1f} MiB, more than the host prompt cache's 1 MiB")
        assert s.saw(f"{each / 1024:.1f} KiB each (a slot's recurrent states)")


def test_checkpoints_granted_count_against_the_budget_and_the_free_memory():
    from ember.engine import Checkpoints

    asked = Checkpoints(count=32, free_bytes=10 * 2**30)
    assert asked.granted(2**20, 4, 8 * 2**30) == (asked, None)
    cut, why = asked.granted(2**20, 4, 64 * 2**20)
    assert cut.count == 16 and "more than the host prompt cache's 64 MiB" in why
    # With no budget (the host cache off) or none to speak of (no limit), half the free memory bounds them.
    for budget in (0, 2**62):
        cut, why = Checkpoints(count=32, free_bytes=2**30).granted(2**20, 64, budget)
        assert cut.count == 8 and "half the free memory (1024 MiB)" in why
    assert Checkpoints(count=0).granted(2**20, 4, 0) == (Checkpoints(count=0), None)
