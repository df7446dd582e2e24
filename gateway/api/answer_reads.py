"""Reading a private backend's answer when nothing of it has reached the client yet: a
whole answer and an error body (for its message only), each held against the process's
budget for whole answers, and the check that a whole answer is whole.

A backend is trusted to serve, not to be well-behaved: an error body is read up to
64 KiB and only by the attempt's first-byte deadline (one that trickles in must not hold
the failover past the request's deadline); a JSON answer whose body ended with the
connection (no length, not chunked) is whole only if it parses as its client's
`json.loads` reads it, as a backend that died mid-answer closes the connection too. One
past the bounds the gateway parses within (`usage_read.PastBounds`: more arrays and
objects than `usage_read.MAX_CONTAINERS`, say) is judged by its syntax alone
(`json_syntax`, which builds nothing; a parse of a 15 MiB `[],[],...` held the event loop
6.8 s with the collector running) and gets the verdict a smaller one gets.

Every whole answer the gateway holds (and every error body it reads) is counted against
`limits.max_held_answer_bytes`, one budget for all requests of the process (`answers` of
the `Runtime`, a `BodyBudget`; the request's share is `Exchange.answer`), of which one
tenant's requests hold at most their part (`limits.max_held_answer_bytes_per_tenant`,
half by default: clients of one tenant reading nothing of large answers must not have
every other tenant's whole answers refused): its declared
`content-length` before any of it is read, else its bytes as they arrive. An answer that
would take the process past it is dropped (the backend connection with it) and the
client gets 429 `rate_limit_exceeded` with `retry-after: 1`, as for request bodies past
`limits.max_held_body_bytes`: the gateway is full, the backend did nothing wrong, so no
other backend is tried and its breaker is not charged. An error body past it is dropped
too; its status alone tells what happened then, as for one over 64 KiB.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from gateway.api import json_syntax
from gateway.api.trail import usage_in
from gateway.api.usage_read import PastBounds, read_json, utf8_document
from gateway.body_budget import Held, hold_answer
from gateway.errors import GatewayError
from gateway.provenance import Usage
from gateway.upstream.content_types import NO_BODY, UNRELAYABLE_TYPE, is_sse, relayed_kind
from gateway.upstream.http import UpstreamError, UpstreamResponse

__all__ = [
    "MAX_ERROR_BODY",
    "Unscanned",
    "check_readable",
    "check_status",
    "cover_answer",
    "ended_by_close",
    "is_sse",
    "read_error_body",
    "read_held",
    "relayed_type",
]

MAX_ERROR_BODY = 64 * 1024  # its message is shown: plenty


def relayed_type(content_type: bytes) -> bool:
    """Whether a 2xx answer of `content_type` is an event stream; `UpstreamError("shape")`
    for a type the gateway does not relay (gateway/upstream/content_types.py), before the
    client saw a byte."""
    kind = relayed_kind(content_type)
    if kind is None:
        raise UpstreamError("shape", UNRELAYABLE_TYPE)
    return kind


def cover_answer(held: Held, size: int) -> None:
    """Hold `size` bytes of the request's whole answer; `GatewayError` past the budget or
    its tenant's part of it: 429 `rate_limit_exceeded` with `retry-after: 1` (another
    request's answer may have been given back by then), 502 `upstream_error` past all of
    it (no retry could help; `limits.max_held_answer_bytes` and its per-tenant part are at
    least `max_response_bytes`, so only an answer the gateway would refuse anyway gets
    there)."""
    hold_answer(
        held,
        size,
        holder="gateway",
        setting="limits.max_held_answer_bytes",
        tenant_setting="limits.max_held_answer_bytes_per_tenant",
    )


async def read_held(
    response: UpstreamResponse, held: Held | None, limit: int, deadline: float | None = None
) -> bytes:
    """`response.read(limit, deadline=deadline)`, each byte held against `held` (None: not
    counted): a declared length within `limit` before anything is read, else the bytes
    as they arrive. Raises what `cover_answer` raises; the caller aborts the response."""
    if held is None:
        return await response.read(limit, deadline=deadline)
    announced = response.header(b"content-length")
    if announced is not None and announced.isdigit():
        size = int(announced)
        if size <= limit:
            cover_answer(held, size)  # larger: read() refuses it, reading nothing
    return await response.read(
        limit, deadline=deadline, reserve=lambda taken: cover_answer(held, taken)
    )


async def read_error_body(response: UpstreamResponse, by: float, held: Held | None) -> bytes:
    """An error answer's body, read by `by` (event-loop time) and within the whole
    answer's `response_timeout_s`, held against `held`; empty when too large, slow or
    broken, or past the budget for whole answers (the status alone tells what happened
    then)."""
    deadline = response.response_deadline
    try:
        return await read_held(
            response, held, MAX_ERROR_BODY, by if deadline is None else min(by, deadline)
        )
    except (UpstreamError, GatewayError):
        response.abort()  # a refused one is read no further
        return b""


def ended_by_close(response: UpstreamResponse) -> bool:
    """Whether `response` is a JSON answer the close ended (no length, not chunked): a
    backend that died mid-answer ends it the same way, so only its parse tells it whole
    (`check_readable`'s `closed`)."""
    return response.ended_by_close and _is_json(response.header(b"content-type"))


_JSON_SPACE: Final = b" \t\r\n"
_NOT_OBJECT: Final = "a body that is not a JSON object"
_NOT_PARSED: Final = "a JSON object that does not parse"
_CUT_SHORT: Final = "the answer ended with the connection, cut short"
_UNCHECKED: Final = "an answer past the bounds to check that it parses"


def check_status(status: int) -> None:
    """Raise `UpstreamError("shape")` for a 204, 205 or 304, or any other 3xx, whatever its
    content type: a `text/event-stream` one answering a stream request too. A fetch-based
    client (the OpenAI Node SDK) reads no body under the first three (the Fetch
    standard's null body statuses), so a stream relayed under one reached it as nothing
    while the record committed to the whole stream. A redirect is never followed (the
    policy says where a request goes, not a backend, or whoever took its address) and
    never relayed: without its `location` (which never reaches the client) no client
    follows it, and with one it would send the prompt where the backend said."""
    if status in NO_BODY:
        raise UpstreamError("shape", f"an answer with no body (HTTP {status})")
    if 300 <= status < 400:
        raise UpstreamError("shape", f"a redirect (HTTP {status}), not followed")


def check_readable(
    data: bytes, *, counted: bool = True, closed: bool = False, aside: bool = False
) -> Usage | None:
    """The usage of a 2xx whole answer as its client's `json.loads(bytes)` reads it
    (`counted`; else None: no record wants it), read before the client sees a byte; raise
    `UpstreamError("shape")` when it is one no OpenAI client reads as the completion,
    chat completion or embeddings it asked for: its body is empty, not a JSON object (an
    SDK's `response.json()` fails on it, or reads something that is not the answer), or
    opens one that does not parse (cut short inside its framing, bytes after it, a byte
    that is not text in its encoding). The record would state a success the client could
    not read: the attempt fails before the client saw a byte, as an answer of the other
    shape does (the next backend may serve, else 502). One past the read bounds
    (`PastBounds`) is judged the same by its syntax alone (`_check_unparsed`); relayed,
    its usage is unknown (None). The answer's one parse: the record's usage is read from
    it (`Trail.read_as`), never again.

    `closed`: a JSON answer the close ended (`ended_by_close`). One that does not parse
    was cut short by a backend that died: `UpstreamError("closed")`, as for a framed body
    that broke off. Read as the client reads it (`NaN`, UTF-16: orjson alone refused
    those, and failed answers the client reads).

    `aside`: the syntax scan of one past the read bounds is left to the caller, raised as
    `Unscanned` (the event loop's caller awaits its `scanned()`, in a worker thread)."""
    try:
        text = utf8_document(data)
        doc = read_json(text)
    except PastBounds:
        if aside:
            raise Unscanned(data, text, closed) from None
        _check_unparsed(data, text, closed=closed)
        return None
    except ValueError:
        raise _unreadable(data, closed=closed) from None
    if not isinstance(doc, dict):
        raise UpstreamError("shape", _NOT_OBJECT)
    return usage_in(doc, text) if counted else None


class Unscanned(Exception):
    """A whole answer past the read bounds whose syntax scan `check_readable(aside=True)`
    left to its caller. `scanned()` runs it in a worker thread: it holds the interpreter
    (a match of its regular expressions does not let go of it), but the event loop takes
    it back every switch interval (5 ms) between its matches of a few ms, where run on the
    loop it held it for the whole scan (some 1.7 s for 16 MiB of `[1,2],...`,
    docs/security.md). Within the bounds, the usual, nothing changes: no thread."""

    def __init__(self, data: bytes, text: bytes, closed: bool) -> None:
        super().__init__("an answer past the read bounds, its syntax not scanned yet")
        self._data, self._text, self._closed = data, text, closed

    async def scanned(self) -> None:
        """Return once its syntax was scanned (its usage is unknown), or raise what
        `check_readable` raises. On threads of its own (`_SCANS`), not the loop's default
        executor: a hostile backend's answers, each a second or more of scanning, took
        every thread of that one, and the host name lookups of connections to the other
        backends, config reloads and cosignature files queued behind them. Cancelled (its
        client left), a scan not started is dropped; one running is waited for, as it
        holds the answer the relay counts held (`limits.max_held_answer_bytes`) until it
        ends (bounded: `json_syntax.MAX_STEPS`)."""
        scan = _SCANS.submit(_check_unparsed, self._data, self._text, closed=self._closed)
        try:
            await asyncio.wrap_future(scan)
        except asyncio.CancelledError:
            if not scan.cancel():  # running (or ended): waited for, whatever cancels again
                ended = asyncio.wrap_future(scan)
                while not ended.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.wait([ended])
                ended.exception()  # its verdict, moot now, taken (none logged as unread)
                del ended
            raise
        finally:
            # Its error's traceback holds this frame: a cycle through the future holding
            # the error would keep the answer until the collector finds it.
            del scan


# Threads the syntax scans run on (`Unscanned.scanned`): two, as each holds the interpreter
# but for the loop's turns (more would run no faster, and take more turns from the loop);
# not daemons: a scan ends within `json_syntax.MAX_STEPS`, and the process waits for it.
_SCANS: Final = ThreadPoolExecutor(2, thread_name_prefix="owngate-json-scan")


def _check_unparsed(data: bytes, text: bytes, *, closed: bool) -> None:
    """Judge an answer past the read bounds (`text`: `data` in UTF-8) as one within them is
    judged, by its syntax alone (`json_syntax.refused`, which builds nothing): one its
    client's `json.loads` refuses fails as `_unreadable`; one that opens no object is no
    answer; one the scan gives up on (`json_syntax.Unchecked`, built to be costly) cannot be
    told readable, nor whole: a failed attempt, never relayed as served."""
    try:
        refused = json_syntax.refused(text)
    except json_syntax.Unchecked:
        raise UpstreamError("closed" if closed else "shape", _UNCHECKED) from None
    if refused:
        raise _unreadable(data, closed=closed)
    if not _opens_object(data):
        raise UpstreamError("shape", _NOT_OBJECT)


def _unreadable(data: bytes, *, closed: bool) -> UpstreamError:
    """The failure of an answer its client's `json.loads` refuses: cut short when the close
    ended it (a backend that died mid-answer), else of a shape no client reads."""
    if closed:
        return UpstreamError("closed", _CUT_SHORT)
    return UpstreamError("shape", _NOT_PARSED if _opens_object(data) else _NOT_OBJECT)


def _opens_object(data: bytes) -> bool:
    """Whether `data`'s first character past JSON whitespace is `{`, read in the encoding
    `json.loads(bytes)` (so httpx's `response.json()`) would read it in."""
    encoding = json.detect_encoding(data)
    if encoding == "utf-8":
        return data.lstrip(_JSON_SPACE)[:1] == b"{"
    return data.decode(encoding, errors="replace").lstrip(" \t\r\n")[:1] == "{"


def _is_json(content_type: bytes | None) -> bool:
    """Whether an answer of `content_type` is JSON (none given: the relay's default)."""
    return content_type is None or content_type.lower().find(b"json") >= 0  # `find`: labels.py
