"""`InvalidField`, the error of a hosted request's field and shape checks
(gateway/upstream/openai_request.py, openai_shapes.py, openai_messages.py and the bounds
beside them), and `check_keys`, the check the shape checks share: an object's optional
keys, each of its JSON type."""

from __future__ import annotations

from typing import Any, Final

__all__ = ["InvalidField", "check_keys"]

_NAMES: Final = {str: "a string", dict: "an object", bool: "a boolean", list: "an array"}


class InvalidField(ValueError):
    """A request field LiteLLM could not take: the wrong JSON type, or a malformed message.

    `param` names the field (`messages[2].content`); the message says what was expected
    and never repeats the value."""

    def __init__(self, param: str, expected: str) -> None:
        super().__init__(f"`{param}` must be {expected}")
        self.param = param


def check_keys(where: str, obj: dict[str, Any], **types: type) -> None:
    """Each of `types`' keys, when present and not null, holds a value of its type."""
    for key, kind in types.items():
        value = obj.get(key)
        if value is not None and not isinstance(value, kind):
            raise InvalidField(f"{where}.{key}", _NAMES[kind])
