"""llama-server's flags that ember honours beyond the basics, through a real
server: sampling defaults (-s, --temp, --top-k, ...), --chat-template by
name, --system-prompt-file, --no-slots, -b/-ub, -sps, HTTPS, and /health as
llama-server answers it."""

from __future__ import annotations

import json
import queue
import re
import shutil
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from ember.chat_template import NAMED, render_chat
from ember.server.cli import OptionError, _sampling_defaults, parse_options
from paths import ROOT
from server_process import ServerProcess, http, post_ok

BIG_MEM = 64 * 2**30
SYSTEM = "You are terse."
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    system = tmp_path_factory.mktemp("sys") / "system.txt"
    system.write_text(SYSTEM, encoding="utf-8")
    with ServerProcess(smollm2_path, "--temp", "0.3", "--top-k", "7", "-s", "42", "--repeat-penalty", "1.2",
                       "--system-prompt-file", str(system), "--chat-template", "llama3", "--no-slots",
                       "-b", "64", "-ub", "128", "-sps", "0.5", "-np", "2", "-v") as s:
        yield s


def test_sampling_flags_are_every_request_s_defaults_and_a_request_s_own_win(server):
    params = json.loads(http(server.url + "/props")[2])["default_generation_settings"]["params"]
    assert (params["temperature"], params["top_k"], params["seed"], params["repeat_penalty"]) == (
        pytest.approx(0.3), 7, 42, pytest.approx(1.2))
    plain = post_ok(server, "/completion", {"prompt": "Hi", "n_predict": 1})["generation_settings"]
    assert (plain["temperature"], plain["top_k"], plain["seed"]) == (pytest.approx(0.3), 7, 42)
    own = post_ok(server, "/completion", {"prompt": "Hi", "n_predict": 1, "temperature": 0.9, "top_k": 3,
                                          "seed": 5})["generation_settings"]
    assert (own["temperature"], own["top_k"], own["seed"]) == (pytest.approx(0.9), 3, 5)
    # The same seed drawn twice at the server's temperature is the same text.
    a, b = (post_ok(server, "/completion", {"prompt": "Once upon a time", "n_predict": 12})["content"]
            for _ in range(2))
    assert a == b


def test_the_named_template_renders_and_the_system_prompt_fills_a_chat_without_one(server):
    text = post_ok(server, "/apply-template", {"messages": HI})["prompt"]
    assert text == render_chat(NAMED["llama3"], [{"role": "system", "content": SYSTEM}, *HI])
    assert text.startswith("<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>")
    own = post_ok(server, "/apply-template", {"messages": [{"role": "system", "content": "Be kind."}, *HI]})
    assert SYSTEM not in own["prompt"] and "Be kind." in own["prompt"]


def test_a_chat_error_in_the_client_s_messages_names_the_client_s_index(server):
    status, _, body = http(server.url + "/v1/chat/completions",
                           {"messages": [*HI, {"role": "assistant", "content": 5}]})
    assert status == 400 and "messages[1]" in json.loads(body)["error"]["message"], body


def test_no_slots_turns_the_slots_list_off(server):
    status, _, body = http(server.url + "/slots")
    assert status == 501 and json.loads(body)["error"]["type"] == "not_supported_error"
    assert "--no-slots" in json.loads(body)["error"]["message"]
    health = json.loads(http(server.url + "/health?include_slots")[2])
    assert "slots" not in health and health["slots_idle"] == 2


def test_health_answers_as_llama_server_s(server):
    assert json.loads(http(server.url + "/health")[2]) == {"status": "ok"}
    status, _, body = http(server.url + "/health?fail_on_no_slot=1")
    assert status == 200 and json.loads(body) == {"status": "ok", "slots_idle": 2, "slots_processing": 0}


def test_batch_sizes_and_slot_similarity_reach_the_engine(server):
    assert any(line.startswith("ember: passes: at most 64 tokens each (-ub), a slot's prompt read at most 64")
               for line in server.lines), server.lines
    assert any("slot choice: a free slot holding 50% of a prompt" in line for line in server.lines)
    # A prompt longer than a pass reads in several and answers as one.
    long = post_ok(server, "/completion", {"prompt": "word " * 200, "n_predict": 1})
    assert long["tokens_evaluated"] > 128


def test_health_with_slots_lists_them(plain_server):
    body = json.loads(http(plain_server.url + "/health?include_slots")[2])
    assert body["status"] == "ok" and body["slots_idle"] == 4 and [s["id"] for s in body["slots"]] == [0, 1, 2, 3]


def test_sampling_defaults_come_from_the_file_then_the_flags():
    lines: list[str] = []
    values = {"temp": None, "top-k": 5, "top-p": None, "min-p": None, "typical": None, "repeat-last-n": None,
              "repeat-penalty": None, "presence-penalty": None, "frequency-penalty": None, "seed": -1,
              "ignore-eos": False, "logit-bias": ["3-inf", "7+1.5"]}
    sources = {k: "the command line" for k in values}
    meta = {"general.sampling.temp": 0.6, "general.sampling.top_k": 20, "general.sampling.top_p": 0.95,
            "general.sampling.mirostat": 2}
    params = _sampling_defaults(values, sources, meta, lines, lambda *a: OptionError(str(a)))
    assert (params.temperature, params.top_k, params.top_p) == (pytest.approx(0.6), 5, pytest.approx(0.95))
    assert params.logit_bias == {3: float("-inf"), 7: 1.5}
    said = [line for line in lines if line.startswith("sampling defaults:")]
    assert said and "from the file: temperature 0.6, top_p 0.95" in said[0] and "--top-k" in said[0], lines
    assert any("recommends mirostat 2: ember has no such sampler" in line for line in lines), lines
    # A chain in any of llama.cpp's spellings; DRY, at its off value, is left out of it.
    params = _sampling_defaults({**values, "samplers": "penalties;Top-K;dry;temp"}, sources, {}, lines,
                                lambda *a: OptionError(str(a)))
    assert params.samplers == ["penalties", "top_k", "temperature"]
    assert "samplers penalties;top_k;temperature" in lines[-1]


@pytest.mark.parametrize("argv, refused", [
    (["--temp", "-1"], "--temp -1.0: must be >= 0"),
    (["--top-p", "2"], "--top-p 2.0:"),
    (["-l", "15x1"], "--logit-bias '15x1': expected TOKEN_ID+BIAS"),
    (["--chat-template", "vicuna"], "--chat-template vicuna: is neither a built-in template's name"),
    (["-sps", "1.5"], "--slot-prompt-similarity 1.5: must be between 0.0 and 1.0"),
    (["-ub", "0"], "--ubatch-size 0: must be at least 1"),
    (["--ssl-key-file", "k.pem"], "--ssl-cert-file: HTTPS needs both"),
    (["--samplers", "top_k;bogus"], "--samplers top_k;bogus: no sampler is named 'bogus'"),
    (["--sampler-seq", "kq"], "--sampler-seq kq: no sampler has the letter 'q'"),
    (["--samplers", "top_k;infill", "--top-k", "0"], "--samplers top_k;infill: the infill sampler"),
    (["--samplers", "top_k", "--sampler-seq", "k"], "--sampler-seq k: give one of --samplers and --sampler-seq"),
])
def test_bad_values_of_the_honoured_flags_are_refused_by_name(argv, refused, smollm2_path):
    with pytest.raises(OptionError) as e:
        parse_options(["-m", str(smollm2_path), *argv], {}, mem_available=BIG_MEM)
    assert str(e.value).startswith(refused), e.value


_NAMED_EXPECTED = {
    # As llama.cpp's llama-chat.cpp writes each built-in template.
    "llama2": "[INST] S\nhi [/INST]yo</s>[INST] again [/INST]",
    "mistral-v7": "[SYSTEM_PROMPT] S[/SYSTEM_PROMPT][INST] hi[/INST] yo</s>[INST] again[/INST]",
    "phi3": "<|system|>\nS<|end|>\n<|user|>\nhi<|end|>\n<|assistant|>\nyo<|end|>\n<|user|>\nagain<|end|>\n"
            "<|assistant|>\n",
    "zephyr": "<|system|>\nS<|endoftext|>\n<|user|>\nhi<|endoftext|>\n<|assistant|>\nyo<|endoftext|>\n<|user|>\n"
              "again<|endoftext|>\n<|assistant|>\n",
    "command-r": "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>S<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>hi"
                 "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>yo<|END_OF_TURN_TOKEN|>"
                 "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>again<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
                 "<|CHATBOT_TOKEN|>",
    "llama3": "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>"
              "\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nyo<|eot_id|><|start_header_id|>"
              "user<|end_header_id|>\n\nagain<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
}


@pytest.mark.parametrize("name", sorted(_NAMED_EXPECTED))
def test_named_templates_write_what_llama_cpp_s_built_ins_write(name):
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"}, {"role": "user", "content": "again"}]
    assert render_chat(NAMED[name], chat, add_generation_prompt=True) == _NAMED_EXPECTED[name]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl to make a certificate with")
def test_https_with_a_certificate_and_its_key(smollm2_path, tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=localhost", "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    proc = subprocess.Popen([sys.executable, "-m", "ember", "serve", "-m", str(smollm2_path), "--port", "0", "-c",
                             "256", "--ssl-key-file", str(key), "--ssl-cert-file", str(cert)],
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stderr], daemon=True).start()
    try:
        url = None
        while url is None:
            line = lines.get(timeout=60)
            m = re.search(r"listening on (https://\S+)", line)
            url = m.group(1) if m else None
        trusting = ssl.create_default_context(cafile=str(cert))
        trusting.check_hostname = False
        for _ in range(600):  # the model loads behind the listening socket
            try:
                urllib.request.urlopen(url + "/health", context=trusting, timeout=30)
                break
            except urllib.error.HTTPError as e:
                assert e.code == 503
                time.sleep(0.1)
        with urllib.request.urlopen(url + "/v1/models", context=trusting, timeout=60) as r:
            assert r.status == 200 and json.loads(r.read())["object"] == "list"
        with pytest.raises(urllib.error.URLError) as refused:  # a client that does not trust it is refused
            urllib.request.urlopen(url + "/health", timeout=30)
        assert isinstance(refused.value.reason, ssl.SSLCertVerificationError), refused.value
    finally:
        proc.terminate()
        proc.wait(30)


def _ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_several_addresses_aliases_tags_and_local_origins(smollm2_path, tmp_path):
    """llama-server's newer spellings: --host a list (and a UNIX socket),
    -a a list of names (the id the first in sorted order), --tags, and
    --cors-origins localhost (any page of this machine, no other)."""
    import socket

    sock = tmp_path / "ember.sock"
    hosts = ["127.0.0.1", *(["::1"] if _ipv6_loopback() else []), str(sock)]
    with ServerProcess(smollm2_path, "--host", ",".join(hosts), "-a", "tiny, code,fim", "--tags", "small,chat",
                       "--cors-origins", "localhost") as s:
        port = s.url.rsplit(":", 1)[1]
        entry = json.loads(http(s.url + "/v1/models")[2])["data"][0]
        assert (entry["id"], entry["aliases"], entry["tags"]) == ("code", ["code", "fim", "tiny"], ["chat", "small"])
        if "::1" in hosts:
            assert http(f"http://[::1]:{port}/health")[0] == 200
        with socket.socket(socket.AF_UNIX) as c:
            c.connect(str(sock))
            c.sendall(b"GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n")
            assert c.recv(4096).split(b"\r\n", 1)[0].endswith(b" 200 OK")
        for origin in ("http://localhost", "http://127.0.0.1:3000", "https://[::1]:8443"):
            status, headers, _ = http(s.url + "/v1/chat/completions", method="OPTIONS",
                                      headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
            assert status == 200 and headers["Access-Control-Allow-Origin"] == origin, origin
        for origin in ("http://localhost.evil.example", "http://notlocalhost", "http://evil.example"):
            status, headers, _ = http(s.url + "/v1/chat/completions", method="OPTIONS",
                                      headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
            assert status == 200 and "Access-Control-Allow-Origin" not in headers, origin
    assert any("model names: code, fim, tiny, the id code" in line for line in s.lines)


@pytest.mark.parametrize("argv, refused", [
    (["--host", " , "], "--host"), (["-a", ","], "--alias"), (["--cors-origins", "localhost,null"], "null"),
    (["--cors-origins", "http://a.example/path"], "no path"), (["--host", "0.0.0.0,127.0.0.1"], "no API key"),
])
def test_bad_lists_are_refused_by_name(argv, refused, smollm2_path):
    with pytest.raises(OptionError, match=refused):
        parse_options(["-m", str(smollm2_path), *argv], {}, mem_available=BIG_MEM)


def test_verbose_replies_carry_llama_server_s_debug_object(server, plain_server):
    """`__verbose`: the reply as llama-server's /completion gives it, with the
    prompt as the model read it; every reply under -v, on request without."""
    chat = {"messages": [{"role": "system", "content": "Book"}, {"role": "user", "content": "best book?"}],
            "max_tokens": 2}
    body = post_ok(server, "/v1/chat/completions", chat)
    v = body["__verbose"]
    assert v["prompt"].startswith("<|start_header_id|>system<|end_header_id|>\n\nBook<|eot_id|>"), v["prompt"]
    assert v["tokens_predicted"] == body["usage"]["completion_tokens"] and v["stop_type"] == "limit"
    assert v["content"] == body["choices"][0]["message"]["content"]
    assert "__verbose" not in post_ok(server, "/v1/chat/completions", {**chat, "verbose": False})
    assert "__verbose" not in post_ok(plain_server, "/v1/chat/completions", chat)
    asked = post_ok(plain_server, "/v1/completions", {"prompt": "Once upon", "max_tokens": 2, "verbose": True})
    assert asked["__verbose"]["prompt"] == "Once upon" and asked["__verbose"]["tokens_evaluated"] == 2
    assert any(line.startswith("ember: replies carry __verbose (-v)") for line in server.lines)


def test_no_cache_prompt_reads_every_prompt_again_unless_a_request_asks(smollm2_path):
    body = {"prompt": "The lighthouse keeper counted the steps of the spiral stair", "n_predict": 2,
            "temperature": 0}
    with ServerProcess(smollm2_path, "-np", "1", "--no-cache-prompt") as s:
        assert any("prompt reuse: off unless a request says cache_prompt: true" in line for line in s.lines)
        for _ in range(2):
            status, _, raw = http(s.url + "/completion", body)
            assert status == 200 and json.loads(raw)["timings"]["cache_n"] == 0, raw
        http(s.url + "/completion", {**body, "cache_prompt": True})
        status, _, raw = http(s.url + "/completion", {**body, "cache_prompt": True})
        assert status == 200 and json.loads(raw)["timings"]["cache_n"] > 0, raw


def test_no_prefill_assistant_opens_a_new_turn_after_the_assistants_words(smollm2_path):
    said = [{"role": "user", "content": "Name a book"}, {"role": "assistant", "content": "Whill"}]
    with ServerProcess(smollm2_path, "--no-prefill-assistant") as s:
        def prompt(body):
            status, _, raw = http(s.url + "/apply-template", body)
            assert status == 200, raw
            return json.loads(raw)["prompt"]

        assert prompt({"messages": said}).endswith("Whill<|im_end|>\n<|im_start|>assistant\n")
        # A request that asks to continue them still does, and two of the assistant's turns may end it.
        assert prompt({"messages": said, "continue_final_message": True,
                       "add_generation_prompt": False}).endswith("<|im_start|>assistant\nWhill")
        twice = [*said, {"role": "assistant", "content": "Again"}]
        assert prompt({"messages": twice}).endswith("Again<|im_end|>\n<|im_start|>assistant\n")
        status, _, raw = http(s.url + "/v1/chat/completions", {"messages": said, "max_tokens": 2, "verbose": True})
        assert status == 200 and json.loads(raw)["__verbose"]["prompt"].endswith("<|im_start|>assistant\n"), raw
