"""The reasoning split on OpenAI's chat route (`ember.server.protocols.openai`
over `ember.reasoning`), end to end, on a tiny random-weight Qwen3 model whose
file carries a Qwen3-style template that opens `<think>` in the prompt. Random
weights write nothing sensible, so a grammar steers the output through a
thought and an answer: what is tested is the split, streamed and whole, not
the model."""

from __future__ import annotations

import json
import sys

import pytest

import thinking_model
from paths import FIXTURES
from server_process import ServerProcess, error_of, http, sse, thought_and_answer
from thinking_model import ANSWER_ONLY, STEERED

sys.path.insert(0, str(FIXTURES))
import make_tiny_models  # noqa: E402

CHAT = [{"role": "user", "content": "Why?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = tmp_path_factory.mktemp("models") / "tiny-qwen3-think.gguf"
    thinking_model.build(model)
    with ServerProcess(model) as s:
        yield s


def chat(server, **body) -> dict:
    status, _, raw = http(server.url + "/v1/chat/completions", {"messages": CHAT, "max_tokens": 40, "temperature": 0, **body})
    assert status == 200, raw
    return json.loads(raw)["choices"][0]


def test_the_thought_leaves_in_reasoning_content(server):
    c = chat(server, grammar=STEERED)
    msg = c["message"]
    assert msg["reasoning_content"].startswith("Let me think"), msg
    assert msg["content"].startswith("The answer"), msg
    for marker in ("<think>", "</think>"):
        assert marker not in msg["content"] and marker not in msg["reasoning_content"]
    assert not msg["reasoning_content"].endswith("\n") and not msg["content"].startswith("\n")


def test_the_thought_streams_as_reasoning_deltas(server):
    status, _, raw = http(server.url + "/v1/chat/completions",
                          {"messages": CHAT, "max_tokens": 40, "grammar": STEERED, "stream": True, "temperature": 0})
    assert status == 200
    deltas = [e["choices"][0]["delta"] for e in sse(raw) if isinstance(e, dict) and e.get("choices")]
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    whole = chat(server, grammar=STEERED)["message"]
    assert (reasoning, content) == (whole["reasoning_content"], whole["content"])
    # Every reasoning delta comes before the first answer text.
    kinds = ["r" if d.get("reasoning_content") else "c" for d in deltas if d.get("reasoning_content") or d.get("content")]
    assert kinds == sorted(kinds, key=lambda k: k == "c"), kinds


def test_a_thought_left_open_is_reasoning_to_the_end(server):
    c = chat(server, grammar=r'''root ::= "Still thinking" [a-z ]{20,30}''', max_tokens=6)
    assert c["finish_reason"] == "length"
    assert c["message"]["reasoning_content"].startswith("Still thinking") and c["message"]["content"] == ""


def test_thinking_turned_off_through_the_template(server):
    for body in ({"chat_template_kwargs": {"enable_thinking": False}}, {"reasoning_effort": "none"}):
        msg = chat(server, grammar=ANSWER_ONLY, **body)["message"]
        assert msg["content"].startswith("The answer") and "reasoning_content" not in msg, msg


def test_budget_zero_closes_the_thought_at_once(server):
    msg = chat(server, grammar=ANSWER_ONLY, reasoning_budget=0)["message"]
    assert msg["content"].startswith("The answer") and msg.get("reasoning_content") in (None, ""), msg


def test_a_json_answer_closes_an_open_thought(server):
    msg = chat(server, response_format={"type": "json_object"})["message"]
    assert msg.get("reasoning_content") in (None, "")
    assert msg["content"].startswith("{"), msg


def test_reasoning_format_none_returns_the_raw_text(server):
    msg = chat(server, grammar=STEERED, reasoning_format="none")["message"]
    assert msg["content"].startswith("Let me think") and "</think>" in msg["content"]
    assert "reasoning_content" not in msg


@pytest.mark.parametrize("body,param", [
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"reasoning_budget": -2}, "reasoning_budget"),
    ({"reasoning_format": "xml"}, "reasoning_format"),
    ({"chat_template_kwargs": {"enable_thinking": "yes"}}, "chat_template_kwargs"),
])
def test_bad_reasoning_fields_are_400s(server, body, param):
    e = error_of(http(server.url + "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, **body}), 400)
    assert e["param"] == param, e


def test_a_budget_forces_the_close_after_n_tokens_of_thought(server):
    # The grammar lets the thought run up to 80 letters and the answer follow
    # the close; unbudgeted, this model's thought runs long, and the budget is
    # what closes it early.
    grammar = r'''root ::= [a-z ]{1,80} "\n</think>\n\n" [a-z ]{1,8}'''
    free = chat(server, grammar=grammar, max_tokens=80)["message"]
    assert len(free["reasoning_content"]) > 60, free
    for stream in (False, True):
        body = {"messages": CHAT, "max_tokens": 60, "temperature": 0, "reasoning_budget": 5,
                "grammar": grammar, "stream": stream}
        status, _, raw = http(server.url + "/v1/chat/completions", body)
        assert status == 200, raw
        reasoning, content = thought_and_answer(raw, stream)
        # The first five tokens of the unbudgeted thought, then the forced close, then the answer.
        assert reasoning and free["reasoning_content"].startswith(reasoning) and len(reasoning) < 40, reasoning
        assert content and "</think>" not in content, content


#: A thought of letters up to 80 long, the close, then an answer: a budget is what closes it early.
LONG_THOUGHT = r'''root ::= [a-z ]{1,80} "\n</think>\n\n" [a-z ]{1,8}'''


def test_a_budget_message_ends_the_thought_before_its_close(server):
    # llama-server's names: reasoning_budget_tokens (thinking_budget_tokens too) and
    # reasoning_budget_message, whose words the grammar must allow as it allows the model's.
    for name in ("reasoning_budget_tokens", "thinking_budget_tokens"):
        for stream in (False, True):
            body = {"messages": CHAT, "max_tokens": 60, "temperature": 0, name: 3, "grammar": LONG_THOUGHT,
                    "reasoning_budget_message": " so that is it", "stream": stream}
            status, _, raw = http(server.url + "/v1/chat/completions", body)
            assert status == 200, raw
            reasoning, content = thought_and_answer(raw, stream)
            assert reasoning.endswith(" so that is it") and len(reasoning) < 50, reasoning
            assert content and "</think>" not in content, content


def test_two_budget_names_that_disagree_are_refused(server):
    body = {"messages": CHAT, "max_tokens": 2, "reasoning_budget_tokens": 3, "thinking_budget_tokens": 4}
    e = error_of(http(server.url + "/v1/chat/completions", body), 400)
    assert e["param"] == "thinking_budget_tokens" and "reasoning_budget_tokens says 3" in e["message"], e
    body = {"messages": CHAT, "max_tokens": 2, "reasoning_budget_tokens": 3, "reasoning_budget": 3}
    assert http(server.url + "/v1/chat/completions", body)[0] == 200
    # The one that disagrees is named, wherever it comes.
    body = {"messages": CHAT, "reasoning_budget_tokens": 5, "thinking_budget_tokens": 5, "reasoning_budget": 7}
    assert error_of(http(server.url + "/v1/chat/completions", body), 400)["param"] == "reasoning_budget"


def test_the_servers_effort_gives_way_to_the_requests_template_switches(tmp_path):
    template = ("{% for m in messages %}{{ m.content }}{% endfor %}"
                "|{{ reasoning_effort | default('unset') }}|{{ enable_thinking }}")
    model = thinking_model.build(tmp_path / "tiny-qwen3-think.gguf")
    with ServerProcess(model, "--reasoning-effort", "low", "--chat-template", template) as s:
        def prompt(**body):
            status, _, raw = http(s.url + "/apply-template", {"messages": CHAT, **body})
            assert status == 200, raw
            return json.loads(raw)["prompt"]

        assert prompt().endswith("Why?|low|True")
        assert prompt(reasoning_effort="high").endswith("Why?|high|True")
        assert prompt(chat_template_kwargs={"reasoning_effort": "medium"}).endswith("Why?|medium|True")
        assert prompt(chat_template_kwargs={"enable_thinking": False}).endswith("Why?|unset|False")


def test_the_servers_reasoning_flags_are_every_requests_defaults(tmp_path):
    """-rea off, --reasoning-budget and its message, --reasoning-format: what
    a request does not say, the server's flags do; what it says wins."""
    model = thinking_model.build(tmp_path / "tiny-qwen3-think.gguf")
    with ServerProcess(model, "-rea", "off", "--reasoning-budget", "3", "--reasoning-budget-message",
                       " so that is it", "--reasoning-format", "none") as s:
        def ask(**body):
            status, _, raw = http(s.url + "/v1/chat/completions",
                                  {"messages": CHAT, "max_tokens": 60, "temperature": 0, **body})
            assert status == 200, raw
            return json.loads(raw)["choices"][0]["message"]

        # Thinking is off: the template closed the thought in the prompt, so the answer is all there is.
        off = ask(grammar=ANSWER_ONLY)
        assert off["content"].startswith("The answer") and "reasoning_content" not in off, off
        # An effort turns it back on; the format none leaves the thought in the content, cut by the
        # server's budget after its message.
        raw = ask(grammar=LONG_THOUGHT, reasoning_effort="high")
        assert " so that is it\n</think>" in raw["content"] and "reasoning_content" not in raw, raw
        # The request's own format and template switch win; its budget of -1 says nothing (as on
        # llama-server), while its own budget wins.
        split = ask(grammar=LONG_THOUGHT, reasoning_format="auto", reasoning_budget_tokens=-1,
                    chat_template_kwargs={"enable_thinking": True})
        assert split["reasoning_content"].endswith(" so that is it"), split
        longer = ask(grammar=LONG_THOUGHT, reasoning_format="auto", reasoning_budget_tokens=8,
                     reasoning_budget_message=" done", chat_template_kwargs={"enable_thinking": True})
        assert longer["reasoning_content"].endswith(" done"), longer
        assert len(longer["reasoning_content"]) > len(split["reasoning_content"]) - len(" so that is it"), longer


# A Qwen3-style template that also writes Hermes tool calls, as Qwen3's does.
QWEN3_TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\nTools:\\n' }}{%- for t in tools %}{{- t | tojson }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' and m.tool_calls -%}{{- '<|im_start|>assistant\\n' }}"
    "{%- for c in m.tool_calls -%}{{- '<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' }}"
    "{{- c.function.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor -%}{{- '<|im_end|>\\n' }}"
    "{%- else -%}{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}


def test_reasoning_then_a_tool_call_in_one_turn(tmp_path):
    """The thought goes to reasoning_content, the Hermes call to tool_calls,
    and the reply finishes with tool_calls: a grammar writes what a capable
    model would, and the reply is read as it would be."""
    model = make_tiny_models.ensure("qwen3")
    tmpl = tmp_path / "qwen3-tools.jinja"
    tmpl.write_text(QWEN3_TOOLS_TEMPLATE)
    grammar = (r'''root ::= "I should look" [a-z ]{0,8} "\n</think>\n\n" '''
               r'''"<tool_call>\n{\"name\": \"lookup\", \"arguments\": {\"q\": \"" [a-z]{1,6} "\"}}\n</tool_call>"''')
    with ServerProcess(model, "--chat-template-file", str(tmpl)) as s:
        for stream in (False, True):
            body = {"messages": CHAT, "tools": [TOOL], "grammar": grammar, "max_tokens": 80, "temperature": 0,
                    "stream": stream}
            status, _, raw = http(s.url + "/v1/chat/completions", body)
            assert status == 200, raw
            if stream:
                events = [e for e in sse(raw) if isinstance(e, dict) and e.get("choices")]
                deltas = [e["choices"][0]["delta"] for e in events]
                reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
                content = "".join(d.get("content") or "" for d in deltas)
                calls = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
                name = calls[0]["function"]["name"]
                arguments = "".join(c["function"].get("arguments") or "" for c in calls)
                finish = events[-1]["choices"][0]["finish_reason"]
            else:
                c = json.loads(raw)["choices"][0]
                reasoning, content = c["message"]["reasoning_content"], c["message"]["content"] or ""
                name = c["message"]["tool_calls"][0]["function"]["name"]
                arguments = c["message"]["tool_calls"][0]["function"]["arguments"]
                finish = c["finish_reason"]
            assert reasoning.startswith("I should look") and "</think>" not in reasoning
            assert content == "" and name == "lookup" and set(json.loads(arguments)) == {"q"}
            assert finish == "tool_calls"


# -- ending a thought while it runs (llama-server's reasoning control) -------------------------

#: A thought of up to 400 letters (this model's runs long), its close, an answer.
LONG_THOUGHT = r'''root ::= [a-z ]{1,400} "\n</think>\n\n" [a-z ]{1,8}'''


def _stream_and_end_thought(server, **body):
    """Streams a chat completion; at its first reasoning delta, asks for its thought to end.
    (thought, answer, the control's answer)."""
    import urllib.request

    req = urllib.request.Request(server.url + "/v1/chat/completions", method="POST", data=json.dumps({
        "messages": CHAT, "max_tokens": 500, "temperature": 0, "grammar": LONG_THOUGHT, "stream": True, **body,
    }).encode(), headers={"Content-Type": "application/json"})
    reasoning, content, control = "", "", None
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            if not line.startswith(b"data: {"):
                continue
            ev = json.loads(line[6:])
            d = ev["choices"][0]["delta"] if ev.get("choices") else {}
            reasoning += d.get("reasoning_content") or ""
            content += d.get("content") or ""
            if reasoning and control is None:
                status, _, raw = http(server.url + "/v1/chat/completions/control",
                                      {"id": ev["id"], "action": "reasoning_end"})
                assert status == 200, raw
                control = json.loads(raw)
    return reasoning, content, control


def test_a_thought_is_ended_while_it_runs(server):
    free = chat(server, grammar=LONG_THOUGHT, max_tokens=500)["message"]
    assert len(free["reasoning_content"]) > 200, free
    reasoning, content, control = _stream_and_end_thought(server, reasoning_control=True)
    assert control == {"success": True}
    # The thought ends soon after the control (its close written after the next token), then the answer.
    # How many tokens come between the first delta and the control's arrival is the machine's timing
    # (a few dozen at this model's speed): the bound is half the thought the model writes unchecked.
    free_thought = free["reasoning_content"]
    assert free_thought.startswith(reasoning) and len(reasoning) < len(free_thought) // 2, (reasoning, free_thought)
    assert content and "</think>" not in content, content


def test_a_thought_not_armed_for_control_runs_on(server):
    free = chat(server, grammar=LONG_THOUGHT, max_tokens=500)["message"]
    reasoning, content, control = _stream_and_end_thought(server)
    assert control["success"] is False and "reasoning_control" in control["message"]
    assert (reasoning, content) == (free["reasoning_content"], free["content"])


def test_a_control_names_its_completion_and_action(server):
    url = server.url + "/v1/chat/completions/control"
    assert error_of(http(url, {"action": "reasoning_end"}), 400)["param"] == "id"
    assert error_of(http(url, {"id": "chatcmpl-x", "action": "pause"}), 400)["param"] == "action"
    status, _, raw = http(url, {"id": "chatcmpl-none", "action": "reasoning_end"})
    assert status == 200 and json.loads(raw) == {"success": False, "message": "no active completion for this id"}
