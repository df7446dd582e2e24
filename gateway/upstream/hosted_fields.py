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
- Prompt caches the client asks for: a non-null `cache_control` (or Bedrock's
  `cachePoint`) on the request, on any message or anything inside one (content parts,
  tool calls), on a tool or its `function`/`custom` definition, in any case (a router in
  Go behind a `kind: openai` backend reads `"Cache_Control"` as the marker);
  `prompt_cache_retention`
  other than `in_memory`. LiteLLM 1.108.7 forwards `cache_control` to Anthropic (`"ttl":
  "1h"` keeps the prompt an hour), to Bedrock as a `cachePoint`, and for Gemini and
  Vertex creates a context cache (a stored `cachedContents` resource in the gateway's
  account) whose `ttl` is whatever the client wrote, years included. OpenAI's `"24h"`
  keeps the prompt's cache a day. The policy checked the backend's declared retention,
  not the client's: a backend declared zero-retention would keep the prompt anyway.
  (`prompt_cache_retention` is not forwarded; it is refused because dropping it would
  go unseen.) `prompt_cache_key` only routes to a cache and passes, as the tenant's own
  (gateway/upstream/tenant_ids.py).

A client that asked for one of these is refused (`RefusedField`: 400 naming the field),
not served without it: an answer without the web search, the audio or the stored copy the
client asked for would not be what it asked for, and nothing would tell it so. Only tools
of type `function` and `custom` (both run by the client, not the provider), with no keys
beyond the API's, and legacy `functions` with a `name`, are sent: the rule of every path
(gateway/upstream/client_tools.py, refused at the ingress), checked here again.
`store: false` (the default), `prompt_cache_retention: "in_memory"` (the default) and null
values ask for nothing and pass. A private `kind: openai` backend, which may be a router in
front of such providers, is held to the same rule (gateway/api/router_fields.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from gateway.upstream.client_tools import CLIENT_TOOL_TYPES, tool_problem

__all__ = ["CACHE_MARKERS", "RefusedField", "refuse_provider_actions"]

# The keys by which a chat request asks a provider to keep its prompt as a cache
# (Anthropic's and LiteLLM's `cache_control`, Bedrock Converse's `cachePoint`).
CACHE_MARKERS: Final = ("cache_control", "cachePoint")


class RefusedField(ValueError):
    """A field the hosted provider would act on beyond the policy's terms; `param` names
    it (`tools[1].type`), the message says why and never repeats the value."""

    def __init__(self, param: str, why: str) -> None:
        super().__init__(f"`{param}` is refused for hosted providers: {why}")
        self.param = param


_SEARCH = "the provider's web search sends text from the prompt to a search service"
_AUDIO = "the provider may keep spoken output as state, outside zero-retention terms"
_STORE = "it asks the provider to keep the prompt and the answer"
_CACHE = "it asks the provider to keep the prompt as a cache, past the retention checked"
# A marker's path names structure only: keys of this form, at most this deep; past that
# (a key of the client's own, deep nesting) the message holding it is named.
_PLAIN_KEY: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
_MAX_PATH: Final = 6


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
    _refuse_prompt_caches(doc)
    found = tool_problem(doc)  # refused at the ingress already: checked again here
    if found is not None:
        raise RefusedField(*found)


def _refuse_prompt_caches(doc: Mapping[str, Any]) -> None:
    """`RefusedField` for the first cache marker (`CACHE_MARKERS`) of the request, its
    messages or its tools, or a `prompt_cache_retention` longer than in memory."""
    if doc.get("prompt_cache_retention") not in (None, "in_memory"):
        raise RefusedField("prompt_cache_retention", _CACHE)
    for key in CACHE_MARKERS:
        if doc.get(key) is not None:
            raise RefusedField(key, _CACHE)
    messages = doc.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        found = _marker_in(message)
        if found is not None:
            raise RefusedField(_path(f"messages[{i}]", found), _why(found[-1]))
    tools = doc.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        # A tool and its definition, not the definition's `parameters`: a JSON schema may
        # name a property `cache_control`. LiteLLM reads both places (Anthropic, Bedrock).
        for where, obj in ((f"tools[{i}]", tool), *_definitions(f"tools[{i}]", tool)):
            marker = _marker(obj) if isinstance(obj, dict) else None
            if marker is not None:
                named = _FOLDED_MARKERS[marker.casefold()]
                raise RefusedField(f"{where}.{named}", _why(marker))


# The markers by their case-folded names: a router in Go (encoding/json) matches names
# without regard to case, folding U+017F and U+212A to `s` and `k`, so `"Cache_Control"`
# inside a message is a prompt cache to it. Such a name is named as the marker it reads.
_FOLDED_MARKERS: Final = {name.casefold(): name for name in CACHE_MARKERS}
_MARKER_LENGTHS: Final = frozenset(map(len, _FOLDED_MARKERS))


def _marker(node: dict[str, Any]) -> str | None:
    """The key of `node`'s first non-null cache marker, in any case (as written)."""
    for key in CACHE_MARKERS:
        if node.get(key) is not None:
            return key
    for key, value in node.items():
        if len(key) in _MARKER_LENGTHS and value is not None and key.casefold() in _FOLDED_MARKERS:
            return key
    return None


def _why(key: str | int) -> str:
    if not isinstance(key, str) or key in CACHE_MARKERS:
        return _CACHE
    return f"{_CACHE} (a name a router reads as the marker, whatever its case)"


def _definitions(where: str, tool: Any) -> list[tuple[str, Any]]:
    if not isinstance(tool, dict):
        return []
    return [(f"{where}.{kind}", tool.get(kind)) for kind in CLIENT_TOOL_TYPES]


# A path inside a message, innermost step first: (key or index, the path above it).
_Steps = tuple[str | int, "_Steps"] | None


def _marker_in(message: Any) -> tuple[str | int, ...] | None:
    """The path, inside `message`, to its first non-null cache marker, at any depth.

    Iterative and linear in the message's size (each node holds its step and a link to
    its parent's path), so a deeply nested message costs no stack and no copies. A
    message's keys are the API's structure, its text is in string values (not walked)."""
    stack: list[tuple[_Steps, Any]] = [(None, message)]
    while stack:
        steps, node = stack.pop()
        if isinstance(node, dict):
            key = _marker(node)
            if key is not None:
                return _unwound((key, steps))
            children: list[tuple[str | int, Any]] = list(node.items())
        elif isinstance(node, list):
            children = list(enumerate(node))
        else:
            continue
        stack.extend(((k, steps), v) for k, v in reversed(children) if isinstance(v, dict | list))
    return None


def _unwound(steps: _Steps) -> tuple[str | int, ...]:
    parts: list[str | int] = []
    while steps is not None:
        step, steps = steps
        parts.append(step)
    return tuple(reversed(parts))


def _path(message: str, parts: tuple[str | int, ...]) -> str:
    """`messages[0].content[1].cache_control`; the message alone when a key on the way
    is not a plain name or the path is deep (the client's text is never repeated)."""
    if len(parts) > _MAX_PATH:
        return message
    where = message
    *steps, last = parts
    # the marker: named as the marker a router reads it as
    named = _FOLDED_MARKERS.get(last.casefold(), last) if isinstance(last, str) else last
    for part in (*steps, named):
        if isinstance(part, int):
            where += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            where += f".{part}"
        else:
            return message
    return where
