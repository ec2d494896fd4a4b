"""Models by name: a GGUF of a model repository fetched into
`huggingface_hub`'s standard cache (so a file another tool fetched is used as
it is), its bytes by `ember.download` (a progress bar, and a cut or stopped
download resumed from the bytes it kept) and its place in the cache by the
library; `HF_TOKEN`, `HF_ENDPOINT` and `HF_HUB_OFFLINE` as the library reads
them.

`REPO[:QUANT]` picks the file as llama-server does: the file whose name
carries the quantization tag (case-insensitive; Q4_K_M, else Q8_0, else the
first, when no tag is given). A split model (`NAME-00001-of-0000N.gguf`) is
fetched whole. Each file fetched is checked against the checksum the
repository lists for it (sha256 for large files, the git blob id for the
others); one that does not match is removed and refused.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from ember.download import DownloadError
from ember.errors import ModelFetchError

__all__ = ["CachedModel", "HubError", "cached_models", "fetch", "parse_ref", "pick", "remove"]


class HubError(ModelFetchError):
    """A model that cannot be fetched, found or removed; the message says why."""


_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_SPLIT = re.compile(r"^(.+)-(\d{5})-of-(\d{5})$", re.I)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.I)
#: Files of a model repository that are not the model itself.
_NOT_MODELS = ("mmproj", "imatrix")


def parse_ref(text: str) -> tuple[str, str | None]:
    """(repository, quantization tag or None) of `REPO[:QUANT]`."""
    repo, _, quant = text.strip().partition(":")
    if not _REPO.match(repo):
        raise HubError(f"{text!r}: expected a model repository as OWNER/NAME, optionally :QUANT (such as "
                       "ggml-org/gemma-3-1b-it-GGUF:Q4_K_M)")
    if quant and not re.fullmatch(r"[A-Za-z0-9_]+", quant):
        raise HubError(f"{text!r}: the quantization after ':' is a name such as Q4_K_M")
    return repo, quant or None


def _split_of(path: str) -> tuple[str, int, int]:
    """(prefix, part, parts) of a GGUF file name (1, 1 for a whole file)."""
    stem = path[:-5] if path.lower().endswith(".gguf") else path
    m = _SPLIT.match(stem)
    return (m.group(1), int(m.group(2)), int(m.group(3))) if m else (stem, 1, 1)


def quant_of(path: str) -> str:
    """The quantization tag a GGUF file's name carries ("" when none)."""
    m = _TAG.search(_split_of(Path(path).name)[0])
    return m.group(1).upper() if m else ""


def _is_model(path: str) -> bool:
    name = path.lower()
    return name.endswith(".gguf") and not any(word in Path(name).name for word in _NOT_MODELS)


def pick(files: list[str], quant: str | None, repo: str = "") -> list[str]:
    """The files (a split model's parts in order) that `REPO[:QUANT]`
    names among the repository's `files`."""
    models = sorted(f for f in files if _is_model(f))
    holds = ", ".join(models) if models else "no GGUF file"
    if not models:
        raise HubError(f"{repo}: the repository holds no GGUF model file")
    firsts = [f for f in models if _split_of(f)[1] == 1]
    chosen = None
    for tag in ([quant] if quant else ["Q4_K_M", "Q8_0"]):
        pattern = re.compile(re.escape(tag) + r"[.-]", re.I)
        hits = [f for f in firsts if pattern.search(Path(f).name)]
        if len(hits) > 1:
            raise HubError(f"{repo}:{tag} is ambiguous: {', '.join(hits)} (name one with --hf-file)")
        if hits:
            chosen = hits[0]
            break
    if chosen is None:
        if quant:
            raise HubError(f"{repo}: no file of quantization {quant}; the repository holds {holds}")
        chosen = firsts[0] if firsts else models[0]
    return _parts(models, chosen, repo)


def _parts(models: list[str], first: str, repo: str) -> list[str]:
    prefix, _, count = _split_of(first)
    if count == 1:
        return [first]
    parts = _parts_names(prefix, count)
    missing = [p for p in parts if p not in models]
    if missing:
        raise HubError(f"{repo}: {first} is part of a model in {count} files, but the repository lacks "
                       f"{', '.join(missing)}")
    return parts


def _file_named(files: list[str], name: str, repo: str) -> list[str]:
    if name not in files:
        models = ", ".join(sorted(f for f in files if _is_model(f))) or "no GGUF file"
        raise HubError(f"{repo}: no file {name}; the repository holds {models}")
    return _parts(sorted(f for f in files if _is_model(f)) or [name], name, repo) if _is_model(name) else [name]


def _digest(path: Path, h, head: bytes = b"") -> str:
    h.update(head)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _listed_sha256(sibling) -> str | None:
    """The sha256 the repository lists for a large (LFS) file."""
    return (getattr(sibling, "lfs", None) or {}).get("sha256") or None


def _check(path: Path, sibling, repo: str) -> None:
    """Refuses (and removes) a fetched file whose bytes are not the ones
    the repository lists by git blob id (a large file's sha256 is checked
    as it arrives)."""
    if getattr(sibling, "blob_id", None):
        # git's id of a blob: the sha1 of its header and bytes
        head = b"blob %d\0" % path.stat().st_size
        want, got, kind = sibling.blob_id, _digest(path, hashlib.sha1(), head), "git blob id"
    else:
        return
    if want != got:
        blob = path.resolve()
        path.unlink(missing_ok=True)
        if not _linked(blob, repo):
            blob.unlink(missing_ok=True)
        raise HubError(f"{repo}/{sibling.rfilename}: the file fetched does not match the repository's checksum "
                       f"({kind} {got}, expected {want}); it was removed, fetch it again")


def fetch(ref: str, *, file: str | None = None, offline: bool = False, token: str | None = None) -> Path:
    """The local path of the model `ref` (`REPO[:QUANT]`) names, fetched
    into the cache if it is not there (`file` names the file instead of a
    quantization). A split model's first part is returned; the others lie
    beside it."""
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    repo, quant = parse_ref(ref)
    if file is not None and quant is not None:
        raise HubError(f"{ref}: name the file (--hf-file) or the quantization (:QUANT), not both")
    if offline:
        return _cached_path(repo, quant, file)
    try:
        info = HfApi(token=token).model_info(repo, files_metadata=True)
    except RepositoryNotFoundError:
        raise HubError(f"{repo}: no such model repository (or it needs a token: HF_TOKEN)") from None
    except HfHubHTTPError as e:
        raise HubError(f"{repo}: the hub refused the listing ({e})") from None
    except (OSError, LocalEntryNotFoundError) as e:
        raise HubError(f"{repo}: the hub cannot be reached ({e}); --offline uses what is cached") from None
    siblings = {s.rfilename: s for s in info.siblings or []}
    names = _file_named(list(siblings), file, repo) if file else pick(list(siblings), quant, repo)
    paths = []
    for name in names:
        cached = _in_cache(repo, name, info.sha)
        try:
            if not cached:
                _download_blob(repo, name, info.sha, siblings[name], token)
            # The bytes are in the cache now: the library links them into its snapshot.
            path = Path(hf_hub_download(repo, name, revision=info.sha, token=token))
        except HfHubHTTPError as e:
            raise HubError(f"{repo}/{name}: the download failed ({e}); run it again to resume") from None
        except DownloadError as e:
            raise HubError(f"{repo}/{e}") from None
        except Exception as e:  # the transport's errors (a refused connection, a timeout) are the library's own types
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise HubError(f"{repo}/{name}: the hub cannot be reached ({first}); run it again to resume") from None
        if not cached and not _listed_sha256(siblings[name]):
            _check(path, siblings[name], repo)
        paths.append(path)
    return paths[0]


def _download_blob(repo: str, name: str, revision: str, sibling, token: str | None) -> None:
    """The bytes of `repo`/`name` fetched into the blob the hub's cache
    keeps them in, resumed from what a cut or stopped run left there (the
    library itself starts every run over), and checked against the sha256
    the repository lists before they take the blob's name."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    from ember.download import download

    url = hf_hub_url(repo, name, revision=revision)
    meta = get_hf_file_metadata(url, token=token)
    if not meta.etag:
        raise DownloadError(f"{name}: the hub gave no ETag for the file, so its place in the cache is unknown")
    blob = Path(constants.HF_HUB_CACHE) / ("models--" + repo.replace("/", "--")) / "blobs" / meta.etag
    if blob.is_file():
        return
    download(url, blob, headers=build_hf_headers(token=token), sha256=_listed_sha256(sibling), size=meta.size,
             label=name, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT)


def _in_cache(repo: str, name: str, revision: str | None) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo, name, revision=revision), str)


def _cached_path(repo: str, quant: str | None, file: str | None) -> Path:
    """The model `repo[:quant]` names among the files already cached (--offline)."""
    for snapshot in _snapshots(repo):
        files = [str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file()]
        try:
            names = _file_named(files, file, repo) if file else pick(files, quant, repo)
        except HubError:
            continue
        return snapshot / names[0]
    what = f"{repo}/{file}" if file else f"{repo}:{quant}" if quant else repo
    raise HubError(f"{what}: not in the cache, and --offline fetches nothing (run `ember pull {repo}` first)")


def _snapshots(repo: str) -> list[Path]:
    """The cached snapshots of `repo`, newest first."""
    from huggingface_hub.constants import HF_HUB_CACHE

    root = Path(HF_HUB_CACHE) / ("models--" + repo.replace("/", "--")) / "snapshots"
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)


@dataclass
class CachedModel:
    repo: str
    #: the model's first file, relative to its snapshot
    file: str
    path: Path
    parts: int
    size: int
    quant: str
    architecture: str


def cached_models() -> list[CachedModel]:
    """Every GGUF model in the cache (a split one once, its parts summed)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    from ember import _native

    try:
        repos = scan_cache_dir().repos
    except CacheNotFound:
        return []
    out = []
    for r in sorted(repos, key=lambda r: r.repo_id):
        if r.repo_type != "model":
            continue
        for rev in r.revisions:
            by_name = {str(f.file_path.relative_to(rev.snapshot_path)): f for f in rev.files}
            for name in sorted(by_name):
                prefix, part, count = _split_of(name)
                if not _is_model(name) or part != 1:
                    continue
                parts = [by_name.get(n) for n in _parts_names(prefix, count)] if count > 1 else [by_name[name]]
                try:
                    arch = _native.inspect(str(by_name[name].file_path), 0)["metadata"].get(
                        "general.architecture", "?")
                except Exception:  # a file cut short or not a GGUF: listed, marked as such
                    arch = "(unreadable)"
                out.append(CachedModel(r.repo_id, name, by_name[name].file_path, count,
                                       sum(p.size_on_disk for p in parts if p is not None), quant_of(name),
                                       arch if None not in parts else f"{arch} (parts missing)"))
    return out


def _parts_names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def remove(ref: str) -> list[Path]:
    """Removes the cached model `ref` names (every quantization of the
    repository without a `:QUANT`); the files removed."""
    import shutil

    from huggingface_hub.constants import HF_HUB_CACHE

    repo, quant = parse_ref(ref)
    if quant is None:
        root = Path(HF_HUB_CACHE) / ("models--" + repo.replace("/", "--"))
        if not root.is_dir():
            raise HubError(f"{repo}: not in the cache")
        gone = [p for p in root.rglob("*") if p.is_file()]
        shutil.rmtree(root)
        return gone
    gone = []
    for m in cached_models():
        if m.repo == repo and m.quant == quant.upper():
            prefix, _, count = _split_of(m.file)
            for name in (_parts_names(prefix, count) if count > 1 else [m.file]):
                link = m.path.parent / Path(name).name
                if link.exists() or link.is_symlink():
                    blob = link.resolve()
                    link.unlink()
                    gone.append(link)
                    if blob != link and blob.exists() and not _linked(blob, repo):
                        blob.unlink()  # the bytes no other file of the cache is
    if not gone:
        raise HubError(f"{ref}: not in the cache")
    return gone


def _linked(blob: Path, repo: str) -> bool:
    """Whether a file of a snapshot of `repo` still points at `blob` (two
    files of the same bytes share one)."""
    for snapshot in _snapshots(repo):
        for p in snapshot.rglob("*"):
            if p.is_symlink() and p.resolve() == blob:
                return True
    return False

