"""The usage the OpenAI SDK's legacy `Stream.__stream__` (openai/_streaming.py) shows its
client for a stream's bytes, told by the installed SDK's own `SSEDecoder`: the last
`usage` of an event it handed on (`chunk.usage`: an object, or whatever else that is not
null, as the SDK builds a chunk without validation), up to where it stops reading. It stops at data
starting `[DONE]`, and raises (reads no further) at a line that is not UTF-8 (its decoder's
`bytes.decode`), at an event whose data `json.loads` refuses (an event dispatched without
data included: a name, an id or a retry dispatches one), and at a top-level truthy
`error`; a `thread.*` event's data is handed on nested under "data"."""

from __future__ import annotations

from typing import Any

from openai._streaming import SSEDecoder

COUNT_NAMES = ("prompt_tokens", "completion_tokens", "total_tokens")


def sdk_shown_usage(body: bytes) -> Any:
    """The last `usage` the SDK hands its client for `body` (the bytes it reads): an
    object, or a value that is none (`7`), or None (no event showed one)."""
    seen = None
    events = SSEDecoder().iter_bytes(iter([body]))
    while True:
        try:
            sse = next(events)
        except StopIteration:
            return seen
        except UnicodeDecodeError:
            return seen  # the SDK raised
        if sse.data.startswith("[DONE]"):
            return seen
        try:
            data = sse.json()
        except (ValueError, RecursionError):
            return seen  # the SDK raised
        if sse.event and sse.event.startswith("thread."):
            data = {"data": data, "event": sse.event}
        if isinstance(data, dict) and data.get("error"):
            return seen  # the SDK raised
        if isinstance(data, dict) and data.get("usage") is not None:
            seen = data["usage"]


def counts(usage: Any) -> dict[str, int] | None:
    """The three counts a record states of a usage object (absent ones 0), or None (no
    usage, or one that is no object or has a count that is no integer)."""
    if not isinstance(usage, dict):
        return None
    found = {name: usage.get(name, 0) for name in COUNT_NAMES}
    return found if all(type(v) is int for v in found.values()) else None
