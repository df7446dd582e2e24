"""Request fields that would have a hosted provider do more than answer: refused.

The policy admits a hosted backend for its declared region and retention
(`retention.max_days`). Some OpenAI request fields ask the provider for work those terms
do not cover, and LiteLLM forwards them (or translates them: `web_search_options` becomes
Anthropic's and Gemini's search tools):

- `web_search_options`, and tools of a built-in type (`web_search`, `web_search_preview`,
  `file_search`, `code_interpreter`, `computer_use_preview`, `mcp`, `image_generation`,
  Anthropic's `web_search_20250305`, `code_execution_...`, ...): the provider sends text
  taken from the prompt to a search service, fetches URLs, runs code or calls a server
  the client names, from its own network. OpenAI documents web search as outside zero
  data retention; an `mcp` tool's `server_url` is wherever the client likes.
- `audio` and an `audio` entry in `modalities` (spoken output): a provider may keep
  audio outputs as application state (OpenAI's data-controls table lists them, for
  multi-turn audio), which a zero-retention agreement does not remove.
- `store: true`: OpenAI and Azure OpenAI keep the prompt and the answer as a stored
  completion, readable with the gateway's key by anyone who holds it.

A client that asked for one of these is refused (`RefusedField`: 400 naming the field),
not served without it: an answer without the web search, the audio or the stored copy the
client asked for would not be what it asked for, and nothing would tell it so. Only tools
of type `function` and `custom` (both run by the client, not the provider), with no keys
beyond the API's, and legacy `functions` with a `name`, are sent.
`store: false` (the default) and null values ask for nothing and pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["CLIENT_TOOL_TYPES", "RefusedField", "refuse_provider_actions"]

# Tools the provider only describes to the model; the client runs them.
CLIENT_TOOL_TYPES: Final = frozenset({"function", "custom"})


class RefusedField(ValueError):
    """A field the hosted provider would act on beyond the policy's terms; `param` names
    it (`tools[1].type`), the message says why and never repeats the value."""

    def __init__(self, param: str, why: str) -> None:
        super().__init__(f"`{param}` is refused for hosted providers: {why}")
        self.param = param


_SEARCH = "the provider's web search sends text from the prompt to a search service"
_AUDIO = "the provider may keep spoken output as state, outside zero-retention terms"
_TOOL = "the provider itself would run it (search, fetch, execute, call a server)"
_STORE = "it asks the provider to keep the prompt and the answer"
# LiteLLM's Gemini adapter drops a tool's `type` and reads a lone other key as a built-in
# tool (`{"type": "custom", "googleSearch": {}}` is Google Search), and takes a legacy
# `functions` entry without a `name` the same way: a tool has the API's keys only.
_TOOL_KEYS: Final = frozenset({"type", "function", "custom"})
_FUNCTION_KEYS: Final = frozenset({"name", "description", "parameters", "strict"})
_TOOL_SHAPE = "a tool has only `type` and its `function` (or `custom`) definition"
_FUNCTION_SHAPE = "a function has a string `name` and only `description` and `parameters`"


def refuse_provider_actions(doc: Mapping[str, Any]) -> None:
    """Raise `RefusedField` for the first field of `doc` (the client's document) that asks
    a hosted provider to search, run a tool of its own, speak, or store the request."""
    if doc.get("web_search_options") is not None:
        raise RefusedField("web_search_options", _SEARCH)
    if doc.get("audio") is not None:
        raise RefusedField("audio", _AUDIO)
    modalities = doc.get("modalities")
    if isinstance(modalities, list) and "audio" in modalities:
        raise RefusedField("modalities", _AUDIO)
    if doc.get("store") is True:
        raise RefusedField("store", _STORE)
    tools = doc.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        if not isinstance(tool, dict):
            continue  # a malformed tool: `openai_shapes` names it
        kind = tool.get("type")
        if isinstance(kind, str) and kind not in CLIENT_TOOL_TYPES:
            raise RefusedField(f"tools[{i}].type", _TOOL)
        if not tool.keys() <= _TOOL_KEYS:
            raise RefusedField(f"tools[{i}]", _TOOL_SHAPE)
    functions = doc.get("functions")
    for i, function in enumerate(functions if isinstance(functions, list) else ()):
        if isinstance(function, dict) and not (
            isinstance(function.get("name"), str) and function.keys() <= _FUNCTION_KEYS
        ):
            raise RefusedField(f"functions[{i}]", _FUNCTION_SHAPE)
