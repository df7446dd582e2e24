"""What the listener notes when a connection ends (`ConnectionLoss.note`, gateway/body_writer.py)
and what a request waiting for its answer to be taken (`BodyWriter.taken`) learns from it,
driven on the listener's protocol with a transport whose write buffer the test sets (no socket).

The wait looks at the write buffer again only on a later turn of the loop: the ends here come
in one turn, as a client that took the answer's last bytes and closed between two looks. Once
the connection is lost, uvloop reports an empty buffer: before, such a client was always 499.
The client's EOF with nothing left in the buffer, or a loss without an error (a close whose
buffer went out), is a client that took every byte; a reset, the gateway's own aborts (a write
timeout, the connection cap's eviction, the forced shutdown's drop) and a write that found the
connection closing are not."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from gateway.body_writer import BodyWriter, body_writer, drop
from gateway.listener import LimitedHttpProtocol
from tests.helpers.listener_protocol import GET, RecordingTransport, listener_protocol


class _Buffered(RecordingTransport):
    """A transport whose write buffer holds `unsent` bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.unsent = 0

    def get_write_buffer_size(self) -> int:
        return self.unsent


class _Answered:
    """An app that answers whole once `go` is set, then waits for the answer to be taken."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.waiting = asyncio.Event()
        self.writer: BodyWriter | None = None
        self.taken: bool | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await self.go.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"hi", "more_body": False})
        self.writer = body_writer(scope)
        assert self.writer is not None
        self.waiting.set()
        self.taken = await self.writer.taken()


End = Callable[[LimitedHttpProtocol, _Buffered], None]


def _answer(end: End, *, eof_first: bool = False) -> tuple[_Answered, _Buffered]:
    """Answer a request whose bytes stay in the write buffer, then `end` the connection in
    one turn. `eof_first`: the client's EOF comes (and the connection closes) before the
    answer is written."""

    async def scenario() -> tuple[_Answered, _Buffered]:
        app = _Answered()
        protocol = listener_protocol(app)
        transport = _Buffered()
        transport.unsent = 10  # the answer's tail: the kernel has not taken it yet
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.data_received(GET)
        if eof_first:
            transport.unsent = 0
            protocol.eof_received()
            transport.close()  # what uvloop does after `eof_received`
        app.go.set()
        await app.waiting.wait()
        end(protocol, transport)
        await asyncio.wait_for(asyncio.gather(*protocol.tasks), 10)
        return app, transport

    return asyncio.run(scenario())


def _taken_then(exc: Exception | None, *, eof: bool) -> End:
    """The kernel took the tail; then the client's EOF (`eof`) and the loss (`exc`)."""

    def end(protocol: LimitedHttpProtocol, transport: _Buffered) -> None:
        transport.unsent = 0
        if eof:
            protocol.eof_received()
            transport.close()
        protocol.connection_lost(exc)

    return end


@pytest.mark.parametrize(
    "end",
    [_taken_then(None, eof=True), _taken_then(None, eof=False)],
    ids=["eof", "clean-close"],
)
def test_a_client_that_took_every_byte_and_closed_took_the_answer(end: End) -> None:
    app, _ = _answer(end)
    assert app.taken is True


def _eof_with_tail_then_reset(protocol: LimitedHttpProtocol, transport: _Buffered) -> None:
    protocol.eof_received()  # 10 bytes still unsent: the close waits for them
    transport.close()
    protocol.connection_lost(ConnectionResetError())  # and finds the reset


def _write_timeout(protocol: LimitedHttpProtocol, transport: _Buffered) -> None:
    protocol.pause_writing()
    transport.unsent = 0  # (as if the kernel took it all: the abort is still no end)
    protocol._write_late()
    assert transport.aborted
    protocol.connection_lost(None)  # what uvloop tells after `abort`


def _evicted(protocol: LimitedHttpProtocol, transport: _Buffered) -> None:
    transport.unsent = 0
    assert protocol.room.make_room(set(protocol.connections))  # the connection cap
    assert transport.aborted
    protocol.connection_lost(None)


def _dropped(protocol: LimitedHttpProtocol, transport: _Buffered) -> None:
    transport.unsent = 0
    drop(protocol)  # the forced shutdown
    assert transport.aborted
    protocol.connection_lost(None)


@pytest.mark.parametrize(
    "end",
    [
        _taken_then(ConnectionResetError(), eof=False),
        _eof_with_tail_then_reset,
        _write_timeout,
        _evicted,
        _dropped,
    ],
    ids=["reset", "eof-with-tail-then-reset", "write-timeout", "evicted", "dropped"],
)
def test_a_reset_or_the_gateways_own_abort_is_no_answer_taken(end: End) -> None:
    app, _ = _answer(end)
    assert app.taken is False
    assert app.writer is not None
    assert app.writer.dropped is (end is _dropped)  # the forced shutdown's cut: 503


def test_an_answer_written_after_the_clients_eof_is_not_taken() -> None:
    """The client closed before the answer (nothing left unsent then): its write finds the
    connection closing and sends nothing."""
    app, transport = _answer(_taken_then(None, eof=False), eof_first=True)
    assert transport.writes == []
    assert app.taken is False
