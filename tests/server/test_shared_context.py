"""`-kvu`: slots sharing one context (`ember_model::batch::Batcher::new_unified`,
whose rules the Rust batcher tests hold), as a server answers with it: one
conversation may hold more than a slot's share, several run together, and
/slots reports the context each may reach."""

from __future__ import annotations

import json
import threading

import pytest

from server_process import ServerProcess, error_of, http

LONG = "The lighthouse keeper counted the steps of the spiral stair, one by one, every night. " * 8


@pytest.fixture(scope="module")
def shared(smollm2_path):
    with ServerProcess(smollm2_path, "-np", "2", "-kvu", ctx=256) as s:
        yield s


def _completion(url: str, n: int) -> dict:
    status, _, out = http(url + "/completion", {"prompt": LONG, "n_predict": n, "temperature": 0, "ignore_eos": True})
    assert status == 200, out
    return json.loads(out)


def test_a_conversation_may_hold_more_than_a_slots_share(shared, smollm2_path):
    r = _completion(shared.url, 8)
    assert 128 < r["tokens_evaluated"] < 240 and r["tokens_predicted"] == 8
    # Without -kvu, each of the two slots holds 128 positions: the same prompt is refused.
    with ServerProcess(smollm2_path, "-np", "2", ctx=256) as cut:
        e = error_of(http(cut.url + "/completion", {"prompt": LONG, "n_predict": 8}), 400)
        assert "exceeds the available context size" in e["message"]
    slots = json.loads(http(shared.url + "/slots", method="GET")[2])
    assert [s["n_ctx"] for s in slots] == [256, 256]
    assert any("sharing one context of 256 positions" in line for line in shared.lines)


def test_two_conversations_run_together_and_answer_as_alone(shared):
    short = {"prompt": "Once upon a time", "n_predict": 24, "temperature": 0, "ignore_eos": True}
    status, _, out = http(shared.url + "/completion", short)
    want = json.loads(out)["content"]
    got = {}

    def run(key, body):
        got[key] = json.loads(http(shared.url + "/completion", body)[2])

    threads = [threading.Thread(target=run, args=("short", short)),
               threading.Thread(target=run, args=("long", {"prompt": LONG, "n_predict": 8, "temperature": 0}))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got["short"]["content"] == want
    assert got["long"]["tokens_predicted"] == 8


def test_the_default_slots_answer_four_conversations_together(smollm2_path):
    # -np auto (llama-server's default): four slots sharing the context, so four requests run in the
    # same passes, each answered as alone, and one of them may use all of the context.
    with ServerProcess(smollm2_path, ctx=512) as s:
        bodies = [{"prompt": f"Story number {i}: once upon a time", "n_predict": 48, "temperature": 0,
                   "ignore_eos": True} for i in range(4)]
        alone = [json.loads(http(s.url + "/completion", b)[2]) for b in bodies]
        got: dict = {}

        def run(i):
            got[i] = json.loads(http(s.url + "/completion", bodies[i])[2])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [got[i]["content"] for i in range(4)] == [a["content"] for a in alone]
        assert sorted(got[i]["id_slot"] for i in range(4)) == [0, 1, 2, 3], "each in a slot of its own"
        r = _completion(s.url, 8)  # LONG: more than a quarter of the context, in one slot
        assert r["tokens_evaluated"] > 128 and r["tokens_predicted"] == 8
