"""Reasoning split: which markers a template uses, whether the prompt opened a
thought, the streamed and whole splits (equal for every chunking), the request
fields that steer thinking, and the thought budget."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


from ember import chat_template as ct
from ember import reasoning as rs

THINK = rs.THINK_TAGS
GEMMA4 = rs.GEMMA4_CHANNEL
InvalidRequestError = rs.InvalidRequestError

# Small templates in the shape of the real ones, down to the lines that matter here.
QWEN3 = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and '</think>' in message.content %}"
    "{{- '<|im_start|>assistant\\n' + message.content.split('</think>')[-1].lstrip('\\n') + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
# Qwen3's thinking-only releases open the thought in the generation prompt.
QWEN3_THINKING = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)
DEEPSEEK_R1 = (
    "{{ bos_token }}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{{ '<｜User｜>' + message.content }}"
    "{%- elif message.role == 'assistant' %}"
    "{{ '<｜Assistant｜>' + message.content.split('</think>')[-1] + '<｜end▁of▁sentence｜>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{%- endif %}"
)
GEMMA4_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if enable_thinking is defined and enable_thinking %}{{ '<|turn>system\\n<|think|>\\n<turn|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- set role = 'model' if message.role == 'assistant' else message.role %}"
    "{{ '<|turn>' + role + '\\n' + message.content.split('<channel|>')[-1] | trim + '<turn|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{ '<|turn>model\\n' }}"
    "{%- if not enable_thinking | default(false) %}{{ '<|channel>thought\\n<channel|>' }}{%- endif %}"
    "{%- endif %}"
)

USER = [{"role": "user", "content": "What is 2+2?"}]


def render(template: str, messages: list[dict] = USER, **kwargs: object) -> str:
    return ct.render_chat(template, messages, bos_token="<bos>", extra_kwargs=kwargs or None)


def stream(fmt: rs.ReasoningFormat, chunks: list[str], in_thought: bool) -> tuple[str, str]:
    splitter = rs.ReasoningSplitter(fmt, in_thought)
    pieces = [p for chunk in chunks for p in splitter.feed(chunk)] + splitter.finish()
    assert all(kind in ("reasoning", "content") and text for kind, text in pieces)
    return ("".join(t for k, t in pieces if k == "reasoning"), "".join(t for k, t in pieces if k == "content"))


def whole(fmt: rs.ReasoningFormat, text: str, in_thought: bool) -> tuple[str, str]:
    reasoning, content = rs.split_reasoning(fmt, text, in_thought)
    return reasoning or "", content


def reference(fmt: rs.ReasoningFormat, text: str, in_thought: bool) -> tuple[str | None, str]:
    """The documented rule, written the obvious way, to check the state machine against."""
    if in_thought:
        body = text
    else:
        lead = text.lstrip()
        if not lead.startswith(fmt.opener):
            return None, text
        body = lead[len(fmt.opener):]
    end = body.find(fmt.closer)
    if end < 0:
        return body.strip(), ""
    return body[:end].strip(), body[end + len(fmt.closer):].lstrip()


# ---- detection and the prompt's open thought ----------------------------------------------------


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (QWEN3, THINK),
        (QWEN3_THINKING, THINK),
        (DEEPSEEK_R1, THINK),
        (GEMMA4_TEMPLATE, GEMMA4),
        (ct.FALLBACKS["chatml"], None),
        (ct.FALLBACKS["gemma"], None),
        # GPT-OSS spells its channels differently: not Gemma 4's markers.
        ("{{ '<|start|>assistant<|channel|>analysis<|message|>' }}", None),
    ],
)
def test_detect_reasoning_reads_the_template(template: str, expected: rs.ReasoningFormat | None) -> None:
    assert rs.detect_reasoning(template, None) == expected
    assert rs.detect_reasoning(template, render(template)) == expected


def test_detect_reasoning_ignores_markers_the_client_wrote() -> None:
    prompt = render(ct.FALLBACKS["chatml"], [{"role": "user", "content": "what does <think> do?"}])
    assert "<think>" in prompt
    assert rs.detect_reasoning(ct.FALLBACKS["chatml"], prompt) is None


def test_detect_reasoning_breaks_a_tie_by_the_prompt() -> None:
    both = "{{ '<think>' if flavour == 'think' else '<|channel>thought\\n' }}"
    assert rs.detect_reasoning(both, None) == GEMMA4
    assert rs.detect_reasoning(both, render(both, flavour="think")) == THINK
    assert rs.detect_reasoning(both, render(both, flavour="channel")) == GEMMA4
    assert rs.detect_reasoning(both, "no markers at all") == GEMMA4


@pytest.mark.parametrize(
    ("template", "kwargs", "expected"),
    [
        (QWEN3, {}, False),
        (QWEN3, {"enable_thinking": True}, False),
        (QWEN3, {"enable_thinking": False}, False),  # the closed empty thought is not an open one
        (QWEN3_THINKING, {}, True),
        (DEEPSEEK_R1, {}, True),
        (GEMMA4_TEMPLATE, {}, False),
        (GEMMA4_TEMPLATE, {"enable_thinking": True}, False),
    ],
)
def test_starts_in_thought_from_the_rendered_prompt(template: str, kwargs: dict, expected: bool) -> None:
    prompt = render(template, **kwargs)
    fmt = rs.detect_reasoning(template, prompt)
    assert rs.starts_in_thought(fmt, prompt) is expected


def test_qwen3_thinking_off_writes_a_closed_empty_thought() -> None:
    prompt = render(QWEN3, enable_thinking=False)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not rs.starts_in_thought(THINK, prompt)


def test_starts_in_thought_only_at_the_end_of_the_prompt() -> None:
    messages = [{"role": "user", "content": "I typed <think>\n"}]
    assert not rs.starts_in_thought(THINK, render(QWEN3, messages))
    assert rs.starts_in_thought(THINK, render(QWEN3_THINKING, messages))
    assert not rs.starts_in_thought(None, render(QWEN3_THINKING))


def test_starts_in_thought_gemma4_forced_open() -> None:
    assert rs.starts_in_thought(GEMMA4, "<|turn>model\n<|channel>thought\n")
    assert not rs.starts_in_thought(GEMMA4, "<|turn>model\n<|channel>thought\n<channel|>")


# ---- the split ----------------------------------------------------------------------------------

CASES = [
    # Qwen3: thought then answer, with the template's newlines around the markers.
    ("qwen3", THINK, "<think>\nLet me add.\n</think>\n\nThe answer is 4.", False, "Let me add.", "The answer is 4."),
    ("qwen3 open at end", THINK, "<think>\nStill adding, 2 and", False, "Still adding, 2 and", ""),
    ("qwen3 open at end, trailing newline", THINK, "<think>\nhmm\n\n", False, "hmm", ""),
    ("no thought", THINK, "The answer is 4.", False, None, "The answer is 4."),
    ("no thought, raw whitespace kept", THINK, "\n  Four.\n", False, None, "\n  Four.\n"),
    ("thinking off: empty thought in the prompt", THINK, "Four.", False, None, "Four."),
    ("empty thought written", THINK, "<think>\n\n</think>\n\nFour.", False, "", "Four."),
    ("opened in the prompt", THINK, "Two and two.\n</think>\n\nFour.", True, "Two and two.", "Four."),
    ("opened in the prompt, closed at once", THINK, "\n</think>\n\nFour.", True, "", "Four."),
    ("opened in the prompt, nothing generated", THINK, "", True, "", ""),
    ("opened in the prompt, never closed", THINK, "Two and\n", True, "Two and", ""),
    ("whitespace before the opener", THINK, "\n\n<think>x</think>y", False, "x", "y"),
    ("inner whitespace kept", THINK, "<think>\na\n\n  b\n</think>\n\nc\n\nd\n", False, "a\n\n  b", "c\n\nd\n"),
    ("a later <think> is content", THINK, "Write <think> to think. <think>x</think>", False, None,
     "Write <think> to think. <think>x</think>"),
    ("a <think> in the answer is content", THINK, "<think>a</think>b <think>c</think>", False, "a",
     "b <think>c</think>"),
    ("a stray closer in plain output is content", THINK, "x</think>y", False, None, "x</think>y"),
    ("partial opener at the end", THINK, "  <thi", False, None, "  <thi"),
    ("partial closer at the end", THINK, "<think>abc\n</thi", False, "abc\n</thi", ""),
    ("lookalike opener", THINK, "<thinking>x</thinking>", False, None, "<thinking>x</thinking>"),
    # DeepSeek R1: the first releases wrote the opener, later templates open it in the prompt.
    ("r1", THINK, "<think>\nOkay, the user asks 2+2.\n</think>\n\n**4**", False, "Okay, the user asks 2+2.", "**4**"),
    ("r1 opened in the prompt", THINK, "Okay, 2+2.\n</think>\n\n**4**", True, "Okay, 2+2.", "**4**"),
    # Gemma 4's thought channel.
    ("gemma4", GEMMA4, "<|channel>thought\nAdding.\n<channel|>It is 4.", False, "Adding.", "It is 4."),
    ("gemma4 no newline", GEMMA4, "<|channel>thoughtAdding.<channel|>It is 4.", False, "Adding.", "It is 4."),
    ("gemma4 open at end", GEMMA4, "<|channel>thought\nAdding", False, "Adding", ""),
    ("gemma4 no thought", GEMMA4, "It is 4.", False, None, "It is 4."),
    ("gemma4 other channel", GEMMA4, "<|channel>final\nIt is 4.", False, None, "<|channel>final\nIt is 4."),
    ("gemma4 opened in the prompt", GEMMA4, "Adding.\n<channel|>It is 4.", True, "Adding.", "It is 4."),
]


@pytest.mark.parametrize(("fmt", "text", "in_thought", "reasoning", "content"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_split(fmt: rs.ReasoningFormat, text: str, in_thought: bool, reasoning: str | None, content: str) -> None:
    assert rs.split_reasoning(fmt, text, in_thought) == (reasoning, content)
    assert reference(fmt, text, in_thought) == (reasoning, content)
    assert stream(fmt, list(text), in_thought) == (reasoning or "", content)


def test_markers_never_leave() -> None:
    for _, fmt, text, in_thought, _, _ in CASES:
        reasoning, content = rs.split_reasoning(fmt, text, in_thought)
        if reasoning is not None and fmt.closer in text:
            assert fmt.opener not in reasoning and fmt.closer not in reasoning
            assert not content.startswith(fmt.closer)


@pytest.mark.parametrize(("fmt", "text", "in_thought"), [(c[1], c[2], c[3]) for c in CASES], ids=[c[0] for c in CASES])
def test_every_split_point_and_pair(fmt: rs.ReasoningFormat, text: str, in_thought: bool) -> None:
    expected = whole(fmt, text, in_thought)
    n = len(text)
    for i in range(n + 1):
        assert stream(fmt, [text[:i], text[i:]], in_thought) == expected, i
        for j in range(i, n + 1):
            assert stream(fmt, [text[:i], text[i:j], text[j:]], in_thought) == expected, (i, j)


def test_stream_releases_as_soon_as_it_can() -> None:
    splitter = rs.ReasoningSplitter(THINK, False)
    assert splitter.feed("\n") == []  # could still be whitespace before an opener
    assert splitter.feed("<thi") == []
    assert splitter.feed("nk>\n") == []
    assert splitter.thought_seen and splitter.in_thought
    assert splitter.feed("Two") == [("reasoning", "Two")]
    assert splitter.feed(" and two\n") == [("reasoning", " and two")]  # the newline may precede the closer
    assert splitter.feed("\n</thi") == []
    assert splitter.feed("nk>") == []
    assert splitter.thought_over
    assert splitter.feed("\n\n") == []
    assert splitter.feed("Four") == [("content", "Four")]
    assert splitter.feed(" <think>\n") == [("content", " <think>\n")]
    assert splitter.finish() == []


def test_stream_releases_a_held_tail_that_was_not_a_marker() -> None:
    splitter = rs.ReasoningSplitter(THINK, True)
    assert splitter.feed("a </") == [("reasoning", "a")]
    assert splitter.feed("b>") == [("reasoning", " </b>")]
    splitter = rs.ReasoningSplitter(THINK, False)
    assert splitter.feed("<th") == []
    assert splitter.feed("ere") == [("content", "<there")]
    assert not splitter.thought_seen and splitter.thought_over


def test_stream_without_thought_passes_through() -> None:
    splitter = rs.ReasoningSplitter(GEMMA4, False)
    assert splitter.feed("Hello") == [("content", "Hello")]
    assert splitter.feed("<|channel>thought\n") == [("content", "<|channel>thought\n")]
    assert splitter.finish() == []


FRAGMENTS = ["<think>", "</think>", "<th", "ink>", "</", "think", ">", "<|channel>", "thought", "<channel|>",
             "<|chan", "nel|>", "<", "\n", "\n\n", " ", "\t", "a", "bc", "Four.", "é", "\u3000"]


@pytest.mark.parametrize("seed", range(40))
def test_random_texts_and_chunkings_match_the_whole_split(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(25):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 14)))
        for fmt in (THINK, GEMMA4):
            for in_thought in (False, True):
                expected = rs.split_reasoning(fmt, text, in_thought)
                assert expected == reference(fmt, text, in_thought), text
                for _ in range(8):
                    cuts = sorted(rng.randint(0, len(text)) for _ in range(rng.randint(0, 6)))
                    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
                    assert stream(fmt, chunks, in_thought) == (expected[0] or "", expected[1]), (text, chunks)


@pytest.mark.parametrize("seed", range(10))
def test_random_chunkings_of_realistic_outputs(seed: int) -> None:
    rng = random.Random(1000 + seed)
    for _, fmt, text, in_thought, reasoning, content in CASES:
        for _ in range(20):
            cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(1, 8))))
            chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
            assert stream(fmt, chunks, in_thought) == (reasoning or "", content), chunks


# ---- request fields -----------------------------------------------------------------------------


def test_resolve_defaults_keep_the_template_default() -> None:
    req = rs.resolve_reasoning_request({})
    assert req == rs.ReasoningRequest(template_kwargs={}, enable_thinking=None, effort=None, budget=-1,
                                      reasoning_format="auto")
    assert req.split and not req.raw_content
    nulls = {"chat_template_kwargs": None, "reasoning_effort": None, "reasoning_budget": None, "reasoning_format": None}
    assert rs.resolve_reasoning_request(nulls) == req


@pytest.mark.parametrize(
    ("body", "enable"),
    [
        ({"reasoning_effort": "none"}, False),
        *[({"reasoning_effort": e}, True) for e in ("minimal", "low", "medium", "high", "xhigh")],
        ({"chat_template_kwargs": {"enable_thinking": True}}, True),
        ({"chat_template_kwargs": {"enable_thinking": False}}, False),
        # An explicit enable_thinking wins over the effort, either way.
        ({"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}}, True),
        ({"reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": False}}, False),
    ],
)
def test_resolve_enable_thinking(body: dict, enable: bool) -> None:
    req = rs.resolve_reasoning_request(body)
    assert req.enable_thinking is enable
    assert req.template_kwargs["enable_thinking"] is enable
    assert req.effort == body.get("reasoning_effort")


def test_resolve_keeps_other_kwargs_and_leaves_the_body_alone() -> None:
    kwargs = {"custom": 1}
    req = rs.resolve_reasoning_request({"chat_template_kwargs": kwargs, "reasoning_effort": "none"})
    assert req.template_kwargs == {"custom": 1, "enable_thinking": False}
    assert kwargs == {"custom": 1}


def test_effort_none_renders_the_closed_empty_thought() -> None:
    req = rs.resolve_reasoning_request({"reasoning_effort": "none"})
    prompt = render(QWEN3, **req.template_kwargs)
    assert prompt.endswith("<think>\n\n</think>\n\n")
    assert not rs.starts_in_thought(rs.detect_reasoning(QWEN3, prompt), prompt)


@pytest.mark.parametrize("budget", [-1, 0, 1, 4096])
def test_resolve_budget(budget: int) -> None:
    assert rs.resolve_reasoning_request({"reasoning_budget": budget}).budget == budget


@pytest.mark.parametrize("fmt", ["none", "auto", "deepseek", "deepseek-legacy"])
def test_resolve_format(fmt: str) -> None:
    req = rs.resolve_reasoning_request({"reasoning_format": fmt})
    assert req.reasoning_format == fmt
    assert req.split is (fmt != "none")
    assert req.raw_content is (fmt == "deepseek-legacy")


@pytest.mark.parametrize(
    ("body", "field", "quoted"),
    [
        ({"reasoning_effort": "extreme"}, "reasoning_effort", '"extreme"'),
        ({"reasoning_effort": "High"}, "reasoning_effort", '"High"'),
        ({"reasoning_effort": 3}, "reasoning_effort", "3"),
        ({"reasoning_effort": ["low"]}, "reasoning_effort", "an array"),
        ({"reasoning_budget": -2}, "reasoning_budget", "-2"),
        ({"reasoning_budget": 1.5}, "reasoning_budget", "1.5"),
        ({"reasoning_budget": 10.0}, "reasoning_budget", "10.0"),
        ({"reasoning_budget": True}, "reasoning_budget", "true"),
        ({"reasoning_budget": "10"}, "reasoning_budget", '"10"'),
        ({"reasoning_format": "raw"}, "reasoning_format", '"raw"'),
        ({"reasoning_format": 1}, "reasoning_format", "1"),
        ({"chat_template_kwargs": "enable_thinking"}, "chat_template_kwargs", '"enable_thinking"'),
        ({"chat_template_kwargs": [1]}, "chat_template_kwargs", "an array"),
        ({"chat_template_kwargs": {"enable_thinking": "true"}}, "chat_template_kwargs.enable_thinking", '"true"'),
        ({"chat_template_kwargs": {"enable_thinking": 1}}, "chat_template_kwargs.enable_thinking", "1"),
        ({"chat_template_kwargs": {"enable_thinking": None}}, "chat_template_kwargs.enable_thinking", "null"),
    ],
)
def test_resolve_refuses_by_name(body: dict, field: str, quoted: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        rs.resolve_reasoning_request(body)
    message = str(err.value)
    assert message.startswith(f"{field}: ")
    assert message.endswith(f"got {quoted}")


# ---- thought budget -----------------------------------------------------------------------------


def run_budget(fmt: rs.ReasoningFormat, in_thought: bool, budget: int, tokens: list[str]) -> tuple[str, int | None]:
    """Plays the engine: feeds tokens, appends a forced close where told (the
    engine then writes it instead of drawing), and stops drawing reasoning
    tokens after it. Returns the output and how many tokens had been fed when
    the close was forced (None when it never was)."""
    tracker = rs.ThoughtBudget(fmt, in_thought, budget)
    forced = tracker.start()
    if forced is not None:
        return forced, 0
    out = ""
    for i, token in enumerate(tokens):
        out += token
        forced = tracker.feed(token)
        if forced is not None:
            return out + forced, i + 1
    return out, None


def test_budget_unrestricted_never_forces() -> None:
    budget = rs.ThoughtBudget(THINK, True, -1)
    assert budget.start() is None
    assert all(budget.feed("word ") is None for _ in range(10_000))


def test_budget_zero_in_thought_closes_before_the_first_token() -> None:
    budget = rs.ThoughtBudget(THINK, True, 0)
    assert budget.start() == "\n</think>\n\n"
    assert budget.feed("\n</think>\n\n") is None  # feeding the forced text back is harmless
    assert budget.feed("Four") is None
    assert rs.split_reasoning(THINK, "\n</think>\n\nFour", True) == ("", "Four")


def test_budget_zero_when_the_model_opens_the_thought() -> None:
    budget = rs.ThoughtBudget(THINK, False, 0)
    assert budget.start() is None
    assert budget.feed("<think>") == "\n</think>\n\n"
    assert budget.feed("x") is None


def test_budget_counts_n_tokens_of_thought() -> None:
    budget = rs.ThoughtBudget(THINK, True, 3)
    assert budget.start() is None
    assert [budget.feed(t) for t in ("Two", " and", " two")] == [None, None, "\n</think>\n\n"]
    assert budget.feed(" is") is None


def test_budget_count_starts_at_the_opener() -> None:
    tokens = ["\n", "<think>", "\n", "a", " b", " c", "</think>", "ANSWER"]
    out, at = run_budget(THINK, False, 2, tokens)
    assert at == 4  # "\n" and "<think>" are not thought; "\n" and "a" are its two tokens
    assert rs.split_reasoning(THINK, out, False) == ("a", "")


def test_budget_opener_split_across_tokens_gemma4() -> None:
    budget = rs.ThoughtBudget(GEMMA4, False, 2)
    assert budget.start() is None
    assert [budget.feed(t) for t in ("<|channel>", "thought", "\n", "Adding")] == [None, None, None, "\n<channel|>"]
    out, at = run_budget(GEMMA4, False, 2, ["<|channel>", "thought", "\n", "Adding", " more"])
    assert at == 4
    assert rs.split_reasoning(GEMMA4, out, False) == ("Adding", "")


def test_budget_model_closes_early() -> None:
    for budget_n in (3, 5, 100):
        budget = rs.ThoughtBudget(THINK, True, budget_n)
        assert [budget.feed(t) for t in ("a", "</think>", "\n\n")] == [None, None, None]
        assert all(budget.feed("answer ") is None for _ in range(200))


def test_budget_model_answers_without_a_thought() -> None:
    budget = rs.ThoughtBudget(THINK, False, 0)
    assert budget.start() is None
    assert budget.feed("Four") is None
    assert budget.feed("<think>") is None  # a later <think> is content, not a thought to budget


def test_budget_closed_in_the_prompt_is_ignored() -> None:
    # Thinking off: the template closed the thought, the output starts with the answer.
    prompt = render(QWEN3, enable_thinking=False)
    budget = rs.ThoughtBudget(THINK, rs.starts_in_thought(THINK, prompt), 0)
    assert budget.start() is None
    assert budget.feed("Four") is None


@pytest.mark.parametrize("n", [1, 2, 7])
def test_budget_forced_output_splits_into_n_tokens_of_reasoning(n: int) -> None:
    tokens = [f"t{i} " for i in range(20)]
    out, at = run_budget(THINK, True, n, tokens)
    assert at == n
    assert rs.split_reasoning(THINK, out, True) == ("".join(tokens[:n]).rstrip(), "")


# ---- constrained answers ------------------------------------------------------------------------


def test_close_for_constrained_answer() -> None:
    assert rs.close_for_constrained_answer(THINK, True) == "\n</think>\n\n"
    assert rs.close_for_constrained_answer(GEMMA4, True) == "\n<channel|>"
    assert rs.close_for_constrained_answer(THINK, False) == ""
    assert rs.close_for_constrained_answer(None, False) == ""
    answer = rs.close_for_constrained_answer(THINK, True) + '{"sum": 4}'
    assert rs.split_reasoning(THINK, answer, True) == ("", '{"sum": 4}')
