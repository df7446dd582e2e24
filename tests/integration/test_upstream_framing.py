"""The upstream client against a backend that sends bytes no body is made of: chunked
framing and trailers, bounded as the head is (`MAX_HEAD` in a row without a body byte)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.upstream.http import MAX_HEAD, HttpPool, UpstreamError
from tests.integration.test_upstream_http import Handler, _read_request, _with_backend

_CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
)
_WRITES = 1024  # of 64 KiB each: 64 MiB, if nobody stops it


def _endless(after_body: bytes, piece: bytes, written: list[int]) -> Handler:
    """A chunked answer: `{}`, then `after_body`, then `piece` written again and again."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
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
    asyncio.run(_with_backend(handler, body, first_byte_timeout=600.0, read_timeout=600.0))
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

    asyncio.run(_with_backend(handler, body, first_byte_timeout=600.0, read_timeout=600.0))
    assert written[0] < 16 * 1024 * 1024


def test_framing_between_body_bytes_is_not_held_against_the_answer() -> None:
    # One-byte chunks are five bytes of framing per body byte: the limit counts the bytes
    # since the last body byte, not the framing of the whole answer.
    chunks = 4 * MAX_HEAD // 6

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(_CHUNKED_HEAD + b"1\r\nx\r\n" * chunks + b"0\r\nx-trailer: ok\r\n\r\n")
        await writer.drain()

    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")
        assert await response.read() == b"x" * chunks

    asyncio.run(_with_backend(handler, body))
