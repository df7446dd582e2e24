"""What a hosted call reads of a provider's answer, bounded (`limits.max_response_bytes`).

LiteLLM and the OpenAI SDK read a non-streamed answer whole (`Response.aread`) before the
gateway sees any of it, and a stream's event with all its lines: nothing of theirs
bounds either. A hostile or compromised provider (or whoever answers at its URL)
answering a 200 MB body grew `owngate serve` by 950 MB (VmHWM) before the gateway's own
size check refused it, and one endless SSE line of 100 MB by 610 MB: a 2 GB answer would
take the process down. `bounded_send` wraps httpx's (and httpx2's) `AsyncClient.send`
during a watched hosted call (gateway/upstream/hosted_transport.py), and
`bounded_send_sync` their `Client.send` the same way: LiteLLM serves some providers
(`maritalk/`, `amazon_nova/`, `oobabooga/`, `nlp_cloud/`, `petals/`) only
synchronously, in a worker thread that inherits the call's context, and read their
answers whole, 48 MiB of it with a 1 MiB bound:

- the request asks for `accept-encoding: identity`, and an answer in any other content
  coding is refused before a byte of it is read (a small gzip body can decode to
  gigabytes; the private path refuses codings the same way);
- a whole answer (`send(..., stream=False)`, or any answer that is not a 2xx: the SDK
  reads an error answer to a stream whole) past `max_bytes` raises `AnswerTooLarge`
  as soon as the byte past it arrives, and its connection is dropped;
- on a stream, one event past `max_bytes` (the bytes since the last blank line: the
  OpenAI SDK holds an event's `data:` lines until the blank line that ends it, and a
  line is parsed whole) does the same; a stream with no blank line (NDJSON, binary) is
  one event. A stream's total is not bounded here: it is relayed as it comes
  (`limits.stream_timeout_s` bounds its time), in pieces of 4 KiB with a turn of the
  event loop before each (`_PIECE`; a sync stream has no event loop to turn).

A request LiteLLM makes through aiohttp itself (its `ClientSession`, not httpx over its
aiohttp transport) is refused before it is sent (`UNBOUNDED`): nothing would bound what
aiohttp reads, nor stop it at a redirect.

The call's `Outbound` keeps why (`cut`), so the failure is told as the provider's
(`protocol`, 502) whatever LiteLLM wraps it in. httpx is imported by LiteLLM already
when this runs; nothing here imports it at module load.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    from gateway.upstream.hosted_transport import Outbound

__all__ = [
    "NOT_IDENTITY",
    "UNBOUNDED",
    "AnswerTooLarge",
    "bounded_send",
    "bounded_send_sync",
    "cut_kind",
    "in_bounded_send",
]


# Why a hosted answer was refused unread: a coding it was not asked for is the provider's
# failure (`protocol`: failover, breaker); any other cut is the answer's size, which a
# client can ask for (`too_large`: a 502, no failover, no breaker, as for a private one).
NOT_IDENTITY: Final = "answered in a content coding, not identity (read no further)"
# Why a request was refused before it was sent: LiteLLM reached for aiohttp itself, not
# through httpx (whose reads are bounded here); its answer would be read whole. The
# config refuses the routes that do (gateway/config/provider_routes.py): this is behind it.
UNBOUNDED: Final = (
    "is reached by LiteLLM over aiohttp directly, whose reads the gateway cannot bound (not sent)"
)
# Set while httpx's bounded `send` runs: LiteLLM's aiohttp transport under httpx sends
# from within it, in the same task (`in_bounded_send`).
_IN_SEND: ContextVar[bool] = ContextVar("owngate_in_bounded_send", default=False)


def cut_kind(cut: str) -> Literal["protocol", "too_large"]:
    """The HostedError kind of an answer cut short for `cut` (`Outbound.cut`)."""
    return "protocol" if cut in (NOT_IDENTITY, UNBOUNDED) else "too_large"


def in_bounded_send() -> bool:
    """Whether this runs within a bounded httpx `send`, whose reads are bounded."""
    return _IN_SEND.get()


class AnswerTooLarge(Exception):
    """A provider's answer, or one line of its stream, went past the bound: read no
    further. The message holds only the bound, no byte of the answer."""


# Why a sync read stopped: its call ended (timed out, cancelled) while LiteLLM's worker
# thread, which no cancellation reaches, still read the answer, as long as the provider
# kept sending (a byte a second held the thread, and its connection, for good).
ABANDONED: Final = "was still being read after its call ended (read no further)"


async def bounded_send(
    module: str,
    method: Callable[..., Awaitable[Any]],
    outbound: Outbound,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """`method(client, request, stream=..., ...)` (`AsyncClient.send` of `module`, httpx
    or httpx2) with what it reads of the answer bounded by `outbound.max_bytes`."""
    limit = outbound.max_bytes
    assert limit is not None
    request = args[1] if len(args) > 1 else kwargs["request"]
    request.headers["accept-encoding"] = "identity"
    whole = not kwargs.pop("stream", False)
    token = _IN_SEND.set(True)
    try:
        response = await method(*args, stream=True, **kwargs)
    finally:
        _IN_SEND.reset(token)
    if outbound.on_head is not None:
        outbound.on_head()  # the head is in: a whole answer's body has its own time
    try:
        whole = _checked(response, whole, outbound)
        response.stream = _bounded_stream(module, response.stream, limit, whole, outbound)
        if whole:
            await response.aread()
            outbound.answer = response.content if response.is_success else outbound.answer
    except BaseException:
        await response.aclose()
        raise
    return response


def bounded_send_sync(
    module: str,
    method: Callable[..., Any],
    outbound: Outbound,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """`bounded_send`'s twin for a sync `Client.send` (a provider LiteLLM serves only
    synchronously, in a worker thread): the same bounds. `outbound.on_head` is called
    from this thread (it hands the call's deadline to the event loop), so a whole answer's
    body has its own time here too."""
    limit = outbound.max_bytes
    assert limit is not None
    request = args[1] if len(args) > 1 else kwargs["request"]
    request.headers["accept-encoding"] = "identity"
    whole = not kwargs.pop("stream", False)
    response = method(*args, stream=True, **kwargs)
    try:
        if outbound.ended:  # its call ended while the head came in
            raise AnswerTooLarge(ABANDONED)
        if outbound.on_head is not None:
            outbound.on_head()  # the head is in: a whole answer's body has its own time
        whole = _checked(response, whole, outbound)
        response.stream = _bounded_stream(module, response.stream, limit, whole, outbound, True)
        if whole:
            response.read()
            outbound.answer = response.content if response.is_success else outbound.answer
    except BaseException:
        response.close()
        raise
    return response


def _checked(response: Any, whole: bool, outbound: Outbound) -> bool:
    """Refuse `response` unread if it is in a content coding; whether it is read whole
    (asked so, or an error answer: the OpenAI SDK reads an error answer to a stream whole
    to raise it)."""
    coding = response.headers.get("content-encoding", "identity").strip().lower()
    if coding not in ("", "identity"):
        outbound.cut = NOT_IDENTITY
        raise AnswerTooLarge(outbound.cut)
    return whole or not response.is_success


def _bounded_stream(
    module: str, inner: Any, limit: int, whole: bool, outbound: Outbound, sync: bool = False
) -> Any:
    key = (module, sync)
    cls = _BOUNDED.get(key)
    if cls is None:
        # loaded with LiteLLM already: this runs only inside a hosted call; a Response
        # checks that its stream is its own module's (Async|Sync)ByteStream
        http = importlib.import_module(module)
        made = _sync_class(http.SyncByteStream) if sync else _async_class(http.AsyncByteStream)
        cls = _BOUNDED[key] = made
    return cls(_Meter(limit, whole, outbound), inner)


# One class per HTTP module and kind, made once: a class made per call is a reference
# cycle of its own (a type holds itself), and its methods' closures held the answer's
# stream, its response and the request sent (the prompt) until the cyclic collector ran.
_BOUNDED: dict[tuple[str, bool], Any] = {}


class _Meter:
    """What is read of one answer: its total (`whole`) or its unfinished SSE event,
    checked against `limit` as each piece of a read is handed on."""

    __slots__ = ("event", "last", "limit", "outbound", "total", "whole")

    def __init__(self, limit: int, whole: bool, outbound: Outbound) -> None:
        self.limit, self.whole, self.outbound = limit, whole, outbound
        self.total = self.event = 0
        self.last = b""

    def pieces(self, read: bytes) -> Iterator[bytes]:
        """`read` whole (a whole answer) or in pieces of `_PIECE` (a stream's), each
        counted before it is handed on; `AnswerTooLarge` at the piece past the bound."""
        limit, whole = self.limit, self.whole
        step = len(read) if whole else _PIECE
        for start in range(0, len(read), step or 1):
            chunk = read[start : start + step] if step < len(read) else read
            self.total += len(chunk)
            if not whole:  # a whole answer's total bounds its events too
                self.event = _event_after(self.event, self.last, chunk)
                self.last = chunk[-1:] or self.last
            if (whole and self.total > limit) or self.event > limit:
                what = "an answer" if whole and self.total > limit else "a stream event"
                self.outbound.cut = (
                    f"sent {what} larger than {limit} bytes "
                    "(limits.max_response_bytes; read no further)"
                )
                raise AnswerTooLarge(self.outbound.cut)
            yield chunk


def _async_class(base: Any) -> Any:
    class Bounded(base):  # type: ignore[misc]
        def __init__(self, meter: _Meter, inner: Any) -> None:
            self._meter, self._inner = meter, inner

        async def __aiter__(self) -> AsyncIterator[bytes]:
            meter, stream = self._meter, not self._meter.whole
            async for read in self._inner:
                for chunk in meter.pieces(read):
                    # a stream's read handed on in pieces, a turn of the event loop before
                    # each: the SDK parses every event of what it is given without awaiting
                    if stream:
                        await asyncio.sleep(0)
                    yield chunk

        async def aclose(self) -> None:
            inner = self._inner
            if inner is None:
                return
            # httpx's own stream holds its response, which holds this one: let go of it
            # once closed, or the response (with the request sent, the prompt) stays in
            # that reference cycle until the cyclic collector runs.
            self._inner = None
            await inner.aclose()

    return Bounded


def _sync_class(base: Any) -> Any:
    class Bounded(base):  # type: ignore[misc]
        def __init__(self, meter: _Meter, inner: Any) -> None:
            self._meter, self._inner = meter, inner

        def __iter__(self) -> Iterator[bytes]:
            meter = self._meter
            for read in self._inner:
                if meter.whole and meter.outbound.ended:  # `bounded_send_sync` reads it
                    raise AnswerTooLarge(ABANDONED)
                yield from meter.pieces(read)

        def close(self) -> None:
            inner = self._inner
            if inner is None:
                return
            self._inner = None  # as the async one's `aclose`
            inner.close()

    return Bounded


# A blank line ends an SSE event: a line end followed by another (`\n\n`, `\r\r`, and
# `\n\r`, which `\r\n\r\n` holds); `\r\n` alone ends one line.
_BLANK: Final = (b"\n\n", b"\r\r", b"\n\r")
# What a stream's consumer is given at once: the OpenAI SDK and LiteLLM parse every event
# of a read before awaiting anything, and LiteLLM yields nothing for events with nothing
# to relay (an empty delta): 3,000 of those in one burst held the event loop 470 ms with
# a turn per relayed chunk only; a turn per 4 KiB holds it a few ms at most.
_PIECE: Final = 4096


def _event_after(event: int, last: bytes, chunk: bytes) -> int:
    """The bytes of the unfinished SSE event (since the last blank line) once `chunk`,
    read after a chunk that ended with `last`, is added to `event` of them. The OpenAI
    SDK's decoder holds an event's `data:` lines until the blank line that ends it, so
    bounding each line alone let a provider send short lines and never a blank one."""
    end = max(chunk.rfind(blank) for blank in _BLANK)
    if end >= 0:
        return len(chunk) - end - 2
    if last and (last + chunk[:1]) in _BLANK:
        return len(chunk) - 1
    return event + len(chunk)
