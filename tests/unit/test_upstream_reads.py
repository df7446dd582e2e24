"""The upstream connection hands a read's body to its response once per read, however
many HTTP chunks the read holds (a fast backend's stream arrives many events to a read,
each its own chunk): `_Connection.on_body` gathers, `data_received` hands on."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from gateway.upstream.connection import _Connection
from gateway.upstream.response import UpstreamResponse
from tests.helpers.python_calls import by_qualname, python_calls

_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _chunks(events: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(event), event) for event in events)


def _events(first: int, count: int) -> list[bytes]:
    return [b'data: {"i": %d}\n\n' % i for i in range(first, first + count)]


def _connection() -> tuple[_Connection, UpstreamResponse, list[bytes]]:
    conn = _Connection(cast(Any, SimpleNamespace(tls=None)))
    response = UpstreamResponse(conn, 5.0)
    conn.response = response
    pushed: list[bytes] = []
    push = response._push

    def counted(data: bytes) -> None:
        pushed.append(data)
        push(data)

    response._push = counted  # type: ignore[method-assign]
    return conn, response, pushed


def test_a_read_of_many_chunks_reaches_the_response_in_one_piece() -> None:
    conn, response, pushed = _connection()
    first, second = _events(0, 8), _events(8, 5)
    conn.data_received(_HEAD + _chunks(first))
    assert response.status == 200
    assert pushed == [b"".join(first)]
    conn.data_received(_chunks(second) + b"0\r\n\r\n")
    assert pushed == [b"".join(first), b"".join(second)]
    assert response.complete
    assert b"".join(response._chunks) == b"".join(first + second)


def test_the_body_bytes_before_broken_framing_come_before_the_error() -> None:
    conn, response, pushed = _connection()
    events = _events(0, 3)
    conn.data_received(_HEAD + _chunks(events) + b"zz\r\nnot a chunk\r\n")
    assert pushed == [b"".join(events)]
    assert list(response._chunks) == [b"".join(events)]
    assert response._error is not None and response._error.kind == "protocol"
    assert conn.closed


def test_a_read_of_many_chunks_runs_no_python_per_chunk() -> None:
    """httptools calls `on_body` once per HTTP chunk (a coalesced stream's every event):
    it is the body list's own `append`, so a read of 64 events makes no Python call per
    event (it was a Python method, ~1,000 instructions each)."""
    conn, _, pushed = _connection()
    conn.data_received(_HEAD + _chunks(_events(0, 1)))
    events = _events(1, 64)
    read = _chunks(events)
    calls = python_calls(lambda: conn.data_received(read), by_qualname)
    assert pushed[-1] == b"".join(events)
    assert len(calls) < 8, calls  # data_received, the response's push: not per event


def test_body_after_the_response_s_end_in_the_same_read_is_dropped() -> None:
    """A second response's body in the read that ended the first never joins the first
    one's body: the connection is out of step and dropped."""
    conn, response, pushed = _connection()
    events = _events(0, 2)
    extra = _HEAD + _chunks([b"data: smuggled\n\n"])
    conn.data_received(_HEAD + _chunks(events) + b"0\r\n\r\n" + extra)
    assert response.complete
    assert pushed == [b"".join(events)]
    assert b"".join(response._chunks) == b"".join(events)
    assert conn.closed
    assert conn._body == []
