"""Tools a request may declare: only those its client runs, on every backend.

A chat request's `tools` describe functions to the model; the client runs the calls the
model asks for. Other tool types have the server answering the request run the tool
itself, from its own network: OpenAI's `web_search`, `file_search`, `code_interpreter`,
`computer_use_preview`, `image_generation`, an `mcp` tool (a call to the `server_url`
the client names, with the `headers` it names), Anthropic's `web_search_20250305`,
`code_execution_...`. A hosted provider runs them through LiteLLM; a private backend of
kind `openai` may itself be a LiteLLM proxy (or another router) that does the same: it
would call the MCP server a client named, from inside the organisation's network, a
server no policy judged. vLLM, llama.cpp and SGLang take `function` tools only.

So on every path a tool must be of type `function` or `custom`, with only the API's keys
(LiteLLM's Gemini adapter drops a tool's `type` and reads a lone other key as a built-in
tool: `{"type": "custom", "googleSearch": {}}` is Google Search), and a legacy
`functions` entry needs a string `name` and only the API's keys. `tool_problem` names the
first that is not; the ingress refuses it for every backend (gateway/api/control_fields.py)
and the hosted attempt checks it again (gateway/upstream/hosted_fields.py). A tool's `type`,
when present, is a string: `{"type": "web_search", "type": null}` is a tool of no type
to the gateway (orjson keeps the last copy) and a web search to a router in Go, whose
encoding/json leaves a string field as it was for a `null` (or a value of another type).
A tool that is not an object is left to the backend (it refuses it; the hosted shape
check names it: gateway/upstream/openai_shapes.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["CLIENT_TOOL_TYPES", "tool_problem"]

# Tools the server only describes to the model; the client runs them.
CLIENT_TOOL_TYPES: Final = frozenset({"function", "custom"})
_TOOL_KEYS: Final = frozenset({"type", "function", "custom"})
_FUNCTION_KEYS: Final = frozenset({"name", "description", "parameters", "strict"})

_TOOL_TYPE: Final = (
    "the server or its provider would run it itself (search, fetch, execute, call a server "
    "the request names), which no policy judged; only `function` and `custom` tools, which "
    "the client runs, are sent"
)
_TYPE_VALUE: Final = "a tool's `type` is the string `function` or `custom`"
_ABSENT: Final = object()
_TOOL_SHAPE: Final = "a tool has only `type` and its `function` (or `custom`) definition"
_FUNCTION_SHAPE: Final = "a function has a string `name` and only `description` and `parameters`"


def tool_problem(doc: Mapping[str, Any]) -> tuple[str, str] | None:
    """(where, why) for the first tool or legacy function of `doc` (the client's document)
    that is not one the client runs, with only the API's keys; None when there is none.
    `tools` and `functions` are read in any case too (`"Tools"`: a router in Go reads it
    as `tools`), and named as written."""
    for name, value in doc.items():
        folded = name.casefold() if len(name) in _LENGTHS else ""
        if folded == "tools":
            found = _tool_problem(name, value)
        elif folded == "functions":
            found = _function_problem(name, value)
        else:
            continue
        if found is not None:
            return found
    return None


_LENGTHS: Final = frozenset((len("tools"), len("functions")))


def _tool_problem(name: str, tools: Any) -> tuple[str, str] | None:
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        if not isinstance(tool, dict):
            continue
        kind = tool.get("type", _ABSENT)
        if kind is not _ABSENT and not isinstance(kind, str):
            return f"{name}[{i}].type", _TYPE_VALUE  # a copy before it may be read
        if kind is not _ABSENT and kind not in CLIENT_TOOL_TYPES:
            return f"{name}[{i}].type", _TOOL_TYPE
        if not tool.keys() <= _TOOL_KEYS:
            return f"{name}[{i}]", _TOOL_SHAPE
    return None


def _function_problem(name: str, functions: Any) -> tuple[str, str] | None:
    for i, function in enumerate(functions if isinstance(functions, list) else ()):
        if isinstance(function, dict) and not (
            isinstance(function.get("name"), str) and function.keys() <= _FUNCTION_KEYS
        ):
            return f"{name}[{i}]", _FUNCTION_SHAPE
    return None
