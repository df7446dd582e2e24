"""The upstream client against a backend that sends bytes no body is made of: chunked
framing and trailers, bounded as the head is (`MAX_HEAD` in a row without a body byte)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gateway.upstream import connection as connection_module
from gateway.upstream.http import MAX_HEAD, HttpPool, UpstreamError
from tests.helpers.raw_backend import Post, RawBackend
from tests.helpers.scripted_upstream import (
    Handler,
    endless_head_refused,
    read_request,
    with_backend,
)

_CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
)
_WRITES = 1024  # of 64 KiB each: 64 MiB, if nobody stops it


def _endless(after_body: bytes, piece: bytes, written: list[int]) -> Handler:
    """A chunked answer: `{}`, then `after_body`, then `piece` written again and again."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(_CHUNKED_HEAD + b"2\r\n{}\r\n" + after_body)
        for _ in range(_WRITES):
            writer.write(piece)
            await writer.drain()
            written[0] += len(piece)

    return handler


@pytest.mark.parametrize(
    ("after_body", "piece"),
    [
        # the last chunk, then trailer fields that never end: each one was kept
        (b"0\r\n", b"x-t: " + b"a" * 57 + b"\r\n"),
        # the last chunk, then one trailer line that never ends (httptools gathers it whole)
        (b"0\r\nx-long: ", b"a" * 64),
    ],
    ids=["many-trailers", "endless-trailer-line"],
)
def test_trailers_past_the_head_limit_drop_the_connection(after_body: bytes, piece: bytes) -> None:
    # A read timeout (120 s by default) is no bound: bytes keep arriving, none of them body.
    written = [0]
    piece *= 1024  # 64 KiB a write

    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")
        with pytest.raises(UpstreamError) as info:
            await response.read()
        assert info.value.kind == "protocol"
        assert "without a body byte" in info.value.detail
        assert len(response.headers) < 10  # trailers are never kept
        assert pool.open_connections == 0

    handler = _endless(after_body, piece, written)
    asyncio.run(with_backend(handler, body, first_byte_timeout=600.0, read_timeout=600.0))
    assert written[0] < 16 * 1024 * 1024  # the limit, plus what socket buffers held


def test_a_chunk_size_line_that_never_ends_drops_the_connection() -> None:
    written = [0]
    handler = _endless(b"1;ext=", b"e" * 65536, written)  # a chunk extension without end

    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")
        with pytest.raises(UpstreamError) as info:
            await response.read()
        assert info.value.kind == "protocol"
        assert pool.open_connections == 0

    asyncio.run(with_backend(handler, body, first_byte_timeout=600.0, read_timeout=600.0))
    assert written[0] < 16 * 1024 * 1024


def test_framing_between_body_bytes_is_not_held_against_the_answer() -> None:
    # One-byte chunks are five bytes of framing per body byte: the limit counts the bytes
    # since the last body byte, not the framing of the whole answer.
    chunks = 4 * MAX_HEAD // 6

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(_CHUNKED_HEAD + b"1\r\nx\r\n" * chunks + b"0\r\nx-trailer: ok\r\n\r\n")
        await writer.drain()

    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")
        assert await response.read() == b"x" * chunks

    asyncio.run(with_backend(handler, body))


@pytest.mark.parametrize("answered", [1, 3])
def test_a_response_nobody_asked_for_never_answers_the_next_request(answered: int) -> None:
    # The classic response-queue desync: a backend (a bug, a retry) writes a second
    # response after the first, while the connection sits idle in the pool. If the next
    # request takes the connection before the loop has read those bytes, they would be
    # parsed as its answer: one request's (one tenant's) answer given to another. A
    # pooled connection with bytes waiting is out of step: dropped, never reused. Also
    # on a connection reused before (`answered` 3: the forged answer follows the third),
    # whose check is then the poll alone (plain HTTP: no TCP_INFO, connection.py).
    last_read, forged_written = threading.Event(), threading.Event()

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        body = b'{"answer": %d}' % post.connection
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        seen.append(post.connection)
        # The last answer on the first connection is followed by a forged one, whether or
        # not the client has read it yet (deciding on `last_read` raced with it).
        if seen.count(0) == answered and post.connection == 0 and not forged_written.is_set():
            await asyncio.to_thread(last_read.wait, 10)
            forged = b'{"answer": "FORGED"}'
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(forged), forged))
            await writer.drain()
            forged_written.set()
        return True

    seen: list[int] = []
    raw = RawBackend(answer).start()

    async def requests() -> list[bytes]:
        pool = HttpPool(
            "127.0.0.1",
            raw.port,
            connect_timeout=5.0,
            first_byte_timeout=5.0,
            read_timeout=5.0,
            max_connections=4,
        )
        try:
            answers = [await (await pool.request(b"POST", b"/", [], b"{}")).read()]
            for _ in range(answered - 1):  # on the same connection, reused
                answers.append(await (await pool.request(b"POST", b"/", [], b"{}")).read())
            last_read.set()
            # The loop is held while the forged answer arrives: it sits unread in the
            # socket, as it does when the loop is busy with other requests.
            assert forged_written.wait(10)
            answers.append(await (await pool.request(b"POST", b"/", [], b"{}")).read())
            return answers
        finally:
            await pool.close()

    try:
        answers = asyncio.run(requests())
    finally:
        raw.stop()
    # the last on a new connection
    assert answers == [b'{"answer": 0}'] * answered + [b'{"answer": 1}']


def test_a_plain_connection_is_reused_without_a_tcp_info_query(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Over plain HTTP a byte the backend sent is in the socket (the poll before reuse sees
    # it) or was read, which takes the connection out of use: `received_bytes` (TCP_INFO)
    # is for TLS, where OpenSSL may hold a record's first part. Asked per request anyway,
    # it cost two system calls and two socket objects per request on the sidecar's path.
    asked: list[object] = []

    def counted(sock: object) -> int | None:
        asked.append(sock)
        return None

    monkeypatch.setattr(connection_module, "received_bytes", counted)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(4):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
            await writer.drain()

    async def body(pool: HttpPool) -> None:
        for _ in range(4):
            assert await (await pool.request(b"POST", b"/", [], b"{}")).read() == b"{}"
        assert pool.open_connections == 1  # one connection, reused three times

    asyncio.run(with_backend(handler, body))
    assert asked == []


@pytest.mark.parametrize("status", [b"000", b"099", b"600", b"999"])
def test_a_status_that_is_no_http_status_is_a_protocol_failure(status: bytes) -> None:
    # The parser takes any three digits. 099 was handed on as a status (the gateway then
    # failed to write a status line for it: the client's connection dropped, a 500
    # logged), 000 read as "no answer yet" until the first-byte timeout.
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 %s X\r\ncontent-length: 2\r\n\r\n{}" % status)
        await writer.drain()

    async def body(pool: HttpPool) -> None:
        with pytest.raises(UpstreamError) as info:
            await pool.request(b"POST", b"/", [], b"{}")
        assert info.value.kind == "protocol"
        assert status.decode() in info.value.detail
        assert pool.open_connections == 0

    asyncio.run(with_backend(handler, body))


@pytest.mark.parametrize(
    "interim",
    [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n"],
    ids=["100", "103"],
)
def test_interim_answers_without_end_are_bounded_as_the_head_is(interim: bytes) -> None:
    # Each 1xx is a whole answer of its own, and bytes keep arriving (no first-byte or
    # read timeout fires): they count towards `MAX_HEAD` together, as the final head does.
    piece = interim * (64 * 1024 // len(interim))
    endless_head_refused(b"", piece, "response headers larger than")


def _in_chunks(event: bytes, count: int) -> Handler:
    """A chunked answer of `count` chunks of `event` each, written in 16 writes."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(_CHUNKED_HEAD)
        chunk = b"%x\r\n%s\r\n" % (len(event), event)
        for _ in range(16):
            writer.write(chunk * (count // 16))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    return handler


def test_a_body_of_one_byte_chunks_is_refused_past_the_free_chunks() -> None:
    # 1 MiB in 1-byte chunks: a million calls into Python to take it in (4 MiB of them,
    # a scrape's limit, held the event loop 0.19 s; in large chunks, 8 ms). Refused once
    # the chunks sharing a read pass one for each CHUNK_BYTES body bytes, FREE_CHUNKS on.
    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")
        with pytest.raises(UpstreamError) as info:
            await response.read()
        assert info.value.kind == "protocol"
        assert info.value.detail == "chunk framing: more than one chunk for each 8 body bytes"
        assert pool.open_connections == 0

    handler = _in_chunks(b"x", 1024 * 1024)
    asyncio.run(with_backend(handler, body, first_byte_timeout=600.0, read_timeout=600.0))


def test_small_events_of_a_stream_are_read_whole() -> None:
    # The smallest event a server streams (`data: [DONE]`), 200,000 of them, in reads of
    # many: within the bound (and the first FREE_CHUNKS of any size).
    event = b"data: [DONE]\n\n"
    count = 200_000 - 200_000 % 16

    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")
        assert await response.read() == event * count

    handler = _in_chunks(event, count)
    asyncio.run(with_backend(handler, body, first_byte_timeout=600.0, read_timeout=600.0))
