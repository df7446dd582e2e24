"""The shapes of a hosted chat's messages, checked before LiteLLM reads them (for
`check_shapes`, gateway/upstream/openai_shapes.py, which says why): each message, its
content parts and their payloads, an assistant's tool calls, a tool result's id, a legacy
function result's name; and the bounds on how much searching and moving a provider's
adapter would do over them. `content_parts` walks the content parts of messages not
checked yet.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from gateway.upstream.assistant_runs import MAX_RUN_COMPARISONS, TOO_MANY_COMPARISONS, run_parts
from gateway.upstream.invalid_field import InvalidField, check_keys

__all__ = [
    "MAX_SYSTEM_MOVES",
    "MAX_TOOL_LOOKUPS",
    "USER_CONTENT_TYPES",
    "check_messages",
    "content_parts",
]

# The content part types LiteLLM 1.108.7 accepts in a user message
# (`litellm.types.llms.openai.ValidUserMessageContentTypes`; a test compares them): it
# raises on any other before calling the provider.
USER_CONTENT_TYPES: Final = frozenset(
    {
        "text",
        "image_url",
        "input_audio",
        "audio_url",
        "document",
        "guarded_text",
        "grounding_source",
        "query",
        "video_url",
        "file",
    }
)

# The content part types each role may send (the API reference; for users, LiteLLM's list).
_PART_TYPES: Final[dict[str, frozenset[str]]] = {
    "user": USER_CONTENT_TYPES,
    "system": frozenset({"text"}),
    "developer": frozenset({"text"}),
    "assistant": frozenset({"text", "refusal"}),
    "tool": frozenset({"text"}),
}
# The roles whose `content` may be null (an assistant turn that only calls tools).
_NULL_CONTENT_ROLES: Final = frozenset({"assistant", "function"})
# A content part's payload: the key its type names, and the types that key may hold.
# LiteLLM takes an image (video, audio) URL as a plain string too.
_URL_PARTS: Final = frozenset({"image_url", "video_url", "audio_url"})
_TEXT_PARTS: Final = frozenset({"text", "guarded_text"})
_FILE_KEYS: Final = ("file_data", "file_id", "filename", "format", "detail")

# LiteLLM's Gemini adapter names each tool result by searching the latest assistant
# message's tool calls for its id, one by one: 32,000 calls and their results (4 MB) held
# the gateway's CPU 80 s. Results times the calls they are searched among are bounded
# (some 0.1 s of such searching); a conversation of a hundred calls and results is 10,000.
# Its comparisons of tool calls with the parts before them: assistant_runs.py.
MAX_TOOL_LOOKUPS: Final = 1 << 20
_RESULT_ROLES: Final = frozenset({"tool", "function"})
_TOO_MANY_LOOKUPS: Final = (
    f"at most {MAX_TOOL_LOOKUPS} tool results times the tool calls of the assistant "
    "message before them (a provider's adapter searches those calls for each result)"
)
# It takes the system messages out one by one, each moving every message after it: 130,000
# between as many others (9 MB) held the CPU 0.9 s, 4 times that at twice the body. The
# messages times the system (or developer) ones before them are bounded (some 0.05 s).
MAX_SYSTEM_MOVES: Final = 1 << 28
_SYSTEM_ROLES: Final = frozenset({"system", "developer"})
_TOO_MANY_MOVES: Final = (
    f"at most {MAX_SYSTEM_MOVES} messages times the system messages before them (a "
    "provider's adapter moves each message after a system one as it takes that out)"
)


def content_parts(messages: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """(`messages[i].content[j]`, part) for each object part of each chat message whose
    content is an array; anything of another shape is passed over, never an error (what
    walks a request before its shapes are checked, or for a backend they are not)."""
    if not isinstance(messages, list):
        return
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if isinstance(part, dict):
                yield f"messages[{i}].content[{j}]", part


def check_messages(messages: list[Any]) -> None:
    """Each message an object with a string `role` (and `name`, if any); its `content` a
    string or an array of content parts its role may send; null only for an assistant (or
    legacy function) message. An assistant's tool calls and a tool result's id, a legacy
    function result's name, as the API has them; tool results times the calls they are
    looked up among at most `MAX_TOOL_LOOKUPS`, tool calls times the parts of their run at
    most `MAX_RUN_COMPARISONS` (gateway/upstream/assistant_runs.py), messages times the
    system messages before them at most `MAX_SYSTEM_MOVES`."""
    calls, lookups = 0, 0  # the latest assistant's tool calls; results times calls so far
    run = compared = 0  # parts of the run of assistant messages; calls times parts
    systems = moves = 0  # system messages so far; messages times the system ones before
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidField(where, "an object")
        role = message.get("role")
        if not isinstance(role, str):
            raise InvalidField(f"{where}.role", "a string")
        check_keys(where, message, name=str)
        run, compared = run_parts(role, message, run, compared)
        if compared > MAX_RUN_COMPARISONS:
            raise InvalidField("messages", TOO_MANY_COMPARISONS)
        if role in _SYSTEM_ROLES:
            systems += 1
        elif (moves := moves + systems) > MAX_SYSTEM_MOVES:
            raise InvalidField("messages", _TOO_MANY_MOVES)
        if role in _RESULT_ROLES:
            lookups += calls
            if lookups > MAX_TOOL_LOOKUPS:
                raise InvalidField("messages", _TOO_MANY_LOOKUPS)
        if role == "assistant":
            _check_tool_calls(where, message)
            calls = len(message.get("tool_calls") or ()) or calls
        elif role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise InvalidField(f"{where}.tool_call_id", "a string (a tool result names its call)")
        elif role == "function" and not isinstance(message.get("name"), str):
            raise InvalidField(f"{where}.name", "a string (a function result names its function)")
        content = message.get("content")
        if content is None and role in _NULL_CONTENT_ROLES:
            continue
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            nullable = " or null" if role in _NULL_CONTENT_ROLES else ""
            raise InvalidField(
                f"{where}.content", f"a string or an array of content parts{nullable}"
            )
        known = _PART_TYPES.get(role)  # an unknown role: LiteLLM or the provider decides
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if not isinstance(kind, str) or (known is not None and kind not in known):
                # The role is named only when it is one of the API's: any other is the
                # client's text, never repeated.
                sender = f"a {role}" if known is not None else "its role"
                raise InvalidField(
                    f"{where}.content[{j}]",
                    f"a content part object with a `type` {sender} may send",
                )
            _check_part(f"{where}.content[{j}]", kind, part)


def _check_part(where: str, kind: str, part: dict[str, Any]) -> None:
    """A content part's payload (`text` of a text part, `image_url` of an image, ...)."""
    if kind in _TEXT_PARTS or kind == "refusal":
        key = "text" if kind in _TEXT_PARTS else "refusal"
        if not isinstance(part.get(key), str):
            raise InvalidField(f"{where}.{key}", "a string")
    elif kind in _URL_PARTS:
        payload = part.get(kind)
        if isinstance(payload, str):
            return
        if not isinstance(payload, dict) or not isinstance(payload.get("url"), str):
            raise InvalidField(f"{where}.{kind}", "a URL string or an object with a string `url`")
        check_keys(f"{where}.{kind}", payload, detail=str, format=str)
    elif kind == "input_audio":
        audio = part.get(kind)
        if not (
            isinstance(audio, dict)
            and isinstance(audio.get("data"), str)
            and isinstance(audio.get("format"), str)
        ):
            raise InvalidField(f"{where}.input_audio", "an object with string `data` and `format`")
    elif kind == "file":
        file = part.get(kind)
        if not isinstance(file, dict) or not ({"file_data", "file_id"} & file.keys()):
            raise InvalidField(f"{where}.file", "an object with `file_data` or `file_id`")
        check_keys(f"{where}.file", file, **dict.fromkeys(_FILE_KEYS, str))


def _check_tool_calls(where: str, message: dict[str, Any]) -> None:
    """An assistant's `tool_calls`: objects with a string `id` and a `function` with string
    `name` and `arguments`; its legacy `function_call` likewise."""
    calls = message.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        raise InvalidField(f"{where}.tool_calls", "an array")
    expected = "an object with string `name` and `arguments`"
    for k, call in enumerate(calls or ()):
        at = f"{where}.tool_calls[{k}]"
        if not isinstance(call, dict) or not isinstance(call.get("id"), str):
            raise InvalidField(at, "an object with a string `id`")
        check_keys(at, call, type=str)
        if not _is_call(call.get("function")):
            raise InvalidField(f"{at}.function", expected)
    function_call = message.get("function_call")
    if function_call is not None and not _is_call(function_call):
        raise InvalidField(f"{where}.function_call", expected)


def _is_call(function: Any) -> bool:
    return (
        isinstance(function, dict)
        and isinstance(function.get("name"), str)
        and isinstance(function.get("arguments"), str)
    )
