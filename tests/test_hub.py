"""Models by name (`ember.hub`): `ember pull`, `ember serve -hf`, `ember
list` and `ember rm` against a mock hub on loopback (tests/hub_mock.py)
speaking the routes `huggingface_hub` calls, with the cache in a folder of
the test's own: the file a quantization names, the progress bar, a cut
download resumed, a wrong checksum refused, a split model fetched whole and
served, --offline, and HF_TOKEN sent."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hub_mock import Cut, MockHub
from paths import FIXTURES, ROOT
from server_process import ServerProcess, http

pytest.importorskip("huggingface_hub")
sys.path.insert(0, str(FIXTURES))
import make_tiny_models  # noqa: E402
from split_gguf import split  # noqa: E402

REPO = "tester/tiny-llama-GGUF"
SPLIT_REPO = "tester/tiny-split-GGUF"


@pytest.fixture(scope="module")
def model_bytes() -> bytes:
    return make_tiny_models.ensure("llama").read_bytes()


@pytest.fixture(scope="module")
def hub(model_bytes, tmp_path_factory):
    parts = split(make_tiny_models.ensure("llama"), tmp_path_factory.mktemp("split"), tensors_per_part=10)
    repos = {
        REPO: {"tiny-llama-Q4_K_M.gguf": model_bytes, "tiny-llama-Q8_0.gguf": model_bytes,
               "tiny-llama-F16.gguf": model_bytes, "mmproj-tiny-llama-F16.gguf": b"not the model",
               "README.md": b"# tiny llama\n"},
        SPLIT_REPO: {p.name.replace("tiny-llama", "tiny-split-Q4_0"): p.read_bytes() for p in parts},
    }
    with MockHub(repos) as h:
        yield h


def _env(hub, home) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    return {**env, "HF_ENDPOINT": hub.url, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_ETAG_TIMEOUT": "30", "HF_HUB_DISABLE_XET": "1"}


def ember(env, *args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ember", *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=timeout)


def in_a_terminal(env, *args) -> tuple[int, str, str]:
    """(status, stdout, what the terminal showed): stderr a pseudo-terminal,
    as a user's is (the progress bar is drawn only on one)."""
    import fcntl
    import pty
    import struct
    import termios

    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal has a width
    proc = subprocess.Popen([sys.executable, "-m", "ember", *args], stdout=subprocess.PIPE, stderr=child, env=env,
                            cwd=ROOT, text=True)
    os.close(child)
    shown = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        shown += chunk
    out = proc.stdout.read()
    proc.wait(300)
    os.close(main)
    return proc.returncode, out, shown.decode("utf-8", "replace")


def test_pull_fetches_the_file_its_quantization_names_with_a_progress_bar(hub, tmp_path, model_bytes):
    env = _env(hub, tmp_path)
    status, out, shown = in_a_terminal(env, "pull", f"{REPO}:q8_0")
    assert status == 0, shown
    path = out.strip()
    assert path.endswith("tiny-llama-Q8_0.gguf") and str(tmp_path) in path
    assert open(path, "rb").read() == model_bytes
    # tqdm's bar, as huggingface_hub draws it: the bytes, the rate and the time.
    assert "100%" in shown and "11.7M/11.7M" in shown and "B/s" in shown, shown
    # Without a quantization: Q4_K_M, as llama-server picks; the cached file is used again without a fetch.
    r = ember(env, "pull", REPO)
    assert r.returncode == 0 and r.stdout.strip().endswith("tiny-llama-Q4_K_M.gguf"), r.stderr
    gets = len(hub.gets)
    assert ember(env, "pull", REPO).returncode == 0 and len(hub.gets) == gets, "cached: nothing fetched"


@pytest.mark.parametrize("ref, said", [
    (f"{REPO}:Q5_K_M", "no file of quantization Q5_K_M; the repository holds tiny-llama-F16.gguf, "
                       "tiny-llama-Q4_K_M.gguf, tiny-llama-Q8_0.gguf"),
    ("tester/nothing-GGUF", "tester/nothing-GGUF: no such model repository"),
    ("not a repo", "expected a model repository as OWNER/NAME"),
])
def test_a_name_that_picks_no_file_is_an_error_listing_what_there_is(hub, tmp_path, ref, said):
    r = ember(_env(hub, tmp_path), "pull", ref)
    assert r.returncode == 1 and said in r.stderr, r.stderr


def test_a_cut_download_is_taken_up_again_and_ends_whole(hub, tmp_path, model_bytes):
    """The connection drops halfway: the same run asks for the rest, from
    the byte where it stopped, and the file is whole, checked against its
    checksum."""
    env = _env(hub, tmp_path)
    half = len(model_bytes) // 2
    hub.cuts[(REPO, "tiny-llama-F16.gguf")] = Cut(at=half, times=1)
    del hub.gets[:]
    r = ember(env, "pull", f"{REPO}:F16")
    assert r.returncode == 0, r.stderr
    assert hub.gets == [("tiny-llama-F16.gguf", None), ("tiny-llama-F16.gguf", f"bytes={half}-")], hub.gets
    assert open(r.stdout.strip(), "rb").read() == model_bytes


def test_a_run_that_stopped_is_resumed_by_the_next_from_the_bytes_it_kept(hub, tmp_path, model_bytes):
    """A run gives up on a connection that keeps dropping (or its user
    stops it); the bytes it had are kept in the cache's blob on its way,
    and the next run asks only for the rest."""
    env = _env(hub, tmp_path)
    third = len(model_bytes) // 3
    hub.cuts[(REPO, "tiny-llama-F16.gguf")] = Cut(at=third, times=100)
    try:
        r = ember(env, "pull", f"{REPO}:F16")
    finally:
        hub.cuts.clear()
    assert r.returncode == 1 and "the download was cut" in r.stderr and "run it again to resume" in r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    kept = list(tmp_path.rglob("*.incomplete"))
    assert len(kept) == 1 and kept[0].stat().st_size == third, kept
    del hub.gets[:]
    r = ember(env, "pull", f"{REPO}:F16")
    assert r.returncode == 0, r.stderr
    assert hub.gets == [("tiny-llama-F16.gguf", f"bytes={third}-")], hub.gets
    assert open(r.stdout.strip(), "rb").read() == model_bytes
    assert not list(tmp_path.rglob("*.incomplete*")), "nothing of the transfer is left behind"


def test_a_file_whose_checksum_is_wrong_is_refused_and_removed(hub, tmp_path):
    env = _env(hub, tmp_path)
    hub.wrong_sha256[(REPO, "tiny-llama-Q8_0.gguf")] = "0" * 64
    try:
        r = ember(env, "pull", f"{REPO}:Q8_0")
    finally:
        del hub.wrong_sha256[(REPO, "tiny-llama-Q8_0.gguf")]
    assert r.returncode == 1 and "does not match the checksum listed for it" in r.stderr, r.stderr
    assert "expected 0000" in r.stderr
    assert not list(tmp_path.rglob("tiny-llama-Q8_0.gguf")) or not any(
        p.exists() for p in tmp_path.rglob("tiny-llama-Q8_0.gguf")), "nothing of it is left in the cache"
    assert "Q8_0" not in ember(env, "list").stdout


def test_serve_by_name_a_split_model_fetched_whole_then_list_and_rm(hub, tmp_path):
    env = _env(hub, tmp_path)
    with ServerProcess(None, "-hf", SPLIT_REPO, env=env) as s:
        models = json.loads(http(s.url + "/v1/models")[2])
        assert models["data"][0]["meta"]["architecture"] == "llama"
        assert http(s.url + "/completion", {"prompt": "hi", "n_predict": 4})[0] == 200
        assert any("model:" in line and "tiny-split-Q4_0-00001-of-" in line for line in s.lines), s.lines
    listed = ember(env, "list").stdout
    line = next(x for x in listed.splitlines() if x.startswith(SPLIT_REPO))
    assert "Q4_0" in line and "llama" in line and "parts)" in line, listed
    # Offline, with the hub gone: the cache serves.
    offline = {**env, "HF_ENDPOINT": "http://127.0.0.1:9"}
    with ServerProcess(None, "-hf", SPLIT_REPO, "--offline", env=offline) as s:
        assert http(s.url + "/completion", {"prompt": "hi", "n_predict": 2})[0] == 200
    r = ember(offline, "serve", "-hf", f"{REPO}:Q8_0", "--offline")
    assert r.returncode == 1 and "not in the cache, and --offline fetches nothing" in r.stderr, r.stderr
    r = ember(env, "rm", SPLIT_REPO)
    assert r.returncode == 0 and "removed" in r.stdout
    assert SPLIT_REPO not in ember(env, "list").stdout
    assert ember(env, "rm", SPLIT_REPO).returncode == 1


def test_rm_of_one_quantization_keeps_the_others(hub, tmp_path):
    env = _env(hub, tmp_path)
    for q in ("Q4_K_M", "F16"):
        assert ember(env, "pull", f"{REPO}:{q}").returncode == 0
    assert ember(env, "rm", f"{REPO}:F16").returncode == 0
    listed = ember(env, "list").stdout
    assert f"{REPO}:Q4_K_M" in listed and f"{REPO}:F16" not in listed, listed


def test_the_token_is_sent_as_the_library_sends_it(hub, tmp_path):
    seen = []
    original = hub._listing

    def spy(request):
        seen.append(request.headers.get("Authorization"))
        return original(request)

    hub._listing = spy
    try:
        env = {**_env(hub, tmp_path), "HF_TOKEN": "hf_test_token"}
        assert ember(env, "pull", REPO).returncode == 0
    finally:
        hub._listing = original
    assert seen and seen[0] == "Bearer hf_test_token"


def test_a_model_by_url_is_fetched_resumed_and_served(hub, tmp_path, model_bytes):
    """-mu/--model-url, as llama-server's: the file fetched once into
    ember's cache (or to --model's path), a cut run resumed by the next,
    and a file that changed on the server in between fetched whole again
    (If-Range), never stitched onto the old bytes."""
    env = {**_env(hub, tmp_path), "EMBER_CACHE": str(tmp_path / "ember")}
    name = "tiny-llama-Q8_0.gguf"
    url = f"{hub.url}/{REPO}/resolve/main/{name}"
    hub.cuts[(REPO, name)] = Cut(at=len(model_bytes) // 4, times=100)
    try:
        r = ember(env, "pull", url)
    finally:
        hub.cuts.clear()
    assert r.returncode == 1 and "run it again to resume" in r.stderr, r.stderr
    changed = model_bytes[:-1] + bytes([model_bytes[-1] ^ 1])
    hub.repos[REPO][name] = changed
    try:
        del hub.gets[:]
        r = ember(env, "pull", url)
        assert r.returncode == 0, r.stderr
        path = r.stdout.strip()
        assert path.startswith(str(tmp_path / "ember" / "models")) and path.endswith(name)
        assert open(path, "rb").read() == changed
        # The resumed request named the bytes it held; the server sent all of the new file.
        assert hub.gets == [(name, f"bytes={len(model_bytes) // 4}-")], hub.gets
    finally:
        hub.repos[REPO][name] = model_bytes
    own = tmp_path / "mine.gguf"
    with ServerProcess(None, "-mu", f"{hub.url}/{REPO}/resolve/main/tiny-llama-F16.gguf", "-m", str(own),
                       env=env) as s:
        assert http(s.url + "/completion", {"prompt": "hi", "n_predict": 2})[0] == 200
        assert any("model:" in line and str(own) in line for line in s.lines), s.lines
    assert own.read_bytes() == model_bytes
    r = ember(env, "serve", "-mu", "ftp://example.invalid/x.gguf")
    assert r.returncode == 1 and "not an http(s) URL" in r.stderr, r.stderr
    r = ember(env, "serve", "-mu", f"{hub.url}/{REPO}/resolve/main/nothing.gguf")
    assert r.returncode == 1 and "the server answered 404" in r.stderr, r.stderr
