"""Reading a private backend's token usage as its client's JSON parser reads it.

The completion record's usage must be what the client was shown, so the gateway reads a
usage object the way the OpenAI Python SDK does: a whole answer's body with `json.loads`
of its bytes (as httpx's `Response.json`: UTF-16 and UTF-32 are told by their zero bytes
or byte order mark, a UTF-8 byte order mark is skipped), a stream's `data:` value decoded
as UTF-8 first (as its SSE decoder does). orjson, fast, reads nearly every answer; what
it refuses and the standard library reads (`NaN`, `Infinity`, a number past a double's
range, a lone surrogate escape) is read again with the standard library, so that a
backend cannot show the client its counts in a document the recorder would not read; so
is one whose usage has a count orjson read as a float (`counts_in`): orjson reads an
integer past 64 bits as one, the standard library as the integer the client is shown.
Either parser keeps the last of two copies of a key, as browsers' `JSON.parse` does.

Bounded, as it runs on the event loop (docs/provenance.md, known limits): a document
nested deeper than `MAX_DEPTH` arrays and objects is none (the standard library's parser
recurses: whether the client's raises depends on its stack), the standard library,
about 20 times slower than orjson, reads no document over `MAX_FALLBACK` bytes, and no
document holding more than `MAX_CONTAINERS` arrays and objects (outside its strings) is
parsed at all: each costs orjson some 100 to 200 bytes and a Python object to build and
free, so a 15 MiB whole answer of `[],[],...` from a hostile backend held the event loop
0.9 s and grew the process by 510 MB while it was read (`{"a":{}},...`: 2.1 s, 580 MB).
Such a document raises `PastBounds`: the client's parser may read it, so what it holds is
unknown, not absent (a stream's readers then state no usage, never an earlier one).

A usage object's counts are `prompt_tokens`, `completion_tokens` and `total_tokens`,
each a JSON integer where present (a string, a float, `true` is no count: the object is
then none), absent ones 0. Zero counts are counts: the backend said zero. (The hosted
path's `openai_wire.usage_of` differs on purpose: LiteLLM writes zeros of its own.)
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any, Final

import orjson

from gateway.json_loads import no_collection

__all__ = [
    "COUNTS",
    "MAX_CONTAINERS",
    "MAX_DEPTH",
    "MAX_FALLBACK",
    "PastBounds",
    "counts_in",
    "counts_of",
    "read_json",
    "utf8_document",
]

COUNTS: Final = ("prompt_tokens", "completion_tokens", "total_tokens")
MAX_DEPTH: Final = 512  # arrays and objects, one in the other
MAX_FALLBACK: Final = 1024 * 1024  # bytes the standard library's parser reads
# Arrays and objects one parsed document may hold: at most some 50 MB and 0.15 s of the
# event loop to build and free. An answer with logprobs (20 alternatives a token, 4,096
# tokens) holds about 180,000; a stream event (64 KiB at most) under 44,000.
MAX_CONTAINERS: Final = 1 << 18
_SPLIT_QUOTES: Final = 1 << 17  # quotes past which strings are not taken out to count

# orjson refuses a document nested deeper than 1024 (tests/unit/test_usage_read.py holds
# it to that): one wrapped in 512 arrays parses only if it is nested no deeper than 512.
_ORJSON_DEPTH: Final = 1024
_WRAP: Final = _ORJSON_DEPTH - MAX_DEPTH
# A string, or what is left of the document from a quote that opens one never closed:
# a search for it never fails once it found a quote, so it never scans the rest of the
# document again from the next quote (a hostile answer's `"\"[\"[...` with no closing
# quote cost a scan to its end per quote: 10 s of the event loop for a 48 KB stream event,
# minutes for a 300 KB whole answer). A JSON parser refuses such a document there anyway.
_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKETS: Final = bytes(set(range(256)) - set(b"[]{}"))
_STEP: Final = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


class PastBounds(ValueError):
    """A document past the bounds the gateway reads within (nested deeper than
    `MAX_DEPTH`, or over `MAX_FALLBACK` bytes for the standard library): the client's
    parser may well read it, so its usage is unknown."""


def read_json(data: bytes, *, line: bool = False) -> Any:
    """The JSON document `data` as the client's parser reads it; `line`: the value of a
    stream's `data:` line (decoded as UTF-8 before parsing), else a whole answer in UTF-8
    (`utf8_document`). Raises ValueError when the client's parser would refuse it too,
    `PastBounds` (a ValueError) when it is past the bounds above (the module's text)."""
    containers = _containers(data)
    if containers <= MAX_DEPTH:  # the usual: too few to be deep
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    else:
        with no_collection(containers):
            try:
                return _unwrapped(orjson.loads(b"[" * _WRAP + data + b"]" * _WRAP))
            except orjson.JSONDecodeError:
                pass
            try:  # it parses unwrapped: it was nested too deep
                orjson.loads(data)
            except orjson.JSONDecodeError:
                pass
            else:
                raise PastBounds("nested too deep")
    return _read_refused(data, line=line)


def _containers(data: bytes) -> int:
    """How many arrays and objects `data` opens, counted cheaply (brackets in strings too);
    `PastBounds` past `MAX_CONTAINERS`, unless the brackets past it are in strings (an
    answer of code or prose full of brackets) and the strings are few enough to take out
    cheaply (`_SPLIT_QUOTES`: removing 1.7 million of them built as many pieces, 400 MB)."""
    containers = data.count(b"[") + data.count(b"{")
    if containers <= MAX_CONTAINERS:
        return containers
    if data.count(b'"') <= _SPLIT_QUOTES:
        bare = _STRING.sub(b"", data)
        if bare.count(b"[") + bare.count(b"{") <= MAX_CONTAINERS:
            return containers
    raise PastBounds("too many arrays and objects")


def utf8_document(data: bytes) -> bytes:
    """A whole answer's bytes in UTF-8, decoded as `json.loads(bytes)` decodes them (its
    `json.detect_encoding`: UTF-16 or UTF-32 by the zero bytes of its first characters or
    its byte order mark; a UTF-8 byte order mark skipped); lone surrogates are kept as
    `surrogatepass` writes them. Raises ValueError (its subclasses) where
    `json.loads` would."""
    encoding = json.detect_encoding(data)
    if encoding == "utf-8":
        return data
    if encoding == "utf-8-sig":
        return data[3:]
    text = data.decode(encoding, "surrogatepass")
    if text.startswith("\ufeff"):  # a second byte order mark: `json.loads` refuses it
        raise json.JSONDecodeError("a second byte order mark", text, 0)
    return text.encode("utf-8", "surrogatepass")


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


def counts_in(doc: Any, data: bytes, *, line: bool = True) -> dict[str, int] | None:
    """`counts_of` the `usage` of `doc`, which orjson parsed from `data` (`line`: as for
    `read_json`): a count orjson read as a float is read again with the standard library,
    which reads an integer literal past 64 bits (`18446744073709551616`) as the integer
    the client's SDK shows, where orjson gives a float (then counts, past the record's
    range: it states none, never an earlier usage). A real float stays no count."""
    usage = doc.get("usage") if isinstance(doc, dict) else None
    counts = counts_of(usage)
    if counts is not None or not isinstance(usage, dict):
        return counts
    if not any(type(usage.get(name)) is float for name in COUNTS):
        return None
    try:
        exact = _read_refused(data, line=line)
    except ValueError:  # past the standard library's bounds: read as orjson read it
        return None
    return counts_of(exact.get("usage") if isinstance(exact, dict) else None)


def _unwrapped(wrapped: Any) -> Any:
    """The document inside the `_WRAP` arrays `read_json` put around it: each holds
    exactly one value, or the bytes were not one document (`1],[2` closes and opens)."""
    for _ in range(_WRAP):
        if type(wrapped) is not list or len(wrapped) != 1:
            raise ValueError("not one JSON document")
        wrapped = wrapped[0]
    return wrapped


def _read_refused(data: bytes, *, line: bool) -> Any:
    """The rare document orjson refuses, read as the client does, within the bounds
    (UnicodeDecodeError and JSONDecodeError are ValueErrors)."""
    if len(data) > MAX_FALLBACK:
        raise PastBounds("too long to read with the standard library")
    if _too_deep(data):
        raise PastBounds("nested too deep")
    try:
        return json.loads(data.decode("utf-8") if line else data)
    except RecursionError as exc:  # the client's parser fails as well
        raise ValueError("nested too deep") from exc


def _too_deep(data: bytes) -> bool:
    """Whether arrays and objects nest deeper than `MAX_DEPTH` in `data` (a valid
    document: its brackets outside its strings match)."""
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:
        return False  # the usual: too few to be deep
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0) > MAX_DEPTH
