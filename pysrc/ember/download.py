"""Downloads that survive an interruption: the bytes go into
`<target>.incomplete` beside the target, and whoever finds part of the file
there (this run after a dropped connection, or a later run after the user
stopped one) asks only for the rest, with a `Range` from where it stopped.
`If-Range` carries the validator the first response gave (its ETag, else
its Last-Modified), so a file that changed on the server is fetched whole
rather than stitched onto the old bytes. When the caller knows the file's
sha256 it is checked before the file takes its name: a wrong file never
lands. tqdm's bar (bytes, rate, time left), as `huggingface_hub` draws it.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from ember.errors import ModelFetchError

__all__ = ["DownloadError", "download", "fetch_url", "partial_path", "url_target"]

#: attempts in one run that may end without a byte more before it gives up
_STALLED_ATTEMPTS = 3
_BLOCK = 1 << 16


class DownloadError(ModelFetchError):
    """A file that could not be fetched; the message says why."""


def partial_path(target: Path) -> Path:
    """Where the bytes of `target` gather until they are all there (the name
    `huggingface_hub` gives a blob on its way into its cache)."""
    return target.with_name(target.name + ".incomplete")


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects (a hub sends its files' bytes from elsewhere), but
    sends a credential only to the host it was given for."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


_OPENER = urllib.request.build_opener(_Redirects)


def download(url: str, target: Path, *, headers: dict[str, str] | None = None, sha256: str | None = None,
             size: int | None = None, label: str | None = None, timeout: float = 30.0) -> Path:
    """`target`, its bytes fetched from `url` (resumed from what an earlier
    try left). `sha256` and `size`, when given, are what the bytes must be."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    t = _Transfer(url, partial_path(target), headers or {}, sha256, label or target.name, timeout)
    t.bar = _bar(t.label, size, t.have)
    stalled = 0
    try:
        while True:
            before = t.have
            try:
                total = t.fetch()
            except urllib.error.HTTPError as e:
                raise DownloadError(f"{t.label}: the server answered {e.code} {e.reason}") from None
            except (OSError, http.client.HTTPException) as e:  # a cut connection, a timeout, a reset
                t.have = t.partial.stat().st_size if t.partial.is_file() else 0
                stalled = 0 if t.have > before else stalled + 1
                if stalled >= _STALLED_ATTEMPTS:
                    raise DownloadError(f"{t.label}: the download was cut ({_reason(e)}) at {t.have} bytes, which "
                                        f"are kept; run it again to resume") from None
                continue
            if total is None or t.have >= total:
                break
    finally:
        t.bar.close()
    if size is not None and t.have != size:
        t.discard()
        raise DownloadError(f"{t.label}: {t.have} bytes arrived where {size} were expected; removed, fetch it again")
    if t.digest is not None and t.digest.hexdigest() != sha256:
        t.discard()
        raise DownloadError(f"{t.label}: the file fetched does not match the checksum listed for it (sha256 "
                            f"{t.digest.hexdigest()}, expected {sha256}); it was removed, fetch it again")
    os.replace(t.partial, target)
    t.notes.unlink(missing_ok=True)
    return target


_SPLIT_PART = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.I)


def url_target(url: str, models: Path) -> Path:
    """Where the model at `url` is kept under `models` when no path is
    given: a folder per place it came from, the file under its own name (so
    a split model's parts lie together)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise DownloadError(f"{url}: not an http(s) URL")
    name = urllib.parse.unquote(parts.path.rsplit("/", 1)[-1])
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise DownloadError(f"{url}: the URL names no file")
    place = hashlib.sha256(f"{parts.scheme}://{parts.netloc}{parts.path.rsplit('/', 1)[0]}".encode()).hexdigest()
    return models / "from-url" / f"{parts.netloc.replace(':', '_')}-{place[:12]}" / name


def fetch_url(url: str, target: Path, *, offline: bool = False) -> Path:
    """`target`, the model at `url` fetched into it unless it is there; a
    split model's other parts (`-0000K-of-0000N.gguf`) are fetched beside
    it from the URLs its name gives."""
    url_target(url, target.parent)  # the URL is checked whatever the target
    m = _SPLIT_PART.search(target.name)
    wanted = [(url, target)]
    if m and int(m.group(1)) == 1:
        count = int(m.group(2))
        for k in range(2, count + 1):
            part = f"-{k:05d}-of-{count:05d}.gguf"
            pieces = urllib.parse.urlsplit(url)
            part_url = urllib.parse.urlunsplit(pieces._replace(path=_SPLIT_PART.sub(part, pieces.path)))
            wanted.append((part_url, target.with_name(_SPLIT_PART.sub(part, target.name))))
    for part_url, part in wanted:
        if part.is_file():
            continue
        if offline:
            raise DownloadError(f"{part_url}: not in the cache, and --offline fetches nothing (it would be {part})")
        download(part_url, part, label=part.name)
    return target


class _Transfer:
    """One file on its way: the bytes held in `partial`, their running
    digest, and the validator they were fetched under (kept beside them in
    `notes`, with the URL, for the run that resumes them)."""

    def __init__(self, url: str, partial: Path, headers: dict[str, str], sha256: str | None, label: str,
                 timeout: float):
        self.url, self.partial, self.headers, self.label, self.timeout = url, partial, headers, label, timeout
        self.notes = partial.with_name(partial.name + ".json")
        self.sha256 = sha256
        self.validator = _read_validator(self.notes, url)
        if self.validator is None:
            partial.unlink(missing_ok=True)  # bytes of unknown origin: not to be continued
        self.digest = hashlib.sha256() if sha256 else None
        self.have = _hash_into(partial, self.digest)
        self.bar = None

    def restart(self) -> None:
        self.have = 0
        self.digest = hashlib.sha256() if self.sha256 else None
        self.bar.reset(total=self.bar.total)

    def discard(self) -> None:
        self.partial.unlink(missing_ok=True)
        self.notes.unlink(missing_ok=True)

    def fetch(self) -> int | None:
        """One request, its bytes appended to the partial file; the file's
        whole size when the server said it."""
        request = urllib.request.Request(self.url, headers=dict(self.headers))
        if self.have:
            request.add_header("Range", f"bytes={self.have}-")
            if self.validator:
                request.add_header("If-Range", self.validator)
        try:
            response = _OPENER.open(request, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            if e.code != 416 or not self.have:
                raise
            # Nothing after what is held: it is whole, or it is not the server's file.
            total = _total_of(e.headers, self.have)
            if total is None or total == self.have:
                return self.have
            self.restart()
            return total
        with response:
            if self.have and response.status != 206:
                self.restart()  # the whole file comes (no ranges, or it changed on the server): start over
            start = _range_start(response.headers) if response.status == 206 else 0
            if start is not None and start != self.have:
                raise OSError(f"the server sent bytes from {start}, not from {self.have}")
            self.validator = response.headers.get("ETag") or response.headers.get("Last-Modified") or ""
            self.notes.write_text(json.dumps({"url": self.url, "validator": self.validator}))
            total = _total_of(response.headers, self.have)
            if total is not None and self.bar.total is None:
                self.bar.reset(total=total)
                self.bar.update(self.have)
            with open(self.partial, "r+b" if self.have else "wb") as out:
                out.seek(self.have)
                out.truncate()
                while block := response.read(_BLOCK):
                    out.write(block)
                    if self.digest is not None:
                        self.digest.update(block)
                    self.have += len(block)
                    self.bar.update(len(block))
        if total is not None and self.have < total:
            # http.client ends a body cut short quietly: it is a cut all the same.
            raise http.client.IncompleteRead(b"", total - self.have)
        return total


def _read_validator(notes: Path, url: str) -> str | None:
    """The validator a partial file of `url` was fetched under ("" when the
    server gave none); None when there is no partial file of that URL."""
    try:
        saved = json.loads(notes.read_text())
    except (OSError, ValueError):
        return None
    return (saved.get("validator") or "") if saved.get("url") == url else None


def _hash_into(partial: Path, digest) -> int:
    """The bytes `partial` holds, fed to `digest` (0 when there is none)."""
    if not partial.is_file():
        return 0
    if digest is None:
        return partial.stat().st_size
    n = 0
    with open(partial, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
            n += len(block)
    return n


def _range_start(headers) -> int | None:
    rng = headers.get("Content-Range", "")
    try:
        return int(rng.split()[1].split("-")[0]) if rng.startswith("bytes ") else None
    except (IndexError, ValueError):
        return None


def _total_of(headers, have: int) -> int | None:
    """The whole file's size: after the '/' of Content-Range, else what
    this response carries after the bytes held."""
    rng = headers.get("Content-Range", "")
    if "/" in rng and rng.rsplit("/", 1)[1].strip().isdigit():
        return int(rng.rsplit("/", 1)[1])
    length = headers.get("Content-Length")
    return have + int(length) if length and length.isdigit() else None


def _reason(e: BaseException) -> str:
    reason = getattr(e, "reason", None) or e
    return str(reason).splitlines()[0] if str(reason) else type(e).__name__


def _bar(label: str, total: int | None, have: int):
    from huggingface_hub.utils import tqdm

    return tqdm(unit="B", unit_scale=True, total=total, initial=have, desc=label)
