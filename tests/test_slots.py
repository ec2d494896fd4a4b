"""Slots and the prompt cache as a client sees them: a conversation sent whole
every turn through the official OpenAI client pays only for its new part, on
both test models (Gemma 3 has sliding-window layers); a client that hangs up
while queued never reaches a slot; each request's log line names its slot."""

from __future__ import annotations

import json
import re
import threading
import time

import openai
import pytest

from server_process import ServerProcess, error_of, http


@pytest.mark.parametrize("which", ["smollm2_path", "gemma3_path"])
def test_ten_turns_read_only_their_new_tokens(which, request):
    path = request.getfixturevalue(which)
    with ServerProcess(path, "-np", "2", ctx=4096) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "Let us talk about lighthouses."}]
        prev_prompt = None
        for turn in range(10):
            r = client.chat.completions.create(model="any", messages=messages, max_tokens=8, temperature=0)
            usage, timings = r.usage, r.model_extra["timings"]
            assert timings["prompt_n"] + timings["cache_n"] == usage.prompt_tokens
            if prev_prompt is not None:
                # Everything the last turn's prompt held is reused; what is read
                # is what this turn added (the answer as the template writes it,
                # and the new question), nothing before it.
                assert usage.prompt_tokens_details.cached_tokens >= prev_prompt, (turn, usage, timings)
                assert timings["prompt_n"] <= usage.prompt_tokens - prev_prompt, (turn, usage, timings)
            prev_prompt = usage.prompt_tokens
            messages += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                         {"role": "user", "content": f"Tell me one more thing, number {turn + 2}."}]


def test_a_client_gone_while_queued_never_reaches_a_slot(smollm2_path):
    with ServerProcess(smollm2_path, "-np", "1", "-n", "200") as s:
        busy = threading.Thread(target=http, args=(s.url + "/completion",
                                                   {"prompt": "Once upon a time", "n_predict": 200, "ignore_eos": True}))
        busy.start()
        time.sleep(0.3)
        # A queued request whose client gives up before a slot frees.
        with pytest.raises(Exception):
            import urllib.request

            req = urllib.request.Request(s.url + "/completion", data=b'{"prompt": "queued and gone", "n_predict": 4}',
                                         headers={"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=0.3)
        busy.join(120)
        # The server is still serving, and the abandoned request never ran.
        status, _, _ = http(s.url + "/completion", {"prompt": "after", "n_predict": 2})
        assert status == 200
        time.sleep(0.3)
        log = "\n".join(s.lines)
        served = [l for l in log.splitlines() if "POST /completion" in l]
        assert any(re.search(r"\b499\b|client gone", l) for l in served), served
        assert not any("client gone" in l and "drawn" in l and " 0 drawn" not in l for l in served), served
        assert all(re.search(r"slot \d", l) for l in served if " 200 " in l), served


def test_slots_list_save_erase_restore(smollm2_path, tmp_path):
    with ServerProcess(smollm2_path, "-np", "2", "--slot-save-path", str(tmp_path)) as s:
        prompt = "The lighthouse keeper climbed the stairs every evening to light the lamp. " * 3
        status, _, body = http(s.url + "/completion", {"prompt": prompt, "n_predict": 4, "temperature": 0})
        assert status == 200, body
        status, _, body = http(s.url + "/slots")
        assert status == 200
        listed = json.loads(body)
        assert [x["id"] for x in listed] == [0, 1]
        assert all(x["n_ctx"] == 1024 and not x["is_processing"] and x["prompt"] == "" for x in listed)
        used = next(x for x in listed if x["n_cached_tokens"] > 0)
        sid, held = used["id"], used["n_cached_tokens"]
        assert prompt not in body.decode(), "never another client's text"

        status, _, body = http(f"{s.url}/slots/{sid}?action=save", {"filename": "keeper.bin"})
        saved = json.loads(body)
        assert status == 200 and saved["id_slot"] == sid and saved["n_saved"] == held, saved
        assert (tmp_path / "keeper.bin").stat().st_size == saved["n_written"]
        status, _, body = http(f"{s.url}/slots/{sid}?action=erase", {})
        assert status == 200 and json.loads(body) == {"id_slot": sid, "n_erased": held}
        status, _, body = http(f"{s.url}/slots/{sid}?action=restore", {"filename": "keeper.bin"})
        restored = json.loads(body)
        assert status == 200 and restored["n_restored"] == held, restored
        # The restored slot serves a continuation from its cache.
        status, _, body = http(s.url + "/completion", {"prompt": prompt + " Then", "n_predict": 2, "temperature": 0})
        assert json.loads(body)["timings"]["cache_n"] >= held - 4

        for path, payload, code, needle in [
            (f"/slots/{sid}?action=save", {"filename": "../escape.bin"}, 400, "filename"),
            (f"/slots/{sid}?action=save", {"filename": "a/b"}, 400, "filename"),
            (f"/slots/{sid}?action=restore", {"filename": "missing.bin"}, 400, "missing.bin"),
            (f"/slots/{sid}?action=dance", {}, 400, "action"),
            ("/slots/7?action=erase", {}, 400, "no slot"),
        ]:
            e = error_of(http(s.url + path, payload), code)
            assert needle in e["message"], (path, e)
        (tmp_path / "junk.bin").write_bytes(b"junk")
        e = error_of(http(f"{s.url}/slots/{sid}?action=restore", {"filename": "junk.bin"}), 400)
        assert "not a saved slot" in e["message"]
        assert not (tmp_path.parent / "escape.bin").exists()


def test_slot_files_need_a_save_path(smollm2_path):
    with ServerProcess(smollm2_path) as s:
        e = error_of(http(s.url + "/slots/0?action=save", {"filename": "x.bin"}), 501)
        assert "--slot-save-path" in e["message"]


def test_the_host_cache_brings_a_conversation_back(smollm2_path):
    """One slot, two alternating conversations: each comes back from host
    memory (--cache-ram) instead of being read again; with it off, it is read."""
    a = "Conversation A is about the tides, the moon and the harbour master. " * 3
    b = "Conversation B is about bread, ovens and the baker's early mornings. " * 3
    for flags, reused in ((["--cache-ram", "64"], True), (["--cache-ram", "0"], False)):
        with ServerProcess(smollm2_path, "-np", "1", *flags) as s:
            for prompt in (a, b):
                assert http(s.url + "/completion", {"prompt": prompt, "n_predict": 2})[0] == 200
            status, _, body = http(s.url + "/completion", {"prompt": a + " More", "n_predict": 2})
            t = json.loads(body)["timings"]
            assert status == 200 and (t["cache_n"] >= 30) == reused, (flags, t)
