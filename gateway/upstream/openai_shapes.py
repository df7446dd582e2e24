"""The shapes of the OpenAI request objects a hosted call forwards, checked before
LiteLLM reads them (gateway/upstream/openai_request.py checks each field's JSON type first).

LiteLLM's adapters read these objects without checking them, and fail on a wrong shape
in ways that look like the provider failing. `InvalidField` names the field at fault.
"""

from __future__ import annotations

from typing import Any, Final

from gateway.upstream.openai_wire import Endpoint

__all__ = ["USER_CONTENT_TYPES", "InvalidField", "check_shapes"]

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


class InvalidField(ValueError):
    """A request field LiteLLM could not take: the wrong JSON type, or a malformed message.

    `param` names the field (`messages[2].content`); the message says what was expected
    and never repeats the value."""

    def __init__(self, param: str, expected: str) -> None:
        super().__init__(f"`{param}` must be {expected}")
        self.param = param


def check_shapes(endpoint: Endpoint, params: dict[str, Any]) -> None:
    """Raise `InvalidField` for the first field of `params` (LiteLLM arguments, each of its
    documented JSON type) whose shape LiteLLM could not take."""
    _check_shapes(params)
    if endpoint == "chat":
        _check_messages(params.get("messages"))


def _check_shapes(params: dict[str, Any]) -> None:
    """The parts of the API's object shapes LiteLLM reads without checking."""
    stop = params.get("stop")
    if isinstance(stop, list) and not all(isinstance(s, str) for s in stop):
        raise InvalidField("stop", "a string or an array of strings")
    response_format = params.get("response_format")
    if response_format is not None and not isinstance(response_format.get("type"), str):
        raise InvalidField("response_format.type", "a string")
    for i, tool in enumerate(params.get("tools") or ()):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise InvalidField(where, "an object with a string `type`")
        function = tool.get("function")
        if tool["type"] == "function" and not (
            isinstance(function, dict) and isinstance(function.get("name"), str)
        ):
            raise InvalidField(f"{where}.function", "an object with a string `name`")
    # LiteLLM's Gemini adapter raised TypeError on an entry that is not an object (a
    # string, a number): read as the provider failing, it counted on the hosted
    # backend's breaker, shared by every tenant, for the client's malformed request.
    for i, function in enumerate(params.get("functions") or ()):
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidField(f"functions[{i}]", "an object with a string `name`")


def _check_messages(messages: Any) -> None:
    """Each message an object with a string `role`; its `content` a string or an array of
    content parts, each an object with a string `type` that its role may send (for a user
    message, one LiteLLM knows); null only for an assistant (or legacy function) message."""
    if messages is None:
        return
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidField(where, "an object")
        role = message.get("role")
        if not isinstance(role, str):
            raise InvalidField(f"{where}.role", "a string")
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
                raise InvalidField(
                    f"{where}.content[{j}]",
                    f"a content part object with a `type` a {role} may send",
                )
