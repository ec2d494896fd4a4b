"""Which framing a chat template writes (`ember.chat.tools.registry`'s
detect_framing), on small templates written as each family's real one, and
the parser reading back what each template writes."""

from __future__ import annotations

import json

import pytest

from ember import chat_template as ct
from ember.chat import tools as tc
from tool_cases import SMOLLM2_TEMPLATE, TOOLS, parse


# Small templates that render tool declarations, assistant tool_calls and tool
# results the way each family's real template does.
QWEN25_LIKE = r"""
{%- if tools %}
{{- '<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\n<tools>' }}
{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
{{- '\n</tools>\n\nFor each function call, return a json object within <tool_call></tool_call> XML tags.<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or message.role == 'system' or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' + (tool_call.arguments | tojson) + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

# Qwen3's template tests the assistant's content for a thought and fails on
# null content: detection must retry with "".
QWEN3_LIKE = r"""
{%- for message in messages %}
{%- if message.role == 'assistant' %}
{%- set content = message.content %}
{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1] %}{%- endif %}
{{- '<|im_start|>assistant\n' + content }}
{%- for tool_call in message.tool_calls | default([]) %}
{%- if (loop.first and content) or (not loop.first) %}{{- '\n' }}{%- endif %}
{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
"""

QWEN3_CODER_LIKE = r"""
{%- if tools %}
{{- '<|im_start|>system\n# Tools\n\n<tools>' }}
{%- for tool in tools %}{{- '\n<function>\n<name>' + tool.function.name + '</name>\n</function>' }}{%- endfor %}
{{- '\n</tools><|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\n<tool_call>\n<function=' + tool_call.name + '>\n' }}
{%- for args_name, args_value in tool_call.arguments | items %}
{{- '<parameter=' + args_name + '>\n' }}
{%- if args_value is mapping or (args_value is sequence and args_value is not string) %}{{- args_value | tojson }}{%- else %}{{- args_value | string }}{%- endif %}
{{- '\n</parameter>\n' }}
{%- endfor %}
{{- '</function>\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

LLAMA31_LIKE = r"""
{{- bos_token }}
{{- '<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n\n<|eot_id|>' }}
{%- if tools is not none %}
{%- set first_user_message = messages[0]['content'] | trim %}
{%- set messages = messages[1:] %}
{{- '<|start_header_id|>user<|end_header_id|>\n\n' }}
{{- 'Given the following functions, please respond with a JSON for a function call.\n\n' }}
{{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\n\n' }}
{%- for t in tools %}{{- t | tojson(indent=4) + '\n\n' }}{%- endfor %}
{{- first_user_message + '<|eot_id|>' }}
{%- endif %}
{%- for message in messages %}
{%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + message.content | trim + '<|eot_id|>' }}
{%- elif 'tool_calls' in message %}
{%- if not message.tool_calls | length == 1 %}{{- raise_exception('This model only supports single tool-calls at once!') }}{%- endif %}
{%- set tool_call = message.tool_calls[0].function %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{{- '{"name": "' + tool_call.name + '", "parameters": ' + (tool_call.arguments | tojson) + '}<|eot_id|>' }}
{%- else %}
{{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + message.content + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}
"""

MISTRAL_NEMO_LIKE = r"""
{%- set user_messages = messages | selectattr('role', 'equalto', 'user') | list %}
{{- bos_token }}
{%- for message in messages %}
{%- if message.role == 'user' %}
{%- if tools is not none and message == user_messages[-1] %}
{{- '[AVAILABLE_TOOLS][' }}{%- for tool in tools %}{{- tool | tojson }}{%- if not loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}{{- '][/AVAILABLE_TOOLS]' }}
{%- endif %}
{{- '[INST]' + message.content + '[/INST]' }}
{%- elif message.tool_calls is defined and message.tool_calls is not none %}
{{- '[TOOL_CALLS][' }}
{%- for tool_call in message.tool_calls %}
{%- set out = tool_call.function | tojson %}
{{- out[:-1] }}
{%- if tool_call.id is not defined or tool_call.id | length != 9 %}{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif %}
{{- ', "id": "' + tool_call.id + '"}' }}
{%- if not loop.last %}{{- ', ' }}{%- else %}{{- ']' + eos_token }}{%- endif %}
{%- endfor %}
{%- elif message.role == 'assistant' %}
{{- message.content + eos_token }}
{%- elif message.role == 'tool' %}
{%- if message.tool_call_id | length != 9 %}{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif %}
{{- '[TOOL_RESULTS]{"content": ' + message.content | string + ', "call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
{%- endif %}
{%- endfor %}
"""

MINISTRAL_LIKE = r"""
{{- bos_token }}
{%- if tools %}{{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' }}{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' %}{{- '[INST]' + message.content + '[/INST]' }}
{%- elif message.role == 'assistant' %}
{%- if message.content %}{{- message.content }}{%- endif %}
{%- for tool_call in message.tool_calls | default([]) %}
{%- set arguments = tool_call.function.arguments %}
{%- if arguments is not string %}{%- set arguments = arguments | tojson %}{%- endif %}
{{- '[TOOL_CALLS]' + tool_call.function.name + '[ARGS]' + arguments }}
{%- endfor %}
{{- eos_token }}
{%- elif message.role == 'tool' %}{{- '[TOOL_RESULTS]' + message.content | string + '[/TOOL_RESULTS]' }}
{%- endif %}
{%- endfor %}
"""

GEMMA4_LIKE = r"""
{%- macro arg(v) -%}
{%- if v is string -%}{{- '<|"|>' + v + '<|"|>' -}}
{%- elif v is boolean -%}{{- 'true' if v else 'false' -}}
{%- elif v is mapping -%}{{- '{' -}}{%- for k, x in v | dictsort -%}{{- k + ':' + arg(x) -}}{%- if not loop.last %},{% endif -%}{%- endfor -%}{{- '}' -}}
{%- elif v is sequence -%}{{- '[' -}}{%- for x in v -%}{{- arg(x) -}}{%- if not loop.last %},{% endif -%}{%- endfor -%}{{- ']' -}}
{%- else -%}{{- v -}}{%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- if tools -%}
{{- '<|turn>system\n' -}}{%- for tool in tools -%}{{- '<|tool>declaration:' + tool.function.name + '{}<tool|>' -}}{%- endfor -%}{{- '<turn|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{{- '<|turn>' + ('model' if message.role == 'assistant' else message.role) + '\n' -}}
{%- if message.tool_calls -%}
{%- for tool_call in message.tool_calls -%}
{{- '<|tool_call>call:' + tool_call.function.name + '{' -}}
{%- for k, v in tool_call.function.arguments | dictsort -%}{{- k + ':' + arg(v) -}}{%- if not loop.last %},{% endif -%}{%- endfor -%}
{{- '}<tool_call|>' -}}
{%- endfor -%}
{%- endif -%}
{%- if message.content is string -%}{{- message.content | trim -}}{%- endif -%}
{{- '<turn|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|turn>model\n' -}}{%- endif -%}
"""

FUNCTIONGEMMA_LIKE = r"""
{{- bos_token -}}
{%- for message in messages -%}
{{- '<start_of_turn>' + ('model' if message.role == 'assistant' else message.role) + '\n' -}}
{%- for tool_call in message.tool_calls | default([]) -%}
{{- '<start_function_call>call:' + tool_call.function.name + '{' -}}
{%- for k, v in tool_call.function.arguments | dictsort -%}
{{- k + ':' -}}{%- if v is string -%}{{- '<escape>' + v + '<escape>' -}}{%- else -%}{{- v | tojson -}}{%- endif -%}
{%- if not loop.last %},{% endif -%}
{%- endfor -%}
{{- '}<end_function_call>' -}}
{%- endfor -%}
{%- if message.content is string -%}{{- message.content -}}{%- endif -%}
{{- '<end_of_turn>\n' -}}
{%- endfor -%}
"""

REFUSES_TOOL_CALLS = r"""
{%- for message in messages -%}
{%- if message.tool_calls is defined -%}{{- raise_exception('tool calls are not supported') -}}{%- endif -%}
{{- message.role + ': ' + message.content + '\n' -}}
{%- endfor -%}
"""

OWN_MARKUP = r"""
{%- for message in messages -%}
{{- message.role + ': ' + (message.content or '') -}}
{%- for tool_call in message.tool_calls | default([]) -%}{{- ' >>>' + tool_call.function.name + '(' + (tool_call.function.arguments | tojson) + ')' -}}{%- endfor -%}
{{- '\n' -}}
{%- endfor -%}
"""


def renderer(template):
    def render(messages, tools):
        return ct.render_chat(template, messages, tools=tools, add_generation_prompt=False,
                              bos_token="<s>", eos_token="</s>")
    return render


DETECT_CASES = [
    ("smollm2", SMOLLM2_TEMPLATE, tc.GENERIC),
    ("gemma-fallback", ct.GEMMA, tc.GENERIC),
    ("chatml-fallback", ct.CHATML, tc.GENERIC),
    ("qwen2.5", QWEN25_LIKE, tc.HERMES),
    ("qwen3", QWEN3_LIKE, tc.HERMES),
    ("qwen3-coder", QWEN3_CODER_LIKE, tc.QWEN3_CODER),
    ("llama3.1", LLAMA31_LIKE, tc.LLAMA3_JSON),
    ("mistral-nemo", MISTRAL_NEMO_LIKE, tc.MISTRAL),
    ("ministral", MINISTRAL_LIKE, tc.MISTRAL_ARGS),
    ("gemma4", GEMMA4_LIKE, tc.GEMMA4),
    ("functiongemma", FUNCTIONGEMMA_LIKE, tc.FUNCTIONGEMMA),
    ("refuses-tool-calls", REFUSES_TOOL_CALLS, tc.GENERIC),
    ("unknown-markup", OWN_MARKUP, tc.GENERIC),
]


@pytest.mark.parametrize("name,template,framing", DETECT_CASES, ids=[c[0] for c in DETECT_CASES])
def test_detect_framing(name, template, framing):
    assert tc.detect_framing(renderer(template)) is framing


def test_detect_framing_survives_a_failing_renderer():
    def broken(messages, tools):
        raise RuntimeError("no template")
    assert tc.detect_framing(broken) is tc.GENERIC


CONVERSATION_ARGS = {"city": "Zürich", "days": 3, "metric": True}

# Where each template writes the assistant's turn: its markup is what the
# model learned to write, so the parser must read it back.
ROUND_TRIP = [
    (QWEN25_LIKE, "<|im_start|>assistant\n", "<|im_end|>"),
    (QWEN3_LIKE, "<|im_start|>assistant\n", "<|im_end|>"),
    (QWEN3_CODER_LIKE, "<|im_start|>assistant\n", "<|im_end|>"),
    (LLAMA31_LIKE, "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    (MISTRAL_NEMO_LIKE, "[/INST]", "</s>"),
    (MINISTRAL_LIKE, "[/INST]", "</s>"),
    (GEMMA4_LIKE, "<|turn>model\n", "<turn|>"),
    (FUNCTIONGEMMA_LIKE, "<start_of_turn>model\n", "<end_of_turn>"),
]


@pytest.mark.parametrize("template,start,end", ROUND_TRIP, ids=[
    "qwen2.5", "qwen3", "qwen3-coder", "llama3.1", "mistral-nemo", "ministral", "gemma4", "functiongemma"])
def test_parser_reads_what_the_template_writes(template, start, end):
    render = renderer(template)
    framing = tc.detect_framing(render)
    messages = tc.normalize_tool_messages([
        {"role": "user", "content": "Weather in Zürich for 3 days?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "aB3dE6gH9", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps(CONVERSATION_ARGS)}}]},
        {"role": "tool", "tool_call_id": "aB3dE6gH9", "content": "Sunny"},
    ])
    rendered = render(messages, TOOLS)
    written = rendered.split(start)[-1].split(end)[0] if framing is not tc.LLAMA3_JSON else \
        rendered.split(start)[1].split(end)[0]
    content, calls = parse(framing, written)
    assert calls == [("get_weather", CONVERSATION_ARGS)]
    assert content == ""
