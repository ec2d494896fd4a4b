"""A model split over several files (llama.cpp's gguf-split layout,
NAME-00001-of-0000N.gguf) is loaded from its first part as one model, and
answers as the whole file does; a part missing or opened out of order is
refused by name."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import ember
from ember import _native
from paths import FIXTURES

sys.path.insert(0, str(FIXTURES))
import make_tiny_models  # noqa: E402
from split_gguf import split  # noqa: E402


@pytest.mark.parametrize("arch", ["llama", "qwen35"])
def test_a_split_model_answers_as_the_whole_file(arch, tmp_path):
    whole = make_tiny_models.ensure(arch)
    parts = split(whole, tmp_path, tensors_per_part=8)
    assert len(parts) > 2 and parts[0].name.endswith("-00001-of-%05d.gguf" % len(parts))
    a, b = ember.Model(str(whole)), ember.Model(str(parts[0]))
    ids = a.tokenize("The parts are one model.")
    assert np.array_equal(a.hidden_states(ids), b.hidden_states(ids))
    assert a.generate("Once", 8, temperature=0) == b.generate("Once", 8, temperature=0)
    info = _native.inspect(str(parts[0]))
    assert len(info["tensors"]) == len(_native.inspect(str(whole))["tensors"])


def test_a_missing_or_misplaced_part_is_refused_by_name(tmp_path):
    parts = split(make_tiny_models.ensure("llama"), tmp_path, tensors_per_part=8)
    with pytest.raises(ember.errors.ModelLoadError, match="open the first, NAME-00001-of"):
        ember.Model(str(parts[1]))
    parts[2].unlink()
    with pytest.raises(ember.errors.ModelLoadError, match=parts[2].name):
        ember.Model(str(parts[0]))
