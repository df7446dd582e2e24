"""A name repeated within one object of a request body, anywhere in it, refused
(`check_unique_names`, called by gateway/api/body.py `parse_body`).

JSON parsers disagree on a repeated name (RFC 8259 leaves it open; I-JSON, RFC 7493, says a
name MUST NOT repeat): orjson and Python's `json` (the gateway, LiteLLM) keep the last copy,
others the first, and Go's encoding/json (a router behind a `kind: openai` backend) reads
each copy in turn, where a `null` leaves a plain field as it was. `{"store": true, "store":
null}` passed the gateway's rule for stored completions while such a router kept `true`;
the same holds for any field a check reads, at any depth (a message's `role`, a content
part's `image_url`, a tool's `type`, `metadata`, `response_format`). So no object of a body
may repeat a name, on every endpoint and path: 400 `invalid_request`, naming where by
positions and the API's own names only.

The proof that no name repeats counts members: each has one colon outside strings, and the
parsed document holds one per name kept. For a body whose strings `scan_body` walked
(`BodyScan.colons`: a chat body, a long prompt) the document's objects are counted a level
at a time from C (`_members`: 4 us for a 100 KB prompt; an empty array or object is not
looked into); a small ASCII body, and a body of many strings, is re-encoded and the colons
of both counted whole (1 us for a 1 KB chat body, 0.1 ms for 60 KB of 3,000 strings),
where a colon in a string is one on both sides unless the body escapes it (`\\u003a`).
orjson keeps a UTF-8 copy in each non-ASCII string it encodes, for as long as the string
lives, so a body that may hold one is re-encoded from a second parse (0.4 ms for 95 KB of
1,500 messages), whose copies go with it; a colon a string escapes (`\\u003a`, after an
even run of backslashes) is one more in the re-encoding, and is counted. Counts that
differ prove a repeat: the exact check (a parse keeping every pair, and a walk) says
where, for a body of at most 64 KiB (6 ms); a larger one is refused without it (the walk
took seconds of the event loop for 7 MB of small objects).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from itertools import chain, compress
from typing import Any, Final

import orjson

from gateway.errors import ErrorCode, GatewayError
from gateway.json_loads import at_most, loads, no_collection

__all__ = ["check_unique_names"]

# The names an error may quote: the API's own structure (any other name is the client's
# text, and the path stops at the object holding it).
_KNOWN: Final = frozenset(
    {
        "messages", "content", "role", "name", "tool_calls", "tool_call_id", "function",
        "arguments", "type", "text", "image_url", "url", "detail", "input_audio", "data",
        "format", "file", "file_id", "file_data", "filename", "video_url", "audio_url",
        "tools", "custom", "parameters", "description", "strict", "properties", "required",
        "tool_choice", "functions", "function_call", "response_format", "json_schema",
        "schema", "metadata", "stream_options", "include_usage", "prediction", "audio",
        "prompt", "input", "model", "stream", "store", "modalities", "max_tokens", "n",
        "max_completion_tokens", "temperature", "top_p", "stop", "seed", "user", "logit_bias",
        "cache_control", "cachePoint", "web_search_options", "chat_template_kwargs", "tags",
        "logprobs", "top_logprobs", "frequency_penalty", "presence_penalty", "dimensions",
        "encoding_format", "parallel_tool_calls", "reasoning_effort", "service_tier",
    }
)  # fmt: skip
_MAX_PATH: Final = 8  # steps an error names at most
# `\\u003a` and `\\u003A`: an escape is one where an odd run of backslashes meets the `u`
# (the pattern starts with its backslash, which the regex engine searches for quickly: a
# look-behind first tried the pattern at every byte, 0.25 s for 8 MiB)
_COLON_ESCAPE: Final = b"\\u003"
_ESCAPED_BACKSLASH: Final = b"\\\\u003"  # two backslashes before `u003`: perhaps text
_COLON_ESCAPES: Final = re.compile(rb"\\(?<!\\\\)(?:\\\\)*u003[aA]")
# Bytes past which a repeat is refused without saying where (`_first_repeat`).
_WHERE_MAX_BYTES: Final = 64 * 1024
# Bytes under which a walked ASCII body is re-encoded to count its members (1 us for 1 KB,
# where `_members` takes 4 us).
_SMALL: Final = 8 * 1024
_IS_CONTAINER: Final = frozenset({dict, list}).__contains__
_IS_DICT: Final = frozenset({dict}).__contains__
_IS_LIST: Final = frozenset({list}).__contains__


def check_unique_names(body: bytes, doc: Any, colons: int = -1) -> None:
    """Raise the 400 when an object of `body` (parsed as `doc`) repeats a name. `colons`:
    the body's colons outside strings when `scan_body` walked it (its members), else -1."""
    if colons == 0:
        return  # no member at all
    small = len(body) < _SMALL
    plain = small and _plain(body)
    if colons > 0 and not plain:
        if _members(doc) == colons:
            return
    else:
        plain = plain or (not small and _plain(body))
        # orjson keeps a UTF-8 copy in each string it encodes that is not ASCII, as long
        # as the string lives (memory `held_bound` does not count): a body that may hold
        # one is parsed again for its re-encoding, and the copies go with it.
        canonical = orjson.dumps(doc if plain else loads(body, at_most(body)))
        # A colon in a string is one on both sides, unless the body escapes it (`find`:
        # memchr; a body without a backslash escapes nothing).
        if body.count(b":") + _escaped_colons(body) == canonical.count(b":"):
            return
    # The counts prove a repeat; only a small body is parsed again to say where (a parse
    # keeping every pair and a walk in Python: seconds for an 8 MiB body of small objects).
    where = _first_repeat(body) if len(body) <= _WHERE_MAX_BYTES else None
    path, named, name = where if where is not None else ("", False, "")
    known = named and name in _KNOWN
    said = f"the `{name}` name" if known else "a name"
    place = (
        ("the object at " if named else "an object inside ") + f"`{path}`"
        if path
        else ("the top-level object" if named else "an object")
    )
    raise GatewayError(
        ErrorCode.invalid_request,
        f"the request body repeats {said} in {place}: a name may appear once in an "
        "object (RFC 7493; parsers disagree on which copy counts)",
        param=".".join(filter(None, (path, name if known else ""))) or None,
    )


def _escaped_colons(body: bytes) -> int:
    """The colons `body`'s strings spell as `\\u003a`/`\\u003A`: each one more colon in the
    re-encoding than in the body (a backslash before it escaped by another is text)."""
    if body.find(_COLON_ESCAPE) < 0:
        return 0
    if body.find(_ESCAPED_BACKSLASH) < 0:  # each `\\u003` is an escape: counted in C
        return body.count(b"\\u003a") + body.count(b"\\u003A")
    return sum(1 for _ in _COLON_ESCAPES.finditer(body))


def _plain(body: bytes) -> bool:
    """Whether every string of `body` decodes to ASCII: no byte past it, no `\\u` escape."""
    return body.isascii() and (body.find(b"\\") < 0 or body.find(b"\\u") < 0)


def _members(doc: Any) -> int:
    """The members of `doc`'s objects, a level of the document at a time: a few steps in
    Python per level (at most `MAX_DEPTH`), each element sorted and counted from C."""
    members = 0
    level = [doc]
    while level:
        kinds = list(map(type, level))
        objects = list(compress(level, map(_IS_DICT, kinds)))
        members += sum(map(len, objects))
        inner = list(
            chain.from_iterable(
                chain(map(dict.values, objects), compress(level, map(_IS_LIST, kinds)))
            )
        )
        # an empty one holds nothing (8 MiB of `[]` took 0.7 s, three times the parse)
        level = list(filter(None, compress(inner, map(_IS_CONTAINER, map(type, inner)))))
    return members


def _first_repeat(body: bytes) -> tuple[str, bool, str] | None:
    """(where, whether that path is the object's own, the repeated name) for the first
    object, in document order, that repeats a name; None when none does. Every object
    decodes to the tuple of its pairs (`tuple` is called from C: no Python call per
    object), walked without recursion; the depth was bounded by the parse before. Each
    node carries the steps to it as a chain (`(step, steps before)`): the path is spelled
    for the object found only (spelling one per member took 18 ms for 64 KiB)."""
    with no_collection(at_most(body)):
        top = json.loads(body, object_pairs_hook=tuple)
    stack: list[tuple[Any, Any]] = [(top, None)]
    while stack:
        node, steps = stack.pop()
        if type(node) is tuple:
            if len(dict(node)) != len(node):  # from C: a name repeats
                counts = Counter(name for name, _ in node)
                path, named = _spelled(steps)
                return path, named, next(name for name, count in counts.items() if count > 1)
            stack.extend(
                [(value, (name, steps)) for name, value in reversed(node) if _IS_NODE(type(value))]
            )
        else:
            stack.extend(
                [
                    (node[i], (i, steps))
                    for i in range(len(node) - 1, -1, -1)
                    if _IS_NODE(type(node[i]))
                ]
            )
    return None


_IS_NODE: Final = frozenset({tuple, list}).__contains__


def _spelled(steps: Any) -> tuple[str, bool]:
    """The path of a chain of steps (names and indices, the last first), as `_step` and
    `_index` name it."""
    chain_: list[str | int] = []
    while steps is not None:
        step, steps = steps
        chain_.append(step)
    path, named = "", True
    for step in reversed(chain_):
        path, named = (
            _index(path, named, step) if isinstance(step, int) else _step(path, named, step)
        )
    return path, named


def _step(path: str, named: bool, name: str) -> tuple[str, bool]:
    """The path to a member: its name when it is one of the API's, else the path stops."""
    if not named or name not in _KNOWN or path.count(".") + path.count("[") >= _MAX_PATH:
        return path, False
    return (f"{path}.{name}" if path else name), True


def _index(path: str, named: bool, index: int) -> tuple[str, bool]:
    if not named or path.count(".") + path.count("[") >= _MAX_PATH:
        return path, False
    return f"{path}[{index}]", True
