"""Request shapes for the hosted path's tests (gateway/upstream/openai_shapes.py): chat
documents in every documented shape the gateway sends on (`VALID_CHAT`), and `mutated`,
a seeded walk that breaks one to three places of one of them with junk values (numbers,
null, booleans, arrays, objects, and strings holding `CANARY`, which no error may repeat).
"""

from __future__ import annotations

import copy
import random
from typing import Any, Final

__all__ = ["CALL", "CANARY", "USER", "VALID_CHAT", "chat", "mutated", "user"]

CANARY: Final = "CANARY-shape-7c1e"
USER: Final = {"role": "user", "content": "hi"}
CALL: Final = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def user(*parts: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(parts)}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [USER], **fields}


VALID_CHAT: Final[list[dict[str, Any]]] = [
    chat(tool_choice="none"),
    chat(tool_choice="auto"),
    chat(tool_choice="required"),
    chat(tool_choice={"type": "function", "function": {"name": "f"}}),
    chat(tool_choice={"type": "custom", "custom": {"name": "c"}}),
    chat(tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}),
    chat(
        messages=user(
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": "https://images.example/a.png"},
            {"type": "image_url", "image_url": {"url": "data:,", "detail": "low"}},
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            {"type": "file", "file": {"file_data": "data:,", "filename": "a.pdf"}},
            {"type": "video_url", "video_url": {"url": "https://videos.example/a.mp4"}},
        )
    ),
    chat(
        messages=[
            {"role": "system", "content": [{"type": "text", "text": "terse"}], "name": "ops"},
            USER,
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "content": "42", "tool_call_id": "call_1"},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
            {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": ""}},
            {"role": "function", "content": "1", "name": "f"},
            {"role": "assistant", "content": "ok", "tool_calls": None, "name": None},
        ]
    ),
    chat(
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "description": "d",
                    "parameters": {"type": "object", "properties": {}, "required": []},
                    "strict": True,
                },
            },
            {"type": "custom", "custom": {"name": "c", "format": {"type": "text"}}},
        ]
    ),
    chat(functions=[{"name": "f", "parameters": {}}], function_call="auto"),
    chat(functions=[{"name": "f"}], function_call={"name": "f"}),
    chat(response_format={"type": "json_object"}),
    chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}),
    chat(modalities=["text"], logit_bias={"50256": -100, "1": 0.5}, stop=["\n"]),
]

_JUNK: Final[list[Any]] = [
    None,
    5,
    -1,
    1.5,
    True,
    "",
    CANARY * 50,
    [],
    [5],
    [CANARY],
    {},
    {"x": CANARY},
]


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key or index path inside `value`."""
    found: list[tuple[Any, ...]] = []
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, inner in items:
        found.append((*at, key))
        found.extend(_paths(inner, (*at, key)))
    return found


def mutated(rng: random.Random) -> dict[str, Any]:
    """One of `VALID_CHAT`, copied, with one to three of its places (never `model`) set to
    junk."""
    doc = copy.deepcopy(rng.choice(VALID_CHAT))
    for _ in range(rng.randint(1, 3)):
        path = rng.choice([p for p in _paths(doc) if p[0] != "model"])
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = copy.deepcopy(rng.choice(_JUNK))
    return doc
