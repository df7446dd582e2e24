"""The raw backend helper stops cleanly whatever state its connections are in.

Its `stop` aborts connections a close left waiting on a full write buffer (a flood the
gateway held back), so no socket outlives its loop. A connection whose close waited for
its buffer and then finished is closed without being marked lost: an abort of it failed
(`'NoneType' object has no attribute 'call_soon'`), as the teardown error of whichever
test stopped the backend after such an answer.
"""

from __future__ import annotations

import asyncio
import socket

from tests.helpers.raw_backend import Post, RawBackend

FLOOD = 32 * 1024 * 1024  # far more than the socket buffers hold: the close must wait


async def _flood(writer: asyncio.StreamWriter, _post: Post) -> bool:
    head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % FLOOD
    writer.write(head + b"x" * FLOOD)  # not drained: the close is left to flush it
    return False


def test_stop_after_a_close_that_flushed_its_buffer_raises_nothing() -> None:
    backend = RawBackend(_flood).start()
    try:
        with socket.create_connection(("127.0.0.1", backend.port), timeout=30) as client:
            client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}")
            received = 0
            while chunk := client.recv(1 << 20):  # to the end: the backend's close is done
                received += len(chunk)
        assert received > FLOOD
    finally:
        backend.stop()
    assert backend.finished.is_set()


def test_stop_aborts_a_connection_whose_close_waits_on_an_unread_buffer() -> None:
    backend = RawBackend(_flood).start()
    client = socket.create_connection(("127.0.0.1", backend.port), timeout=30)
    try:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}")
        assert backend.finished.wait(30)
        backend.stop()  # the client never reads: only an abort ends the connection
        client.settimeout(30)
        while client.recv(1 << 20):
            pass  # what the kernel held, then the end (a reset is the abort too)
    except ConnectionResetError:
        pass
    finally:
        client.close()
