"""Saved slots' files (`ember.server.slot_files`): confined to the slot
folder, never through a link, an existing file replaced only when asked.
Every path here is in a folder the test made; the "outside" file is a file
of that temporary folder too, beside the slot folder."""

from __future__ import annotations

import os

import pytest

from ember.server.errors import ApiError
from ember.server.slot_files import check_name, read_slot_file, write_slot_file


@pytest.fixture
def folders(tmp_path):
    slots = tmp_path / "slots"
    slots.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("not the server's")
    return slots, outside


@pytest.mark.parametrize("name", ["...", ".hidden", "-rf", "a/b", "/abs", "..", ".", "", "a\\b", "x" * 201, "é"])
def test_only_plain_names_of_the_folder_are_taken(name):
    with pytest.raises(ApiError) as e:
        check_name(name)
    assert e.value.status == 400 and e.value.param == "filename"


def test_a_link_to_a_file_outside_is_never_followed(folders):
    slots, outside = folders
    os.symlink(outside, slots / "link.bin")
    with pytest.raises(ApiError) as e:
        write_slot_file(str(slots), "link.bin", b"slot", overwrite=False)
    assert e.value.status == 409
    with pytest.raises(ApiError, match="symbolic link"):
        read_slot_file(str(slots), "link.bin")
    write_slot_file(str(slots), "link.bin", b"slot", overwrite=True)
    assert outside.read_text() == "not the server's"  # the link was replaced, not written through
    assert not (slots / "link.bin").is_symlink() and (slots / "link.bin").read_bytes() == b"slot"


def test_a_link_to_a_folder_is_refused_not_a_traceback(folders, tmp_path):
    slots, _ = folders
    other = tmp_path / "elsewhere"
    other.mkdir()
    os.symlink(other, slots / "dir-link")
    with pytest.raises(ApiError, match="symbolic link"):
        read_slot_file(str(slots), "dir-link")
    with pytest.raises(ApiError) as e:
        write_slot_file(str(slots), "dir-link", b"slot", overwrite=False)
    assert e.value.status == 409
    (slots / "sub").mkdir()
    with pytest.raises(ApiError, match="is a folder"):
        write_slot_file(str(slots), "sub", b"slot", overwrite=True)
    with pytest.raises(ApiError, match="is a folder"):
        read_slot_file(str(slots), "sub")
    assert list(other.iterdir()) == []


def test_an_existing_file_is_replaced_only_when_asked(folders):
    slots, _ = folders
    write_slot_file(str(slots), "a.bin", b"first", overwrite=False)
    with pytest.raises(ApiError) as e:
        write_slot_file(str(slots), "a.bin", b"second", overwrite=False)
    assert e.value.status == 409 and "overwrite" in e.value.message
    assert read_slot_file(str(slots), "a.bin") == b"first"
    write_slot_file(str(slots), "a.bin", b"second", overwrite=True)
    assert read_slot_file(str(slots), "a.bin") == b"second"
    assert sorted(p.name for p in slots.iterdir()) == ["a.bin"]  # no temporary left behind


def test_a_missing_file_is_named(folders):
    slots, _ = folders
    with pytest.raises(ApiError, match="no file 'nope.bin'"):
        read_slot_file(str(slots), "nope.bin")
