"""Chat template rendering: SmolLM2's own template and the Gemma fallback
against the prompts the golden files were made from, plus the Jinja
environment's contract (sandbox, errors, tojson, tools, content parts)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from datetime import datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
GOLDEN = ROOT / "tests" / "golden"

try:
    from ember import chat_template as ct
except ImportError:
    # The module is pure Python: test it even where the extension isn't built.
    _spec = importlib.util.spec_from_file_location("ember_chat_template", ROOT / "pysrc" / "ember" / "chat_template.py")
    ct = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(ct)

TemplateError = ct.TemplateError
InvalidRequestError = ct.InvalidRequestError
render_chat = ct.render_chat

SMOLLM2_TEMPLATE = (FIXTURES / "smollm2-135m-instruct.chat_template.jinja").read_text(encoding="utf-8")
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def models_dir() -> Path:
    env = os.environ.get("EMBER_TEST_MODELS")
    return Path(env) if env else Path.home() / ".cache" / "ember" / "models"


def golden_chat_prompts(name: str, user_re: str) -> list[tuple[str, str]]:
    """(user question, full prompt) for each golden case that is a one-turn chat."""
    cases = json.loads((GOLDEN / name).read_text(encoding="utf-8"))["cases"]
    out = []
    for case in cases:
        m = re.search(user_re, case["prompt"], re.S)
        if m:
            out.append((m.group(1), case["prompt"]))
    return out


SMOLLM2_CHATS = golden_chat_prompts("smollm2-135m-instruct-q4_1.json", r"<\|im_start\|>user\n(.*?)<\|im_end\|>")
GEMMA_CHATS = golden_chat_prompts("gemma-3-270m-q4_k_m.json", r"<start_of_turn>user\n(.*?)<end_of_turn>")


def test_golden_files_have_chat_cases():
    assert len(SMOLLM2_CHATS) == 6
    assert len(GEMMA_CHATS) == 6


def test_fixture_is_the_models_template():
    path = models_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.skip(f"{path} not present")
    gguf = pytest.importorskip("gguf")
    field = gguf.GGUFReader(str(path)).fields["tokenizer.chat_template"]
    from_model = bytes(field.parts[field.data[0]]).decode("utf-8")
    assert SMOLLM2_TEMPLATE.rstrip("\n") == from_model.rstrip("\n")


@pytest.mark.parametrize("question,prompt", SMOLLM2_CHATS, ids=[q[:20] for q, _ in SMOLLM2_CHATS])
def test_smollm2_template_matches_golden(question, prompt):
    # The template supplies its default system prompt when none is given...
    assert render_chat(SMOLLM2_TEMPLATE, [{"role": "user", "content": question}]) == prompt
    # ...and renders an explicit one identically.
    explicit = [{"role": "system", "content": SMOLLM2_SYSTEM}, {"role": "user", "content": question}]
    assert render_chat(SMOLLM2_TEMPLATE, explicit) == prompt


def test_smollm2_multi_turn_and_no_generation_prompt():
    msgs = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    want = (
        f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
    )
    assert render_chat(SMOLLM2_TEMPLATE, msgs, add_generation_prompt=False) == want
    assert render_chat(SMOLLM2_TEMPLATE, msgs) == want + "<|im_start|>assistant\n"


@pytest.mark.parametrize("question,prompt", GEMMA_CHATS, ids=[q[:20] for q, _ in GEMMA_CHATS])
def test_gemma_fallback_matches_golden(question, prompt):
    msgs = [{"role": "user", "content": question}]
    # The golden prompts were tokenized with the model's BOS rule, so they
    # carry no BOS spelling of their own.
    assert render_chat(None, msgs, fallback="gemma") == prompt
    assert render_chat(None, msgs, fallback="gemma", bos_token="<bos>") == "<bos>" + prompt


def test_gemma_fallback_system_roles_and_trim():
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "  Hi  "},
        {"role": "assistant", "content": "Hello\n"},
        {"role": "user", "content": "More"},
    ]
    assert render_chat(None, msgs, fallback="gemma", bos_token="<bos>", add_generation_prompt=False) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello<end_of_turn>\n"
        "<start_of_turn>user\nMore<end_of_turn>\n"
    )


def test_chatml_fallback():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    want = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
    assert render_chat(None, msgs) == want + "<|im_start|>assistant\n"
    assert render_chat("", msgs, add_generation_prompt=False) == want
    assert render_chat(None, [{"role": "assistant", "content": None}], add_generation_prompt=False) == (
        "<|im_start|>assistant\n<|im_end|>\n"
    )


def test_unknown_fallback():
    with pytest.raises(ValueError, match="unknown fallback"):
        render_chat(None, [], fallback="llama9")


class Vocab:
    def __init__(self, *texts):
        self.texts = set(texts)

    def __contains__(self, t):
        return t in self.texts


def test_pick_fallback():
    assert ct.pick_fallback("gemma3", {"<bos>", "<start_of_turn>", "<end_of_turn>"}) == "gemma"
    assert ct.pick_fallback("llama", Vocab("<start_of_turn>")) == "gemma"
    assert ct.pick_fallback("llama", {"<|im_start|>"}) == "chatml"
    assert ct.pick_fallback("gemma3", set()) == "chatml"


def test_raise_exception_carries_message():
    tmpl = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}ok"
    assert render_chat(tmpl, [{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(TemplateError) as e:
        render_chat(tmpl, [{"role": "system", "content": "x"}])
    assert str(e.value) == "System role not supported"


def test_content_parts_are_joined_for_string_templates():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]}]
    out = render_chat(SMOLLM2_TEMPLATE, msgs)
    assert "<|im_start|>user\nHello\nworld<|im_end|>\n" in out
    assert msgs[0]["content"][0] == {"type": "text", "text": "Hello"}, "caller's messages untouched"


def test_content_parts_reach_templates_that_walk_them():
    tmpl = (
        "{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}"
        "{% else %}{% for p in m['content'] %}[{{ p['text'] }}]{% endfor %}{% endif %}{% endfor %}"
    )
    assert ct.template_takes_content_parts(tmpl)
    assert not ct.template_takes_content_parts(SMOLLM2_TEMPLATE)
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert render_chat(tmpl, msgs) == "[a][b]"


def test_normalize_messages():
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "x"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
        {"role": "user", "content": "plain"},
    ]
    out = ct.normalize_messages(msgs)
    assert out[0]["content"] == "x"
    assert out[1] == msgs[1] and out[1] is not msgs[1]
    assert out[2]["content"] == "plain"
    assert ct.normalize_messages(msgs, keep_parts=True)[0]["content"] == [{"type": "text", "text": "x"}]
    with pytest.raises(InvalidRequestError, match=r"messages\[0\]\.content\[1\].*image_url"):
        ct.normalize_messages([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}])
    with pytest.raises(InvalidRequestError, match=r"messages\[0\]"):
        ct.normalize_messages(["hello"])


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def test_tools_passed_through():
    tmpl = (
        "{% if tools %}{% for t in tools %}{{ t['function']['name'] }};{% endfor %}"
        "{{ tools[0] | tojson }}{% else %}no tools{% endif %}"
    )
    out = render_chat(tmpl, [], tools=TOOLS)
    assert out == "get_weather;" + json.dumps(TOOLS[0])
    assert render_chat(tmpl, []) == "no tools"
    # Like transformers, tools is defined (as None) when not given.
    assert render_chat("{{ tools is none }}", []) == "True"


def test_tojson_matches_transformers():
    value = {"b": "<tag> & 'quote'", "a": "café 日本"}
    assert render_chat("{{ v | tojson }}", [], extra_kwargs={"v": value}) == json.dumps(value, ensure_ascii=False)
    assert render_chat("{{ v | tojson(indent=2) }}", [], extra_kwargs={"v": value}) == json.dumps(
        value, ensure_ascii=False, indent=2
    )
    assert render_chat("{{ v | tojson(separators=(',', ':')) }}", [], extra_kwargs={"v": [1, {"k": 2}]}) == '[1,{"k":2}]'
    assert render_chat("{{ v | tojson(ensure_ascii=True) }}", [], extra_kwargs={"v": "é"}) == '"\\u00e9"'


def test_strftime_and_special_tokens():
    year = datetime.now().strftime("%Y")
    assert render_chat("{{ strftime_now('%Y') }}", []) == year
    assert render_chat("{{ bos_token }}|{{ eos_token }}", [], bos_token="<s>", eos_token="</s>") == "<s>|</s>"


def test_extra_kwargs():
    tmpl = "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}go"
    assert render_chat(tmpl, []) == "go"
    assert render_chat(tmpl, [], extra_kwargs={"enable_thinking": False}) == "<think></think>go"
    with pytest.raises(InvalidRequestError, match="messages"):
        render_chat(tmpl, [], extra_kwargs={"messages": []})


def test_whitespace_control_like_transformers():
    tmpl = "{% for m in messages %}\n    {% if m['role'] == 'user' %}\nU:{{ m['content'] }}\n    {% endif %}\n{% endfor %}"
    msgs = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert render_chat(tmpl, msgs) == "U:a\nU:b\n"


def test_loopcontrols_and_generation_tag():
    tmpl = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m['content'] }}{% endfor %}"
    assert render_chat(tmpl, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "a"
    tmpl = "{% for m in messages %}{% generation %}<{{ m['content'] }}>{% endgeneration %}{% endfor %}"
    assert render_chat(tmpl, [{"role": "assistant", "content": "x"}]) == "<x>"


@pytest.mark.parametrize(
    "tmpl",
    [
        "{{ ''.__class__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__.__init__.__globals__ }}",
        "{{ raise_exception.__globals__['__builtins__'] }}",
        "{% set _ = messages.append({'role': 'x'}) %}",
    ],
)
def test_sandbox_refuses(tmpl):
    with pytest.raises(TemplateError, match="unsafe"):
        render_chat(tmpl, [{"role": "user", "content": "x"}])


def test_syntax_error_names_line():
    with pytest.raises(TemplateError, match=r"syntax error at line 2"):
        render_chat("ok\n{% for m in messages %}", [])


def test_undefined_crash_is_template_error():
    with pytest.raises(TemplateError, match="undefined"):
        render_chat("{{ nothing.here }}", [])
    with pytest.raises(TemplateError, match="undefined"):
        render_chat("{{ messages[0]['content'] }}", [])
    # Merely printing an undefined name is empty, as in transformers.
    assert render_chat("[{{ nothing }}]", []) == "[]"


def test_other_render_failures_are_template_errors():
    # SmolLM2's template concatenates content, which fails on None.
    with pytest.raises(TemplateError, match="TypeError"):
        render_chat(SMOLLM2_TEMPLATE, [{"role": "assistant", "content": None}])


@pytest.mark.parametrize("template, bound", [
    ('{{ "x" * 100000000 }}', "repeats a value"),
    ('{% for i in range(100000) %}{{ "y" * 1000 }}{% endfor %}', "characters"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "looped more than"),
    ("{{ 10 ** 100000 }}", "power"),
    ("{% for i in range(10**7) %}{% endfor %}", "range of"),
])
def test_a_template_that_would_run_away_is_refused_naming_the_bound(template, bound):
    with pytest.raises(TemplateError, match=bound):
        render_chat(template, [{"role": "user", "content": "hi"}])


def test_a_request_may_not_set_the_templates_own_variables():
    for name in ("bos_token", "eos_token", "raise_exception", "strftime_now", "range", "namespace"):
        with pytest.raises(InvalidRequestError, match=f"chat_template_kwargs.{name}"):
            render_chat("{{ bos_token }}", [{"role": "user", "content": "hi"}], extra_kwargs={name: "x"})


def test_range_still_serves_the_templates_that_count():
    t = "{% for i in range(3) %}{{ i }}{% endfor %}|{{ range(2) | list | length }}|{{ (range(3) | reverse | list)[0] }}"
    assert render_chat(t, [{"role": "user", "content": "hi"}]) == "012|2|2"


def test_the_context_holds_what_llama_cpp_gives_its_templates():
    """llama.cpp gives every template today's date (Llama 3's date_string,
    firefunction's datetime) and enable_thinking true unless told; a
    request's kwargs replace them."""
    probe = "{{ date_string }}|{{ datetime }}|{{ enable_thinking }}"
    days = {(d.strftime("%d %b %Y"), d.strftime("%b %d %Y")) for d in (datetime.now(),)}
    shown = render_chat(probe, [{"role": "user", "content": "hi"}])
    days |= {(d.strftime("%d %b %Y"), d.strftime("%b %d %Y")) for d in (datetime.now(),)}  # midnight between
    date_string, stamp, thinking = shown.split("|")
    assert (date_string, stamp) in days and thinking == "True"
    kwargs = {"date_string": "26 Jul 2024", "enable_thinking": False}
    assert render_chat(probe, [{"role": "user", "content": "hi"}], extra_kwargs=kwargs).startswith("26 Jul 2024|")
    assert render_chat(probe, [{"role": "user", "content": "hi"}], extra_kwargs=kwargs).endswith("|False")


def test_the_thought_keeping_switch_reaches_each_templates_own_name():
    """llama.cpp's preserve_reasoning reaches templates under their own
    names (GLM's clear_thinking, Nemotron's truncate_history_thinking,
    DeepSeek V4's drop_thinking, LFM's preserve_thinking), and the effort
    as reasoning_strength too; a name the request gives itself wins."""
    probe = ("{{ preserve_thinking }}|{{ clear_thinking }}|{{ truncate_history_thinking }}|{{ drop_thinking }}|"
             "{{ reasoning_strength | default('-') }}")
    hi = [{"role": "user", "content": "hi"}]
    assert render_chat(probe, hi, extra_kwargs={"preserve_reasoning": False}) == "False|True|True|True|-"
    assert render_chat(probe, hi, extra_kwargs={"preserve_reasoning": True, "reasoning_effort": "low"}) == \
        "True|False|False|False|low"
    assert render_chat(probe, hi, extra_kwargs={"preserve_reasoning": True, "drop_thinking": True}).split("|")[3] == \
        "True"
    assert render_chat("{{ clear_thinking is defined }}", hi) == "False"
