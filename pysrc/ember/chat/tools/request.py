"""A request's tool fields, validated (``validate_tools``, answering a
``ToolPlan``), and its tool history made ready for a template
(``normalize_tool_messages``); ``ToolRequestError`` for what cannot be served."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ember.chat.tools.framing import Framing, call_grammar
from ember.chat.tools.grammar import SchemaRules
from ember.errors import InvalidRequestError


class ToolRequestError(InvalidRequestError, ValueError):  # type: ignore[misc]
    """A request whose tools, tool_choice or tool history cannot be served.
    The message starts with the field at fault (``tool_choice: ...``), which
    the server reports as OpenAI's ``param``."""


# ---------------------------------------------------------------------------
# Request validation
# ---------------------------------------------------------------------------

# OpenAI's own rule for function names.
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")

Choice = Literal["none", "auto", "required", "function"]


@dataclass(frozen=True)
class ToolPlan:
    """What a request asks of tools, validated.

    ``choice`` is "function" when ``tool_choice`` names one; ``name`` is that
    function. ``tools`` are the declarations in OpenAI's shape, each with a
    ``parameters`` object (an empty object schema where the client gave none).
    """

    tools: tuple[dict, ...]
    choice: Choice
    name: str | None
    parallel: bool

    @property
    def parse(self) -> bool:
        """Whether output is read for calls (and the template shown the tools).
        Under "none" the model is not told about the tools at all, so it has
        no reason to write a call that would then reach the client as text."""
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> bool:
        """Whether a call must be written (constrained decoding)."""
        return self.choice in ("required", "function")

    @property
    def template_tools(self) -> list[dict] | None:
        """The ``tools`` to render the prompt with: None when tools are off."""
        return list(self.tools) if self.parse else None

    def grammar(self, framing: Framing, schema_rules: SchemaRules) -> str | None:
        """The grammar forcing the call, or None when no call is forced."""
        if not self.forced:
            return None
        return call_grammar(framing, self.tools, self.name, self.parallel, schema_rules)


def _check_tool(i: int, tool: Any) -> dict:
    where = f"tools[{i}]"
    if not isinstance(tool, Mapping):
        raise ToolRequestError(f"{where}: expected an object, got {type(tool).__name__}")
    if tool.get("type") != "function":
        raise ToolRequestError(f"{where}.type: only \"function\" tools are supported, got {tool.get('type')!r}")
    fn = tool.get("function")
    if not isinstance(fn, Mapping):
        raise ToolRequestError(f"{where}.function: expected an object")
    name = fn.get("name")
    if not isinstance(name, str) or not _FUNCTION_NAME.fullmatch(name):
        raise ToolRequestError(
            f"{where}.function.name: {name!r} is not a valid function name (1 to 64 of a-z, A-Z, 0-9, _ and -)"
        )
    desc = fn.get("description")
    if desc is not None and not isinstance(desc, str):
        raise ToolRequestError(f"{where}.function.description: expected a string")
    params = fn.get("parameters")
    if params is None:
        params = {"type": "object", "properties": {}}
    elif not isinstance(params, Mapping):
        raise ToolRequestError(f"{where}.function.parameters: expected a JSON schema object")
    elif params.get("type", "object") != "object":
        raise ToolRequestError(f"{where}.function.parameters: a function's parameters must be an object schema")
    elif "properties" in params and not isinstance(params["properties"], Mapping):
        raise ToolRequestError(f"{where}.function.parameters.properties: expected an object")
    out_fn = {k: v for k, v in fn.items() if v is not None}
    out_fn["parameters"] = dict(params)
    return {"type": "function", "function": out_fn}


def validate_tools(tools: Any, tool_choice: Any = None, parallel_tool_calls: Any = None) -> ToolPlan:
    """Checks a request's tool fields and answers the plan: ``auto`` with
    tools, and one call per reply unless ``parallel_tool_calls`` is true
    (llama-server's default: a small model allowed any number of calls in a
    forced reply may never stop writing them), ToolRequestError naming the
    field otherwise."""
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise ToolRequestError(f"tools: expected an array, got {type(tools).__name__}")
    checked = tuple(_check_tool(i, t) for i, t in enumerate(tools))
    names: dict[str, int] = {}
    for i, t in enumerate(checked):
        name = t["function"]["name"]
        if name in names:
            raise ToolRequestError(f"tools[{i}].function.name: {name!r} is declared twice (also tools[{names[name]}])")
        names[name] = i

    if parallel_tool_calls is None:
        parallel = False
    elif isinstance(parallel_tool_calls, bool):
        parallel = parallel_tool_calls
    else:
        raise ToolRequestError(f"parallel_tool_calls: expected a boolean, got {type(parallel_tool_calls).__name__}")

    name: str | None = None
    if tool_choice is None:
        choice: Choice = "auto"
    elif isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise ToolRequestError(
                f"tool_choice: unknown value {tool_choice!r} (expected \"none\", \"auto\", \"required\" "
                "or {\"type\": \"function\", \"function\": {\"name\": ...}})"
            )
        choice = tool_choice  # type: ignore[assignment]
    elif isinstance(tool_choice, Mapping):
        fn = tool_choice.get("function")
        if tool_choice.get("type") != "function" or not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise ToolRequestError(
                "tool_choice: expected {\"type\": \"function\", \"function\": {\"name\": ...}}"
            )
        choice, name = "function", fn["name"]
        if name not in names:
            known = ", ".join(names) or "none"
            raise ToolRequestError(f"tool_choice: the tool {name!r} is not among the tools (declared: {known})")
    else:
        raise ToolRequestError(f"tool_choice: expected a string or an object, got {type(tool_choice).__name__}")

    if choice == "required" and not checked:
        raise ToolRequestError("tool_choice: a call is required, but no tools are declared")
    return ToolPlan(checked, choice, name, parallel)


# ---------------------------------------------------------------------------
# Tool history
# ---------------------------------------------------------------------------


def _arguments_object(where: str, args: Any) -> dict:
    if args is None or (isinstance(args, str) and not args.strip()):
        return {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError) as e:
            raise ToolRequestError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(args, Mapping):
        raise ToolRequestError(f"{where}: a call's arguments must be a JSON object, got {type(args).__name__}")
    return dict(args)


def normalize_tool_messages(messages: Iterable[Any]) -> list[Any]:
    """Copies ``messages`` for a template: a call's ``function.arguments``
    sent as a JSON string (OpenAI's wire form) becomes the object it holds,
    since templates iterate over arguments or write them with ``tojson``, as
    llama-server hands them over; an empty ``tool_calls`` is dropped (some
    templates test only that the key is there); a ``tool`` message gains the
    ``name`` of the call it answers when it has none (templates that write the
    function's name beside its result read it there).

    A tool message without ``tool_call_id``, or one naming no earlier call, is
    a ToolRequestError: the template could only render it as an answer to
    nothing. An assistant message with calls and null content gets "" (Qwen3's
    template, among others, fails on null). Non-object messages pass through
    for the renderer to refuse.
    """
    out: list[Any] = []
    calls: dict[str, str] = {}  # id -> function name, of the calls seen so far
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            out.append(message)
            continue
        m = dict(message)
        role = m.get("role")
        if "tool_calls" in m:
            tcs = m["tool_calls"]
            if not tcs:
                del m["tool_calls"]
            elif role != "assistant":
                raise ToolRequestError(f"messages[{i}].tool_calls: only assistant messages carry tool calls")
            elif not isinstance(tcs, list):
                raise ToolRequestError(f"messages[{i}].tool_calls: expected an array")
            else:
                fixed = []
                for j, tc in enumerate(tcs):
                    where = f"messages[{i}].tool_calls[{j}]"
                    fn = tc.get("function") if isinstance(tc, Mapping) else None
                    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
                        raise ToolRequestError(f"{where}.function: expected an object with a name")
                    call = dict(tc)
                    call.setdefault("type", "function")
                    args = _arguments_object(f"{where}.function.arguments", fn.get("arguments"))
                    call["function"] = {**fn, "arguments": args}
                    cid = call.get("id")
                    if isinstance(cid, str) and cid:
                        calls[cid] = fn["name"]
                    fixed.append(call)
                m["tool_calls"] = fixed
                if m.get("content") is None:
                    # OpenAI clients send null content beside calls; templates
                    # that test or concatenate content (Qwen3's) fail on it.
                    m["content"] = ""
        if role == "tool":
            tid = m.get("tool_call_id")
            if not isinstance(tid, str) or not tid:
                raise ToolRequestError(
                    f"messages[{i}].tool_call_id: a tool message needs the id of the call it answers"
                )
            if tid not in calls:
                raise ToolRequestError(f"messages[{i}].tool_call_id: {tid!r} answers no earlier tool call")
            if not m.get("name"):
                m["name"] = calls[tid]
        out.append(m)
    return out
