"""llama-server's flags, every one answered: the table of its README
(data/llama_server_flags.tsv) walked spelling by spelling. Each is honoured
(ember's own flag, parsed with a valid value), accepted with a start line
naming it and saying what it does here, or refused with a message naming it
and why; none is read as a shorter flag with its value glued on."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ember.server import llama_flags
from ember.server.cli import OptionError, build_parser, main, parse_options

BIG_MEM = 64 * 2**30
TABLE = Path(__file__).parent / "data" / "llama_server_flags.tsv"


def _table() -> list[tuple[tuple[str, ...], int]]:
    rows = []
    for line in TABLE.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            spellings, n = line.split("\t")
            rows.append((tuple(spellings.split()), int(n)))
    return rows


ROWS = _table()
SPELLINGS = [(s, n) for spellings, n in ROWS for s in spellings]
#: Flags that print and exit.
EXITING = {"-h", "--help", "--usage", "--version", "--list-devices"}
#: The hub's flags.
_HUB = {"-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-hft", "--hf-token", "-mu", "--model-url"}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("flags")
    (d / "keys").write_text("k1\n")
    (d / "system.txt").write_text("Answer briefly.")
    (d / "slots").mkdir()
    (d / "site").mkdir()
    (d / "template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    out = {"keys": str(d / "keys"), "system": str(d / "system.txt"), "slots": str(d / "slots"),
           "site": str(d / "site"), "template": str(d / "template.jinja")}
    if shutil.which("openssl"):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                        "/CN=localhost", "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
                       check=True, capture_output=True)
        out.update(key=str(d / "key.pem"), cert=str(d / "cert.pem"))
    return out


def _valid(spelling: str, files: dict[str, str], model: str) -> list[str] | None:
    """A valid use of one of ember's own flags (with what it needs beside it)."""
    values = {
        "-s": ["7"], "--seed": ["7"], "-t": ["2"], "--threads": ["2"], "-c": ["512"], "--ctx-size": ["512"],
        "-n": ["16"], "--predict": ["16"], "-b": ["512"], "--batch-size": ["512"], "-ub": ["256"],
        "--ubatch-size": ["256"], "--temp": ["0.5"], "--top-k": ["20"], "--top-p": ["0.9"], "--min-p": ["0.1"],
        "--typical": ["1.0"], "--repeat-last-n": ["32"], "--repeat-penalty": ["1.1"], "--presence-penalty": ["0.1"],
        "--frequency-penalty": ["0.1"], "-l": ["15+1"], "--logit-bias": ["15-inf"], "--ignore-eos": [],
        "--chat-template": ["chatml"], "--pooling": ["mean", "--embeddings"], "-ctk": ["f16"],
        "--cache-type-k": ["q8_0", "-ctv", "q8_0"], "-ctv": ["f16"], "--cache-type-v": ["f16"], "-np": ["2"],
        "--parallel": ["2"], "-m": [model], "--model": [model], "--host": ["127.0.0.1"], "--port": ["0"],
        "--path": [files["site"]], "--api-prefix": ["/api"], "--embedding": [], "--embeddings": [], "--api-key": ["k2"],
        "--api-key-file": [files["keys"]], "--timeout": ["60"], "--system-prompt-file": [files["system"]],
        "--metrics": [], "--no-slots": [], "--slot-save-path": [files["slots"]], "-sps": ["0.5"],
        "--slot-prompt-similarity": ["0.0"], "-v": [], "--verbose": [], "--spm-infill": [],
        "--samplers": ["penalties;top_k;temperature"], "--sampling-seq": ["kt"], "--sampler-seq": ["ykt"],
        "-hfr": ["nobody/nothing-GGUF", "--offline"], "--hf-repo": ["nobody/nothing-GGUF:Q8_0", "--offline"],
        "-hff": ["x.gguf", "-hf", "nobody/nothing-GGUF", "--offline"],
        "--hf-file": ["x.gguf", "-hf", "nobody/nothing-GGUF", "--offline"],
        "-hft": ["t", "-hf", "nobody/nothing-GGUF", "--offline"],
        "--hf-token": ["t", "-hf", "nobody/nothing-GGUF", "--offline"],
        "-mu": ["http://127.0.0.1:9/nothing.gguf", "--offline"],
        "--model-url": ["http://127.0.0.1:9/nothing-00001-of-00002.gguf", "--offline"],
        "-hf": ["nobody/nothing-GGUF", "--offline"], "--n-predict": ["16"], "-dev": ["none"], "--device": ["none"],
        "-ngl": ["0"], "--gpu-layers": ["0"], "--n-gpu-layers": ["0"], "--log-verbose": [], "--offline": [],
        "--temperature": ["0.5"], "--typical-p": ["1.0"], "-ctxcp": ["4"], "--ctx-checkpoints": ["4"],
        "--swa-checkpoints": ["4"], "-cms": ["64"], "--checkpoint-min-step": ["64"], "-cram": ["64"],
        "--cache-ram": ["64"], "-kvu": ["-np", "2"], "--kv-unified": [], "-a": ["m1"], "--alias": ["m1,m2"],
        "--tags": ["a,b"], "--cors-origins": ["http://localhost:3000"], "--no-ui": [], "--no-webui": [],
        "--rerank": [], "--reranking": [], "--chat-template-kwargs": ['{"enable_thinking": false}'], "-to": ["60"],
        "--sse-ping-interval": ["-1"], "--cache-reuse": ["0"], "--reasoning-format": ["deepseek"], "-rea": ["off"],
        "--reasoning": ["auto"], "--reasoning-effort": ["low"], "--reasoning-budget": ["0"],
        "--reasoning-budget-message": ["Enough."], "--chat-template-file": [files["template"]],
        "--sleep-idle-seconds": ["60"], "-no-kvu": [], "--no-kv-unified": [], "--no-cache-prompt": [], "--no-prefill-assistant": [], "--reasoning-preserve": [],
        "--no-reasoning-preserve": [], "--embd-normalize": ["1"],
    }
    if "key" in files:
        values["--ssl-key-file"] = [files["key"], "--ssl-cert-file", files["cert"]]
        values["--ssl-cert-file"] = [files["cert"], "--ssl-key-file", files["key"]]
    return values.get(spelling)


def test_the_table_is_the_readme_s():
    assert len(ROWS) == 275 + 52 and len(SPELLINGS) == 479
    assert (("-ngl", "--gpu-layers", "--n-gpu-layers") in [r for r, _ in ROWS]), "the README's table, as it is"


@pytest.mark.parametrize("spelling, n_values", SPELLINGS, ids=[s for s, _ in SPELLINGS])
def test_every_flag_of_the_table_is_answered(spelling, n_values, files, smollm2_path):
    parser = build_parser()
    assert spelling in parser._option_string_actions, f"{spelling} is not a flag ember knows"
    model = str(smollm2_path)
    if spelling == "--list-devices":
        assert main([spelling]) == 0
        return
    if spelling in EXITING:
        with pytest.raises(SystemExit) as exit_:
            parse_options([spelling], {})
        assert exit_.value.code == 0
        return
    compat = llama_flags._BY_SPELLING.get(spelling)
    if compat is None:
        use = _valid(spelling, files, model)
        if use is None and spelling.startswith("--ssl-"):
            pytest.skip("no openssl to make a certificate with")
        assert use is not None, f"{spelling} is honoured by ember: give it a valid value here"
        if spelling in _HUB:
            # Honoured by fetching (tests/server/test_hub.py); offline, an empty cache is the answer here.
            with pytest.raises(OptionError, match="not in the cache, and --offline fetches nothing"):
                parse_options([spelling, *use], {}, mem_available=BIG_MEM)
            return
        base = [] if spelling in ("-m", "--model") else ["-m", model]
        parse_options(base + [spelling, *use], {}, mem_available=BIG_MEM)
        return
    values = {0: [], 1: ["1"], 2: ["a", "1"]}[n_values] if compat.nargs != "?" else []
    try:
        _, lines = parse_options(["-m", model, spelling, *values], {}, mem_available=BIG_MEM)
    except OptionError as e:
        assert str(e).startswith(spelling + (" " if values else ":")), e
        assert len(str(e)) > len(spelling) + 20, f"a refusal says why: {e}"
        return
    said = [line for line in lines if line.startswith(spelling)]
    assert said and len(said[0]) > len(spelling) + 20, f"{spelling}: accepted flags say what they do here: {lines}"


@pytest.mark.parametrize("argv, said", [
    (["-ngl", "99"], "device: the first card asked for every layer and the output head (from the command line)"),
    (["--n-gpu-layers", "all"], "device: the first card asked for every layer"),
    (["-ngl", "0"], "device: none, the model runs on the CPU (from the command line)"),
    (["-fa", "on"], "-fa on: attention is always fused"),
    (["-fa", "off"], "-fa off: attention is always fused"),
    (["-fa"], "-fa: attention is always fused"),
    (["-cb"], "-cb: batching is always continuous"),
    (["--jinja"], "--jinja: chat templates are always rendered as Jinja"),
    (["--device", "none"], "device: none, the model runs on the CPU (from the command line)"),
    (["-sm", "none"], "-sm none: the model is in one piece, on one device"),
    (["--mirostat", "0"], "--mirostat 0: mirostat stays off"),
    (["--slots"], "--slots: GET /slots is served"),
    (["--no-context-shift"], "--no-context-shift: the context is never shifted"),
    (["-np", "4", "-kvu"], "slots: 4 sharing one context of"),
    (["-no-kvu"], "slots: 4, each of 2048 positions (the context is cut among them)"),
    ([], "slots: 4 sharing one context of 8192 positions (from -np auto, llama-server's default)"),
    (["-np", "2"], "slots: 2, each of 4096 positions"),
    (["-np", "-1", "-kvu"], "slots: 4 sharing one context of 8192 positions (from the command line)"),
    (["--swa-full"], "--swa-full: sliding-window layers keep their window"),
    (["--webui"], "--webui: the chat page is served at /"),
    (["--backend_sampling"], "--backend_sampling: tokens are drawn on the CPU"),
])
def test_the_flags_scripts_pass_are_accepted_and_said(argv, said, smollm2_path):
    _, lines = parse_options(["-m", str(smollm2_path), *argv], {}, mem_available=BIG_MEM)
    assert any(line.startswith(said) for line in lines), lines


@pytest.mark.parametrize("argv, refused", [
    (["-fa", "sometimes"], "-fa sometimes: expected on, off or auto"),
    (["-ngl", "gl"], "--gpu-layers gl: expected a number of layers, auto or all, got 'gl' (from the command line)"),
    (["-ngl", "-2"], "--gpu-layers -2: -2 is not a count of layers"),
    (["-ngl", "x", "--device", "none"], "--gpu-layers x: expected a number of layers"),
    (["--device", "Vulkan99"], "--device Vulkan99: no such device; the devices are: "),
    (["--device", "Vulkan0,Vulkan1"], "--device Vulkan0,Vulkan1: names 2 devices; ember runs a model on one"),
    (["-ts", "1,1"], "-ts 1,1: ember runs a model whole on one device"),
    (["--mirostat", "2"], "--mirostat 2: ember has no mirostat sampler"),
    (["--no-cont-batching"], "--no-cont-batching: batching is always continuous"),
    (["--context-shift"], "--context-shift: ember does not shift the context"),
    (["-ngx", "3"], "-ngx: not a flag of ember or llama-server's (it is not read as -n gx)"),
    (["-nxyz"], "-nxyz: not a flag"),
])
def test_values_ember_cannot_honour_and_unknown_words_are_refused(argv, refused, smollm2_path):
    with pytest.raises(OptionError) as e:
        parse_options(["-m", str(smollm2_path), *argv], {}, mem_available=BIG_MEM)
    assert str(e.value).startswith(refused), e.value


def test_negative_numbers_are_values_not_flags(smollm2_path):
    opts, _ = parse_options(["-m", str(smollm2_path), "-n", "-1", "--seed", "-1"], {}, mem_available=BIG_MEM)
    assert opts.n_predict == -1 and opts.sampling.seed is None


def test_list_devices_prints_the_cpu_and_exits(capsys):
    assert main(["--list-devices"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Available devices:\n") and out.count("Available devices:") == 1
    assert "\n  cpu: the host's cores" in out


def _vulkan_names() -> list[str]:
    from ember import _native

    names = [d["name"] for d in _native.list_devices()]
    if not names:
        if os.environ.get("EMBER_REQUIRE_GPU"):
            pytest.fail("EMBER_REQUIRE_GPU is set, and no Vulkan device is listed")
        pytest.skip("no Vulkan device here")
    return names


def test_list_devices_names_each_vulkan_device(capsys):
    names = _vulkan_names()
    assert main(["--list-devices"]) == 0
    out = capsys.readouterr().out
    for name in names:
        assert f"\n  {name}: " in out


def test_a_device_that_is_there_is_asked_for_every_layer(smollm2_path):
    name = _vulkan_names()[0]
    opts, lines = parse_options(["-m", str(smollm2_path), "--device", name.lower()], {}, mem_available=BIG_MEM)
    assert (opts.device, opts.gpu_layers) == (name.lower(), None)
    assert f"device: {name.lower()} asked for every layer and the output head (from the command line); refused at " \
           "load if it cannot hold or run the model" in lines
    opts, _ = parse_options(["-m", str(smollm2_path)], {"LLAMA_ARG_N_GPU_LAYERS": "all", "LLAMA_ARG_DEVICE": name},
                            mem_available=BIG_MEM)
    assert (opts.device, opts.gpu_layers) == (name, "all")


def test_the_version_is_printed(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--version"])
    assert capsys.readouterr().out.startswith("ember ")
