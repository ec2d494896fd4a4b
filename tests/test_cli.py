"""The `ember` command line, run as a user runs it: a subprocess."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path


def ember(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ember", *args], capture_output=True, text=True, timeout=timeout)


def test_run_streams_a_completion(smollm2, smollm2_path):
    r = ember("run", "-m", str(smollm2_path), "-p", "The capital of France is", "-n", "8", "--temp", "0")
    assert r.returncode == 0, r.stderr
    expected = smollm2.generate("The capital of France is", 8, temperature=0)
    assert r.stdout == "The capital of France is" + expected + "\n"


def test_chat_mode_answers_and_exits_on_eof(smollm2_path):
    r = subprocess.run(
        [sys.executable, "-m", "ember", "run", "-m", str(smollm2_path), "--chat", "-n", "12", "--temp", "0"],
        input="What is 2+2?\n", capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("> ") and len(r.stdout.strip()) > 2


def test_info_reports_the_file_and_unread_tensors(gemma3_path, smollm2_path):
    r = ember("info", "-m", str(gemma3_path))
    assert r.returncode == 0, r.stderr
    for needle in ["architecture:   gemma3", "sliding window: 512", "Q4_K", "Q6_K", "every tensor is read", "chat template:  none"]:
        assert needle in r.stdout, (needle, r.stdout)
    r = ember("info", "-m", str(smollm2_path))
    assert "architecture:   llama" in r.stdout and "chat template:  yes" in r.stdout


def test_info_reports_mixtures_and_shared_caches():
    """The per-layer shapes as ember reads them: a mixture's experts, and
    Gemma 4's layers that read an earlier layer's cache (the tiny gemma4: 4
    of its 6 layers keep a cache, three sliding of 2 heads of 16 and one
    full of 1 head of 32, so a position costs 2 x (3 x 64 + 64) bytes)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
    import make_tiny_models

    r = ember("info", "-m", str(make_tiny_models.ensure("qwen3moe")))
    assert r.returncode == 0, r.stderr
    assert "experts:        2 of 8 per token" in r.stdout, r.stdout
    r = ember("info", "-m", str(make_tiny_models.ensure("gemma4")))
    assert r.returncode == 0, r.stderr
    assert "kv layers:      4 of 6" in r.stdout and "kv cache:       512 B per position" in r.stdout, r.stdout


def test_info_reports_a_hybrids_recurrent_layers():
    """The tiny qwen35: three gated DeltaNet layers, each with a state of
    3 x 128 convolution inputs and 4 heads of 16 x 16 (1,408 floats), and one
    attention layer of 2 key/value heads of 16: 2 x (32 + 32) bytes a position."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
    import make_tiny_models

    r = ember("info", "-m", str(make_tiny_models.ensure("qwen35")))
    assert r.returncode == 0, r.stderr
    assert "recurrent:      3 of 4 layers keep a state" in r.stdout, r.stdout
    assert "16.5 KiB per sequence" in r.stdout and "kv cache:       128 B per position" in r.stdout, r.stdout
    assert "kv layers:" not in r.stdout, r.stdout


def test_a_file_ember_cannot_read_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 24)
    r = ember("info", "-m", str(bad))
    assert r.returncode == 1
    assert r.stderr.startswith("ember: ") and "Traceback" not in r.stderr
    r = ember("run", "-m", str(tmp_path / "missing.gguf"), "-p", "x")
    assert r.returncode == 1 and "no such file" in r.stderr


def test_ctrl_c_interrupts_a_generation(smollm2_path):
    # As from a terminal: Ctrl-C's default disposition, whatever this process
    # inherited or set (an ignored SIGINT is inherited, and Python keeps it).
    p = subprocess.Popen(
        [sys.executable, "-m", "ember", "run", "-m", str(smollm2_path), "-p", "Once", "-n", "100000", "--ignore-eos", "-c", "4096"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # Wait until tokens flow, then interrupt.
    first = p.stdout.read(6)
    assert first
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError("ember did not stop on SIGINT")
    assert p.returncode == 130
    assert "interrupted" in err
