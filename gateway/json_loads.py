"""Parsing a large JSON document on the event loop without running the garbage collector
over and over while it is built.

Each array orjson builds is a new object the cyclic collector tracks, and every 700 or so
new ones start a collection that walks the young ones; a document of millions of arrays
ran the collector until its parse took ten times as long: a 2.3 MB request body of
`[],[],...` (within a tenant's body budget) held the event loop 1.5 s where orjson alone
takes 0.15 s, and 16 MiB of them in a backend's answer 5 times as long as the parse. What
orjson builds from JSON holds no reference cycle, so its refcounts free it: `loads`
parses a document of many arrays and objects with the collector off (it runs once, on
what is due, when it is on again). Request bodies (`gateway/api/body.py`, and the copies
`gateway/upstream/tenant_ids.py` re-encodes) backends' answers read for their usage
(`gateway/api/usage_read.py`) and hosted providers' whole answers read for how they ended
(`json_object`: gateway/upstream/hosted_finish.py, anthropic_stops.py) are parsed with it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

import orjson

__all__ = ["COLLECT_UNDER", "at_most", "json_object", "loads", "no_collection"]

# Arrays and objects past which a document is parsed with the collector off (a usual
# document holds far fewer: a collection runs every 700 or so new ones).
COLLECT_UNDER: Final = 10_000


def at_most(data: bytes) -> int:
    """An upper bound of the arrays and objects `data` opens, without reading it: each
    takes two bytes at least (`[]`)."""
    return len(data) // 2


@contextmanager
def no_collection(opened: int) -> Iterator[None]:
    """No garbage collection while a document of `opened` arrays and objects is built
    (none turned off for fewer than `COLLECT_UNDER`, or when it is off already)."""
    if opened <= COLLECT_UNDER or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def loads(data: bytes, opened: int | None = None) -> Any:
    """`orjson.loads(data)` with the collector off for a document of many arrays and
    objects; `opened`: how many it opens when the caller counted them already, else
    `at_most(data)` (counting them would scan the document twice more than the parse
    does: 70 us for a 100 KB prompt, twice orjson's own parse of it). The switch is
    inline, not `no_collection`: every request's body is parsed here, and the context
    manager's calls cost 2.4 us, three times orjson's parse of a usual 400-byte body."""
    if (len(data) // 2 if opened is None else opened) <= COLLECT_UNDER or not gc.isenabled():
        return orjson.loads(data)
    gc.disable()
    try:
        return orjson.loads(data)
    finally:
        gc.enable()


def json_object(data: bytes | None) -> dict[str, Any] | None:
    """`data` parsed (`loads`: the collector off for a document of many arrays) when it is
    a JSON object; None when it is empty, not JSON, or another JSON value. How a provider's
    whole answer (up to `limits.max_response_bytes`) is read for what it says of itself."""
    if not data:
        return None
    try:
        doc = loads(data)
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None
