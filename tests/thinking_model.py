"""A model that thinks, for the tests of every route that splits a thought
from the answer: a tiny random-weight Qwen3 whose file carries a Qwen3-style
template that opens `<think>` in the prompt (or closes it at once when
`enable_thinking` is false). Random weights write nothing sensible, so the
grammars below steer the output through a thought and an answer: what such a
test shows is the split, not the model."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

from server_process import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
import make_tiny_models  # noqa: E402

QWEN3_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- else -%}{{- '<think>\\n' -}}{%- endif -%}{%- endif -%}"
)
#: The thought, its close as Qwen3 writes it, then the answer.
STEERED = r'''root ::= "Let me think" [a-z ]{0,6} "\n</think>\n\n" "The answer" [a-z ]{0,6}'''
#: The answer alone, for a prompt whose thought is already closed.
ANSWER_ONLY = r'''root ::= "The answer" [a-z ]{0,6}'''


def build(path: Path) -> Path:
    """Writes the thinking model to `path`."""
    make_tiny_models.build("qwen3", path, chat_template=QWEN3_TEMPLATE)
    return path


@contextmanager
def serving(directory: Path):
    """A server of the thinking model, its file written into `directory`."""
    with ServerProcess(build(directory / "tiny-qwen3-think.gguf")) as s:
        yield s
