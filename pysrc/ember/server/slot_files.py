"""Saved slots' files, confined to `--slot-save-path`: a name is a plain file
name of that folder (no separators, no dot or dash first), opened relative to
the folder without following a symbolic link, so a save or restore never
reaches a file outside it; an existing file is replaced only when the request
says so, and then by a rename, which replaces a link itself rather than what
it points at."""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat

from ember.server.errors import ApiError

__all__ = ["check_name", "read_slot_file", "write_slot_file"]

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")
#: A saved slot's file is read whole; past this it is not one of ours.
MAX_BYTES = 64 << 30


def _bad(why: str, status: int = 400) -> ApiError:
    return ApiError(status, f"filename: {why}", param="filename")


def check_name(filename) -> str:
    if not isinstance(filename, str):
        raise _bad("required, a file name in the slot folder")
    if not _NAME.fullmatch(filename):
        raise _bad(f"{filename!r} is not a plain file name (letters, digits, '.', '_', '-', at most 200, not "
                   "starting with '.' or '-'; no folders)")
    return filename


def _folder(folder: str) -> int:
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise ApiError(500, f"the slot folder {folder} cannot be opened ({e.strerror})") from None


def write_slot_file(folder: str, name: str, data: bytes, overwrite: bool) -> None:
    """Writes `data` as `name` in `folder`: a new file, or with `overwrite`
    a replacement of a file there (never of a folder or through a link)."""
    dfd = _folder(folder)
    try:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None:
            if stat.S_ISDIR(st.st_mode):
                raise _bad(f"{name!r} is a folder in the slot folder")
            if not overwrite:
                raise _bad(f"{name!r} exists; set \"overwrite\": true to replace it", 409)
        # Written under a fresh name, then renamed over: a reader never sees
        # half a file, and a link at `name` is replaced, not followed.
        tmp = f".{name}.{secrets.token_hex(6)}.part"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            if st is None:
                try:
                    os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
                except FileExistsError:
                    raise _bad(f"{name!r} exists; set \"overwrite\": true to replace it", 409) from None
                os.unlink(tmp, dir_fd=dfd)
            else:
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
    except OSError as e:
        raise _bad(f"cannot write {name!r} ({e.strerror or e})") from None
    finally:
        os.close(dfd)


def read_slot_file(folder: str, name: str) -> bytes:
    """The bytes of `name` in `folder`: a regular file there, not a link."""
    dfd = _folder(folder)
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
        except FileNotFoundError:
            raise _bad(f"no file {name!r} in the slot folder") from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _bad(f"{name!r} is a symbolic link; saved slots are read from regular files only") from None
            raise _bad(f"cannot read {name!r} ({e.strerror or e})") from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise _bad(f"{name!r} is not a regular file")
            if st.st_size > MAX_BYTES:
                raise _bad(f"{name!r} is {st.st_size} bytes, more than a saved slot can be")
            return f.read()
    except IsADirectoryError:
        raise _bad(f"{name!r} is a folder in the slot folder") from None
    finally:
        os.close(dfd)
