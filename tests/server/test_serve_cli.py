"""`ember serve` / `ember-server` (`ember.server.cli`): option parsing as a
function, and the process (listening line, signals, exit codes) as a user runs
it. Until the HTTP app exists, the process tests run the real command line
around a stand-in app."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from ember.server.cli import OptionError, kv_bytes_per_position, parse_options
from paths import ROOT

BIG_MEM = 64 * 2**30


def _have_app() -> bool:
    # The app and its route modules land separately; only a whole one is used.
    try:
        from ember.server.app import create_app
        from ember.server.options import ServerOptions

        create_app(ServerOptions())
    except Exception:
        return False
    return True


HAVE_APP = _have_app()

# Runs ember's own entry points with a minimal app put in ember.server.app's
# place; the alias picks its misbehaviour.
STANDIN = r'''
import asyncio, sys, time, types
from aiohttp import web

def create_app(opts, *, log=None):
    app = web.Application()
    async def health(request):
        if request.app.get("closing"):
            return web.json_response({"status": "closing"}, status=503)
        return web.json_response({"status": "ok"})
    async def shutdown(request):
        request.app["request_shutdown"]("POST /shutdown")
        return web.json_response({"ok": True})
    app.router.add_get("/health", health)
    app.router.add_post("/shutdown", shutdown)
    class SlowEngine:
        def close(self):
            print("standin: engine closing", file=sys.stderr, flush=True)
            time.sleep(60)
    async def startup(app):
        app["load_failed"] = asyncio.Event()
        if opts.alias == "fail-load":
            app["load_error"] = "stand-in cannot load"
            app["load_failed"].set()
        if opts.alias == "slow-close":
            app["engine"] = SlowEngine()
    app.on_startup.append(startup)
    return app

mod = types.ModuleType("ember.server.app")
mod.create_app = create_app
sys.modules["ember.server.app"] = mod
which, args = sys.argv[1], sys.argv[2:]
if which == "ember-server":
    from ember.server.cli import main
    sys.exit(main(args))
from ember.cli import main
sys.exit(main(["serve", *args]))
'''


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_")}
    env.update(extra)
    return env


class Server:
    """One `ember serve` process with its stderr read line by line."""

    def __init__(self, args: list[str], *, env: dict[str, str] | None = None, standin: bool = not HAVE_APP,
                 spelling: str = "ember"):
        if standin:
            cmd = [sys.executable, "-c", STANDIN, spelling, *args]
        elif spelling == "ember-server":
            exe = shutil.which("ember-server", path=str(Path(sys.executable).parent)) or shutil.which("ember-server")
            cmd = [exe, *args] if exe else [sys.executable, "-c", "from ember.server.cli import _console; _console()", *args]
        else:
            cmd = [sys.executable, "-m", "ember", "serve", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env=env or _clean_env())
        self.lines: list[str] = []
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stderr:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def wait_for(self, pattern: str, timeout: float = 120) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.lines.append(line)
            m = re.search(pattern, line)
            if m:
                return m
        raise AssertionError(f"no line matching {pattern!r}; stderr so far:\n" + "\n".join(self.lines))

    def finish(self, timeout: float = 60) -> tuple[int, str]:
        rc = self.proc.wait(timeout)
        while (line := self._q.get(timeout=10)) is not None:
            self.lines.append(line)
        return rc, "\n".join(self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def server_factory():
    started: list[Server] = []

    def make(*args, **kw) -> Server:
        s = Server(list(args), **kw)
        started.append(s)
        return s

    yield make
    for s in started:
        s.kill()


def _get(url: str, timeout: float = 5) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _parse(argv, env=None, **kw):
    return parse_options(list(argv), env or {}, mem_available=kw.pop("mem_available", BIG_MEM), **kw)


# -- parsing -------------------------------------------------------------------


def test_defaults_and_start_lines(smollm2_path):
    opts, lines = _parse(["-m", str(smollm2_path)])
    assert (opts.host, opts.port, opts.ctx_size, opts.parallel, opts.queue_depth) == ("127.0.0.1", 8080, 8192, 4, 64)
    assert opts.kv_unified and opts.parallel_auto  # llama-server's -np auto
    assert opts.model == str(smollm2_path) and opts.api_keys == [] and not opts.metrics
    text = "\n".join(lines)
    for needle in ["model: ", "(from the command line)", "context: 8192 positions (the model's trained length",
                   "slots: 4 sharing one context of 8192 positions", "threads: ", "chat template: the model file's own",
                   "APIs: OpenAI's (/v1/chat/completions", "Anthropic's (/v1/messages)", "Ollama's (/api/chat"]:
        assert needle in text, (needle, text)
    assert "embeddings (" not in text


def test_kv_bytes_per_position_from_the_header(smollm2_path):
    from ember import _native

    info = _native.inspect(str(smollm2_path), 0)
    assert kv_bytes_per_position(info) == 30 * 2 * 3 * 64 * 2


def test_context_is_capped_by_memory_with_a_reason(smollm2_path):
    per_pos = 30 * 2 * 3 * 64 * 2
    opts, lines = _parse(["-m", str(smollm2_path)], mem_available=2 * 3000 * per_pos)
    assert opts.ctx_size == 2816  # 3000 positions fit, rounded down to a multiple of 256
    assert any("not the trained 8192" in line and "half the available memory" in line for line in lines), lines
    with pytest.raises(OptionError, match="ctx-size"):
        _parse(["-m", str(smollm2_path)], mem_available=per_pos * 100)
    opts, lines = _parse(["-m", str(smollm2_path), "-c", "1024"], mem_available=2 * 3000 * per_pos)
    assert opts.ctx_size == 1024 and any("from -c/--ctx-size" in line for line in lines)


def test_environment_is_read_and_the_command_line_wins(smollm2_path):
    env = {
        "LLAMA_ARG_MODEL": str(smollm2_path), "LLAMA_ARG_PORT": "8081", "LLAMA_ARG_CTX_SIZE": "1024",
        "LLAMA_ARG_N_PARALLEL": "3", "LLAMA_ARG_N_PREDICT": "50", "LLAMA_ARG_THREADS": "2", "LLAMA_ARG_ALIAS": "smol",
        "LLAMA_API_KEY": "k1,k2", "LLAMA_ARG_ENDPOINT_METRICS": "1", "LLAMA_ARG_NO_WEBUI": "true",
        "LLAMA_ARG_HOST": "0.0.0.0",
    }
    opts, lines = _parse([], env)
    assert (opts.model, opts.port, opts.ctx_size, opts.parallel, opts.n_predict, opts.threads, opts.alias) == (
        str(smollm2_path), 8081, 1024, 3, 50, 2, "smol")
    assert opts.api_keys == ["k1", "k2"] and opts.metrics and opts.host == "0.0.0.0"
    assert any(line.startswith("slots: 3, each of 341 positions") for line in lines), lines
    assert not opts.webui and any(line.startswith("web page: none (--no-webui)") for line in lines), lines
    assert not any("k1" in line for line in lines), "keys must never be printed"

    opts, lines = _parse(["--port", "9000"], env)
    assert opts.port == 9000
    assert "--port 9000 from the command line overrides LLAMA_ARG_PORT=8081" in lines


def test_llama_arg_variables_are_answered_like_their_flags_and_unread_ones_reported(smollm2_path):
    _, lines = _parse(["-m", str(smollm2_path)], {"LLAMA_ARG_FLASH_ATTN": "1", "LLAMA_ARG_N_GPU_LAYERS": "99",
                                                  "LLAMA_ARG_NOT_A_THING": "1"})
    assert any(line.startswith("LLAMA_ARG_FLASH_ATTN 1: attention is always fused") for line in lines), lines
    assert "device: the first card asked for every layer and the output head (from LLAMA_ARG_N_GPU_LAYERS); without " \
           "one that can run the model, the CPU" in lines
    assert "LLAMA_ARG_NOT_A_THING is not read by ember" in lines
    with pytest.raises(OptionError, match="--model-url: http://127.0.0.1:9/m.gguf: not in the cache, and --offline"):
        _parse(["--offline"], {"LLAMA_ARG_MODEL_URL": "http://127.0.0.1:9/m.gguf"})


@pytest.mark.parametrize("env, needle", [
    ({"LLAMA_ARG_PORT": "abc"}, "LLAMA_ARG_PORT"),
    ({"LLAMA_ARG_ENDPOINT_METRICS": "maybe"}, "LLAMA_ARG_ENDPOINT_METRICS"),
    ({"LLAMA_ARG_CTX_SIZE": "-4"}, "LLAMA_ARG_CTX_SIZE"),
])
def test_bad_environment_values_name_the_variable(smollm2_path, env, needle):
    with pytest.raises(OptionError, match=needle):
        _parse(["-m", str(smollm2_path)], env)


def test_config_file_is_merged_and_the_command_line_replaces_it(smollm2_path, tmp_path):
    cfg = tmp_path / "ember.json"
    cfg.write_text(json.dumps({"ctx-size": 4096, "port": 0, "metrics": True, "model": str(smollm2_path),
                               "api-key": ["a", "b"]}))
    opts, lines = _parse(["--config", str(cfg)])
    assert (opts.ctx_size, opts.port, opts.metrics, opts.api_keys) == (4096, 0, True, ["a", "b"])
    opts, lines = _parse(["--config", str(cfg), "--port", "9001"], {"LLAMA_ARG_CTX_SIZE": "512"})
    assert opts.port == 9001 and opts.ctx_size == 4096
    assert any(line.startswith('--port 9001 from the command line replaces "port": 0') for line in lines), lines
    assert any('"ctx-size": 4096' in line and "overrides LLAMA_ARG_CTX_SIZE=512" in line for line in lines), lines


@pytest.mark.parametrize("content, needle", [
    ({"ctx_size": 10}, "'ctx_size'"),
    ({"flash-attn": True}, "'flash-attn'"),
    ({"port": "8080"}, "'port' must be an integer"),
    ({"ctx-size": True}, "'ctx-size' must be an integer"),
    ({"metrics": 1}, "'metrics' must be true or false"),
    ([1, 2], "JSON object"),
])
def test_bad_config_names_the_key(smollm2_path, tmp_path, content, needle):
    cfg = tmp_path / "bad.json"
    cfg.write_text(json.dumps(content))
    with pytest.raises(OptionError, match=re.escape(needle)) as e:
        _parse(["-m", str(smollm2_path), "--config", str(cfg)])
    assert e.value.code == 1


@pytest.mark.parametrize("argv, needle, code", [
    (["--bogus"], "--bogus", 2),
    (["-c", "-5"], "--ctx-size -5", 2),
    (["--port", "70000"], "--port 70000", 2),
    (["--port", "http"], "--port", 2),
    (["-np", "0"], "--parallel 0", 2),
    (["--queue-depth", "-1"], "--queue-depth -1", 2),
    (["-m", "no-such-model.gguf"], "no-such-model.gguf", 1),
    (["-ctk", "q9"], "--cache-type-k q9: is not a cache type", 2),
    (["-ctk", "q5_0", "-ctv", "q5_0"], "--cache-type-k q5_0: is not stored by ember's KV cache yet", 2),
    (["-ctk", "q8_0"], "--cache-type-v f16: differs from --cache-type-k q8_0", 2),
    (["-ctk", "f32"], "--cache-type-v f16: differs from --cache-type-k f32", 2),
    (["--cache-reuse", "256"], "--cache-reuse 256: ember does not shift cached chunks yet", 2),
    (["--cache-reuse", "-1"], "--cache-reuse -1: must be 0 or more", 2),
    (["-rea", "maybe"], "--reasoning maybe: expected on, off or auto", 2),
    (["--reasoning-budget", "-3"], "--reasoning-budget -3: expected an integer >= -1", 2),
    (["--reasoning-format", "xml"], "--reasoning-format xml: expected one of none, auto", 2),
    (["--reasoning-effort", "extreme"], "--reasoning-effort extreme: expected default or one of none", 2),
    (["--chat-template-kwargs", "[1]"], "--chat-template-kwargs [1]: must be a JSON object", 2),
    (["--chat-template-kwargs", "{"], "--chat-template-kwargs {: is not JSON", 2),
    (["--chat-template-kwargs", '{"enable_thinking": "yes"}'], "expected a boolean, got \"yes\"", 2),
    (["-rea", "on", "--chat-template-kwargs", '{"enable_thinking": false}'], "set enable_thinking apart", 2),
])
def test_bad_flags_name_themselves(smollm2_path, argv, needle, code):
    if "-m" not in argv:
        argv = ["-m", str(smollm2_path), *argv]
    with pytest.raises(OptionError) as e:
        _parse(argv)
    assert needle in str(e.value) and e.value.code == code


def test_files_the_flags_name_are_checked(smollm2_path, tmp_path):
    a_file = tmp_path / "f.txt"
    a_file.write_text("x")
    with pytest.raises(OptionError, match="slot-save-path"):
        _parse(["-m", str(smollm2_path), "--slot-save-path", str(a_file)])
    with pytest.raises(OptionError, match="api-key-file"):
        _parse(["-m", str(smollm2_path), "--api-key-file", str(tmp_path / "missing")])
    keys = tmp_path / "keys"
    keys.write_text("one\n\n two \n")
    tmpl = tmp_path / "t.jinja"
    tmpl.write_text("{{ messages[0]['content'] }}")
    opts, lines = _parse(["-m", str(smollm2_path), "--api-key", "zero", "--api-key-file", str(keys),
                          "--chat-template-file", str(tmpl), "--slot-save-path", str(tmp_path)])
    assert opts.api_keys == ["zero", "one", "two"] and opts.slot_save_path == str(tmp_path)
    assert opts.chat_template_file == str(tmpl)
    assert any("from --chat-template-file" in line for line in lines)
    assert "API keys: 3 accepted (Authorization: Bearer KEY)" in lines


def test_slot_ctx_names_one_slots_context(smollm2_path):
    opts, lines = _parse(["-m", str(smollm2_path), "--slot-ctx", "1000", "-np", "3"])
    assert opts.ctx_size == 3000 and opts.parallel == 3
    assert any(line.startswith("slots: 3, each of 1000 positions") for line in lines), lines
    # Slots that share the context (the default, -np auto): one slot's context is the whole.
    opts, lines = _parse(["-m", str(smollm2_path), "--slot-ctx", "1000"])
    assert opts.ctx_size == 1000 and opts.parallel == 4 and opts.kv_unified
    with pytest.raises(OptionError, match="--slot-ctx 512: names one slot's context; give it or --ctx-size"):
        _parse(["-m", str(smollm2_path), "--slot-ctx", "512", "-c", "2048"])
    with pytest.raises(OptionError, match="--slot-ctx 0: must be at least 1"):
        _parse(["-m", str(smollm2_path), "--slot-ctx", "0"])


def test_cache_ram_default_and_flag(smollm2_path):
    opts, lines = _parse(["-m", str(smollm2_path)], mem_available=8 * 2**30)
    assert opts.cache_ram_mib == 2048 and any(l.startswith("host prompt cache: 2048 MiB (a quarter") for l in lines)
    opts, lines = _parse(["-m", str(smollm2_path), "--cache-ram", "0"])
    assert opts.cache_ram_mib == 0 and "host prompt cache: off (from the command line)" in lines
    opts, _ = _parse(["-m", str(smollm2_path)], {"LLAMA_ARG_CACHE_RAM": "-1"})
    assert opts.cache_ram_mib == -1
    with pytest.raises(OptionError, match="--cache-ram -2"):
        _parse(["-m", str(smollm2_path), "--cache-ram", "-2"])


def test_reasoning_flags_become_every_chats_defaults(smollm2_path):
    opts, lines = _parse(["-m", str(smollm2_path), "-rea", "off", "--reasoning-budget", "5",
                          "--reasoning-budget-message", " Enough.", "--reasoning-format", "deepseek",
                          "--reasoning-effort", "low", "--chat-template-kwargs", '{"style": "terse"}'])
    r = opts.reasoning
    assert r.template_kwargs == {"style": "terse", "enable_thinking": False}
    assert (r.reasoning_budget, r.reasoning_budget_message, r.reasoning_format, r.reasoning_effort) == (
        5, " Enough.", "deepseek", "low")
    assert any(line.startswith("thinking: off") for line in lines)
    assert any(line.startswith("thought budget: 5 tokens") for line in lines)
    opts, _ = _parse(["-m", str(smollm2_path)], {"LLAMA_ARG_REASONING": "on", "LLAMA_ARG_THINK": "none",
                                                  "LLAMA_ARG_THINK_BUDGET": "0",
                                                  "LLAMA_CHAT_TEMPLATE_KWARGS": '{"a": 1}'})
    r = opts.reasoning
    assert (r.template_kwargs, r.reasoning_format, r.reasoning_budget) == ({"a": 1, "enable_thinking": True}, "none", 0)
    r = _parse(["-m", str(smollm2_path), "-rea", "auto", "--reasoning-effort", "default"])[0].reasoning
    assert (r.template_kwargs, r.reasoning_effort) == ({}, None)
    assert _parse(["-m", str(smollm2_path), "--no-reasoning-preserve"])[0].reasoning.template_kwargs == {
        "preserve_reasoning": False}
    with pytest.raises(OptionError, match="set preserve_reasoning apart"):
        _parse(["-m", str(smollm2_path), "--reasoning-preserve", "--chat-template-kwargs",
                '{"preserve_reasoning": false}'])


def test_checkpoint_flags_reach_the_options_in_llama_servers_spellings(smollm2_path):
    opts, _ = _parse(["-m", str(smollm2_path)])
    assert (opts.ctx_checkpoints, opts.checkpoint_interval, opts.checkpoint_min_step) == (32, 1024, 0)
    opts, _ = _parse(["-m", str(smollm2_path), "-ctxcp", "4", "--ctx-checkpoints-interval", "256", "-cms", "128"])
    assert (opts.ctx_checkpoints, opts.checkpoint_interval, opts.checkpoint_min_step) == (4, 256, 128)
    opts, _ = _parse(["-m", str(smollm2_path)], {"LLAMA_ARG_CTX_CHECKPOINTS": "0",
                                                  "LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT": "64"})
    assert (opts.ctx_checkpoints, opts.checkpoint_min_step) == (0, 64)
    opts, _ = _parse(["-m", str(smollm2_path), "--swa-checkpoints", "2"])
    assert opts.ctx_checkpoints == 2
    for flag in ("--ctx-checkpoints", "--ctx-checkpoints-interval", "--checkpoint-min-step"):
        with pytest.raises(OptionError, match=f"{flag} -1: must be 0 or more"):
            _parse(["-m", str(smollm2_path), flag, "-1"])


def test_cache_types_reach_the_options(smollm2_path):
    opts, lines = _parse(["-m", str(smollm2_path)])
    assert opts.kv_type == "f16" and "KV cache: f16 keys and values" in lines
    opts, lines = _parse(["-m", str(smollm2_path), "--cache-type-k", "f32"], {"LLAMA_ARG_CACHE_TYPE_V": "f32"})
    assert opts.kv_type == "f32" and "KV cache: f32 keys and values (from the command line)" in lines
    opts, lines = _parse(["-m", str(smollm2_path), "-ctk", "q8_0", "-ctv", "q8_0"])
    assert opts.kv_type == "q8_0" and "KV cache: q8_0 keys and values (from the command line)" in lines
    opts, lines = _parse(["-m", str(smollm2_path), "-ctk", "bf16", "-ctv", "bf16"])
    assert opts.kv_type == "bf16" and "KV cache: bf16 keys and values (from the command line)" in lines


def test_a_file_without_a_template_gets_the_fallback(gemma3_path):
    _, lines = _parse(["-m", str(gemma3_path)])
    assert "chat template: ember's built-in fallback (the file has none)" in lines


# -- the process ---------------------------------------------------------------


def _listening(s: Server) -> int:
    m = s.wait_for(r"^ember: listening on http://127\.0\.0\.1:(\d+)$")
    return int(m.group(1))


def _wait_healthy(port: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        status = _get(f"http://127.0.0.1:{port}/health")
        if status == 200:
            return
        time.sleep(0.2)
    raise AssertionError(f"/health answered {status}")


def test_port_zero_listens_on_a_real_port_and_is_healthy(server_factory, smollm2_path):
    s = server_factory("-m", str(smollm2_path), "--port", "0", env=_clean_env(LLAMA_ARG_FLASH_ATTN="on",
                                                                              LLAMA_ARG_PORT="8081"))
    port = _listening(s)
    assert 0 < port < 65536
    text = "\n".join(s.lines)
    assert "ember: --port 0 from the command line overrides LLAMA_ARG_PORT=8081" in text
    assert "ember: LLAMA_ARG_FLASH_ATTN on: attention is always fused" in text
    _wait_healthy(port)
    s.proc.send_signal(signal.SIGTERM)
    rc, text = s.finish()
    assert rc == 0 and "ember: stopping (SIGTERM)" in text


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_with_exit_0_and_names_the_cause(server_factory, smollm2_path, sig):
    s = server_factory("-m", str(smollm2_path), "--port", "0")
    _listening(s)
    s.proc.send_signal(sig)
    rc, text = s.finish()
    assert rc == 0, text
    assert f"ember: stopping ({sig.name})" in text
    assert "Traceback" not in text


def test_a_second_sigint_ends_at_once(server_factory, smollm2_path):
    s = server_factory("-m", str(smollm2_path), "--port", "0", "-a", "slow-close", standin=True)
    _listening(s)
    s.proc.send_signal(signal.SIGINT)
    s.wait_for(r"standin: engine closing")
    t0 = time.monotonic()
    s.proc.send_signal(signal.SIGINT)
    rc, text = s.finish(timeout=20)
    assert rc == 130 and time.monotonic() - t0 < 15
    assert "ember: stopping at once (SIGINT)" in text


def test_post_shutdown_stops_like_sigterm(server_factory, smollm2_path):
    s = server_factory("-m", str(smollm2_path), "--port", "0", standin=True)
    port = _listening(s)
    req = urllib.request.Request(f"http://127.0.0.1:{port}/shutdown", method="POST", data=b"")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
    rc, text = s.finish()
    assert rc == 0 and "ember: stopping (POST /shutdown)" in text


def test_a_failed_model_load_exits_1_with_the_reason(server_factory, smollm2_path):
    s = server_factory("-m", str(smollm2_path), "--port", "0", "-a", "fail-load", standin=True)
    rc, text = s.finish()
    assert rc == 1, text
    assert "ember: the model failed to load: stand-in cannot load" in text


@pytest.mark.parametrize("args, code, needle", [
    (["--no-such-flag"], 2, "--no-such-flag"),
    (["--port", "-3"], 2, "--port -3"),
    (["-m", "missing.gguf"], 1, "missing.gguf"),
])
def test_bad_flags_exit_nonzero_without_a_traceback(args, code, needle):
    r = subprocess.run([sys.executable, "-m", "ember", "serve", *args], capture_output=True, text=True, timeout=60,
                       env=_clean_env())
    assert r.returncode == code, r.stderr
    assert needle in r.stderr and r.stderr.startswith("ember: ") and "Traceback" not in r.stderr


def test_bad_config_key_exits_1_naming_it(tmp_path, smollm2_path):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"n-gpu-layers": 99}')
    r = subprocess.run([sys.executable, "-m", "ember", "serve", "-m", str(smollm2_path), "--config", str(cfg)],
                       capture_output=True, text=True, timeout=60, env=_clean_env())
    assert r.returncode == 1 and "'n-gpu-layers'" in r.stderr and "Traceback" not in r.stderr


def test_ember_server_spelling(server_factory, smollm2_path):
    s = server_factory("-m", str(smollm2_path), "--port", "0", "-c", "512", spelling="ember-server")
    port = _listening(s)
    assert "ember: context: 512 positions (from -c/--ctx-size)" in s.lines
    s.proc.send_signal(signal.SIGTERM)
    rc, text = s.finish()
    assert rc == 0 and port > 0


def test_ember_server_is_a_console_script():
    assert 'ember-server = "ember.server.cli:_console"' in (ROOT / "pyproject.toml").read_text()
    from importlib.metadata import entry_points

    found = [e for e in entry_points(group="console_scripts") if e.name == "ember-server"]
    if not found:
        pytest.skip("ember is installed without the ember-server script yet: pip install -e .")
    assert found[0].value == "ember.server.cli:_console"


# -- keys and who may reach the server -------------------------------------------

def test_a_key_file_skips_comments_and_blank_lines_and_keys_add_up(smollm2_path, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# the team's keys\n\nalpha\n   # indented comment\nbeta\n")
    opts, lines = _parse(["-m", str(smollm2_path), "--api-key", "zero", "--api-key-file", str(keys)],
                         {"LLAMA_API_KEY": "env1,env2"})
    assert opts.api_keys == ["zero", "env1", "env2", "alpha", "beta"]
    assert "API keys: 5 accepted (Authorization: Bearer KEY)" in lines


@pytest.mark.parametrize("argv, env, says", [
    (["--api-key", ""], {}, "names no key"),
    (["--api-key", " , "], {}, "names no key"),
    (["--api-key", "a,,b"], {}, "empty key between commas"),
    (["--api-key", "two words"], {}, "may not contain spaces"),
    ([], {"LLAMA_API_KEY": ""}, "LLAMA_API_KEY: names no key"),
])
def test_a_key_flag_that_names_no_key_refuses_to_start(smollm2_path, argv, env, says):
    with pytest.raises(OptionError, match=says):
        _parse(["-m", str(smollm2_path), *argv], env)


def test_a_key_file_without_keys_refuses_to_start(smollm2_path, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# nothing but a comment\n\n")
    with pytest.raises(OptionError, match="holds no key"):
        _parse(["-m", str(smollm2_path), "--api-key-file", str(keys)])


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "my-box.lan"])
def test_an_address_beyond_loopback_without_a_key_refuses_to_start(smollm2_path, host):
    with pytest.raises(OptionError, match="no API key is set") as e:
        _parse(["-m", str(smollm2_path), "--host", host])
    assert "--insecure-no-key" in str(e.value)
    opts, _ = _parse(["-m", str(smollm2_path), "--host", host, "--insecure-no-key"])
    assert opts.host == host and opts.api_keys == []
    opts, _ = _parse(["-m", str(smollm2_path), "--host", host, "--api-key", "k"])
    assert opts.api_keys == ["k"]
    with pytest.raises(OptionError, match="insecure-no-key: API keys are set"):
        _parse(["-m", str(smollm2_path), "--host", host, "--api-key", "k", "--insecure-no-key"])


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_needs_no_key(smollm2_path, host):
    assert _parse(["-m", str(smollm2_path), "--host", host])[0].host == host


def test_cors_origins_are_named_and_null_is_never_trusted(smollm2_path):
    opts, _ = _parse(["-m", str(smollm2_path), "--cors-origin", "http://localhost:3000",
                      "--cors-origin", "https://app.example"])
    assert opts.cors_origins == ["http://localhost:3000", "https://app.example"]
    assert _parse(["-m", str(smollm2_path)])[0].cors_origins == []
    for bad, says in [("null", "never trusted"), ("localhost:3000", "expected"), ("http://a.example/x", "no path")]:
        with pytest.raises(OptionError, match=says):
            _parse(["-m", str(smollm2_path), "--cors-origin", bad])
