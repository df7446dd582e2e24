"""Reading a private backend's token usage as its client's JSON parser reads it.

The completion record's usage must be what the client was shown, so the gateway reads a
usage object the way the OpenAI Python SDK does: a whole answer's body with `json.loads`
of its bytes (as httpx's `Response.json`: a UTF-8 byte order mark is skipped), a
stream's `data:` value decoded as UTF-8 first (as its SSE decoder does). orjson, fast,
reads nearly every answer; what it refuses and the standard library reads (`NaN`,
`Infinity`, a number past a double's range, a lone surrogate escape, a byte order mark)
is read again with the standard library, so that a backend cannot show the client its
counts in a document the recorder would not read. Either parser keeps the last of two
copies of a key, as browsers' `JSON.parse` does.

A usage object's counts are `prompt_tokens`, `completion_tokens` and `total_tokens`,
each a JSON integer where present (a string, a float, `true` is no count: the object is
then none), absent ones 0. Zero counts are counts: the backend said zero. (The hosted
path's `openai_wire.usage_of` differs on purpose: LiteLLM writes zeros of its own.)
"""

from __future__ import annotations

import json
from typing import Any, Final

import orjson

__all__ = ["COUNTS", "counts_of", "read_json"]

COUNTS: Final = ("prompt_tokens", "completion_tokens", "total_tokens")


def read_json(data: bytes, *, line: bool = False) -> Any:
    """The JSON document `data` as the client's parser reads it; `line`: the value of a
    stream's `data:` line (decoded as UTF-8 before parsing). Raises ValueError when the
    client's parser would refuse it too."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    # The rare document orjson refuses: read it as the client does (UnicodeDecodeError
    # and JSONDecodeError are ValueErrors). Nested past the interpreter's recursion
    # limit, the client's parser fails as well: no document.
    try:
        return json.loads(data.decode("utf-8") if line else data)
    except RecursionError as exc:
        raise ValueError("nested too deep") from exc


def counts_of(usage: Any) -> dict[str, int] | None:
    """The three counts of a usage object (absent ones 0); None when it is not an object
    or a count in it is not an integer."""
    if not isinstance(usage, dict):
        return None
    counts = {name: usage.get(name, 0) for name in COUNTS}
    # `type`, not `isinstance`: `true` is no count (a bool is an int to Python).
    if not all(type(count) is int for count in counts.values()):
        return None
    return counts
