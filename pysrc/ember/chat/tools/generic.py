"""The generic framing, for templates with no tool markup of their own: the
tools described in the system prompt, as llama-server does, and calls written
as JSON, ``{"tool_calls": [{"name": ..., "arguments": {...}}]}``, fenced or not."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ember.chat.tools.framing import _WS, Framing, _op, _probe, _wrapped_list
from ember.chat.tools.grammar import _json_object_call
from ember.chat.tools.reader import (_call_member, _CallState, _close_call, _Ctx, _json_call, _json_call_list,
                                     _json_members, _Reader, _Step)


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    return json.dumps(content, ensure_ascii=False)


def generic_tools_system_prompt(tools: Sequence[Mapping], *, parallel: bool = True) -> str:
    """The system prompt text that teaches a model without tool markup of its
    own the tools and the JSON form ``parse_tool_calls(GENERIC, ...)`` reads."""
    decls = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    many = "Several calls may go in the list." if parallel else "Put exactly one call in the list."
    return (
        "You can call the following tools. Each is described by a JSON object with its name, "
        "what it does, and the JSON schema of its arguments:\n"
        f"{decls}\n\n"
        "To call tools, answer with only a JSON object of this form:\n"
        '{"tool_calls": [{"name": "<tool name>", "arguments": {<the arguments, as the schema describes them>}}]}\n'
        f"{many} A tool's result comes back in a message of the form "
        '{"tool_response": {"name": ..., "content": ...}}. '
        "When no tool is needed, answer in plain text."
    )


def apply_generic_tools(
    messages: Sequence[Any], tools: Sequence[Mapping] | None, *, parallel: bool = True
) -> list[Any]:
    """Rewrites a conversation for a template that knows nothing of tools:
    the tool description goes into the first system message (a new one when
    there is none); an assistant turn's calls become the JSON it would have
    written (after its prose); tool results become user turns holding
    ``{"tool_response": ...}``, consecutive ones merged into one turn so that
    templates insisting on alternating roles accept them. With no tools (a
    follow-up turn under tool_choice "none") only the history is rewritten."""
    out: list[Any] = []
    merged_result = False  # the last message out is a user turn made of tool results
    for m in messages:
        if not isinstance(m, Mapping):
            out.append(m)
            merged_result = False
            continue
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            calls = []
            for tc in m["tool_calls"]:
                fn = tc.get("function", {}) if isinstance(tc, Mapping) else {}
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except (ValueError, RecursionError):
                        pass
                calls.append({"name": fn.get("name"), "arguments": args if args is not None else {}})
            prose = _text_of(m.get("content"))
            call_text = json.dumps({"tool_calls": calls}, ensure_ascii=False)
            new = {k: v for k, v in m.items() if k != "tool_calls"}
            new["content"] = f"{prose}\n{call_text}" if prose.strip() else call_text
            out.append(new)
            merged_result = False
        elif role == "tool":
            result = {
                "name": m.get("name"),
                "tool_call_id": m.get("tool_call_id"),
                "content": _text_of(m.get("content")),
            }
            text = json.dumps({"tool_response": {k: v for k, v in result.items() if v is not None}}, ensure_ascii=False)
            if merged_result:
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + text}
            else:
                out.append({"role": "user", "content": text})
                merged_result = True
        else:
            out.append(dict(m))
            merged_result = False
    if tools:
        prompt = generic_tools_system_prompt(tools, parallel=parallel)
        if out and isinstance(out[0], Mapping) and out[0].get("role") in ("system", "developer"):
            first = _text_of(out[0].get("content"))
            out[0] = {**out[0], "content": f"{first}\n\n{prompt}" if first.strip() else prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def _generic_block(r: _Reader, ctx: _Ctx) -> _Step:
    fenced = yield from r.optional("```")
    if fenced:
        yield from r.optional("json")
        yield from r.skip_ws()
    top = _CallState()

    def member(key: str) -> _Step:
        if key == "tool_calls":
            yield from _json_call_list(r, ctx)
        elif key == "tool_call":
            yield from _json_call(r, ctx)
        else:  # the object is itself the call
            yield from _call_member(r, ctx, top, key, check_name=True)

    yield from _json_members(r, member)
    if top.name is not None or top.has_args:
        yield from _close_call(top, bare=True)
    if fenced:
        yield from r.skip_ws()
        yield from r.optional("```")


GENERIC = Framing(
    name="generic",
    openers=(
        _op("{", _WS, '"tool_call'),
        _op("{", _WS, '"name"'),
        _op("```", ("?", "json"), _WS, "{", _WS, '"tool_call'),
        _op("```", ("?", "json"), _WS, "{", _WS, '"name"'),
    ),
    block=_generic_block,
    probe=_probe(r'\{\s*"tool_calls?"\s*:'),
    call_rule=_json_object_call("", "arguments", ""),
    root_rule=_wrapped_list('{"tool_calls": [', ", ", "]}"),
)
