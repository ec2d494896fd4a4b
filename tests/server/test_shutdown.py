"""The server's end (`ember.server.cli.serve`, the engine's close): on
SIGTERM, new requests are refused at once, requests in flight finish within
`--shutdown-timeout`, and what still runs then ends with an error in its
route's own shape and a log line saying the shutdown cut it; exit 0."""

from __future__ import annotations

import json
import signal
import threading
import time

from server_process import ServerProcess, http, sse

CHAT = [{"role": "user", "content": "Tell me a long story."}]


def _in_thread(fn):
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(reply=fn()))
    t.start()
    return t, out


def test_sigterm_lets_short_replies_finish_and_cuts_long_ones(smollm2_path):
    with ServerProcess(smollm2_path, "-np", "4", "--shutdown-timeout", "2", ctx=4096) as s:
        short = {"messages": CHAT, "max_tokens": 8, "temperature": 0}
        long = {"messages": CHAT, "max_tokens": 900, "ignore_eos": True, "temperature": 0}
        threads = [_in_thread(lambda: http(s.url + "/v1/chat/completions", short)),
                   _in_thread(lambda: http(s.url + "/v1/chat/completions", {**long, "stream": True})),
                   _in_thread(lambda: http(s.url + "/v1/messages", {
                       "messages": CHAT, "max_tokens": 900, "ignore_eos": True, "stream": True})),
                   _in_thread(lambda: http(s.url + "/v1/chat/completions", long))]
        time.sleep(1.5)  # all three placed and drawing
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        status, _, _ = http(s.url + "/v1/chat/completions", short)
        assert status == 503  # new work refused at once
        for t, _ in threads:
            t.join(30)
        assert s.proc.wait(30) == 0 and time.monotonic() - t0 < 15
        (short_reply, chat_stream, messages_stream, whole) = (out["reply"] for _, out in threads)
        assert short_reply[0] == 200 and json.loads(short_reply[2])["choices"][0]["finish_reason"] == "length"
        events = sse(chat_stream[2])
        assert chat_stream[0] == 200 and "shutting down" in json.dumps(events[-1]), events[-3:]
        assert b"event: error" in messages_stream[2] and b"shutting down" in messages_stream[2]
        assert whole[0] == 503 and b"shutting down" in whole[2]  # a whole reply cut is answered, not dropped
        log = "\n".join(s.lines)
        assert log.count("cut by the shutdown") == 3, log[-2000:]
        assert "client gone" not in log
