"""A scripted HTTP/1.1 backend on a real socket, for what uvicorn never sends.

Bodies that end with the connection (no length, not chunked), bytes after a complete
response, endless or dripping bodies: the simulator runs on uvicorn, which frames every
response correctly, so these faults need a server that writes raw bytes. `RawBackend`
answers `GET /health` and `GET /metrics` itself (the gateway probes them) and hands each
POST to the test's `answer(writer, post)` coroutine, which writes what it likes and
returns whether the connection should stay open for another request. It runs its own
event loop in a background thread; `finished` is set each time an answer returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tests.helpers.accepted import Accepted, close_server

__all__ = [
    "Answer",
    "Post",
    "RawBackend",
    "completion_body",
    "completion_response",
    "held_503",
    "json_answer",
    "sse_head",
]


@dataclass(frozen=True)
class Post:
    connection: int  # the connection it came on, numbered from 0 in order of arrival
    body: bytes
    head: bytes = b""  # the request line and header lines, as they came

    def header_values(self, name: bytes) -> list[bytes]:
        """The values of every header line named `name` (any case), in order."""
        values = []
        for line in self.head.split(b"\r\n")[1:]:
            key, colon, value = line.partition(b":")
            if colon and key.strip().lower() == name.lower():
                values.append(value.strip())
        return values


Answer = Callable[[asyncio.StreamWriter, Post], Awaitable[bool]]


def sse_head(framing: bytes = b"connection: close\r\n") -> bytes:
    """Response headers of an SSE stream; `framing` as given (none: the close ends it)."""
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n" + framing + b"\r\n"


# An OpenAI error body, for a `json_answer` of an error status.
ERROR_BODY = b'{"error": {"message": "no", "type": "x", "param": null, "code": null}}'


def completion_body(content: str) -> bytes:
    """A whole chat completion whose one choice says `content`, one token each way."""
    message = {"role": "assistant", "content": content}
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    ).encode()


def completion_response(content: str) -> bytes:
    """`completion_body(content)` as a whole HTTP/1.1 200 response with its content-length."""
    body = completion_body(content)
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    return head % len(body) + body


def json_answer(
    body: bytes, status: bytes = b"200 OK", release: threading.Event | None = None
) -> Answer:
    """An answer that writes `body` whole as a `status` `application/json` response, with
    its content-length, and then closes the connection; with `release`, only once it is
    set (60 s at most)."""

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        if release is not None:
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
        head = b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        writer.write(head % (status, len(body)) + body)
        await writer.drain()
        return False

    return answer


def held_503(release: threading.Event) -> Answer:
    """A raw backend's answer: wait for `release` (30 s at most), then 503, so that the
    request fails over to its next attempt."""

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 30)
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        return False

    return answer


def _closed(writer: asyncio.StreamWriter) -> bool:
    """Whether the connection's socket is closed already. A close that waited for its write
    buffer ends without marking the transport lost, and an abort of it then fails (its loop
    is gone), so an abort is only for a socket still open."""
    sock = writer.get_extra_info("socket")
    return sock is None or sock.fileno() == -1


class RawBackend:
    def __init__(self, answer: Answer) -> None:
        self._answer = answer
        self.posts: list[Post] = []
        self.finished = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._connections = 0
        self._ended = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._accepted = Accepted(self._serve)  # every connection, from its hand-over on
        self.port = 0

    @property
    def connections(self) -> int:
        """Connections accepted so far (GETs included, which `posts` does not list)."""
        return self._connections

    @property
    def ended(self) -> int:
        """Connections closed so far, by either side."""
        return self._ended

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RawBackend:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accepted, "127.0.0.1", 0), self._loop
        )
        self._server = started.result(timeout=10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def close() -> None:
            assert self._server is not None
            await close_server(self._server)  # no accepted connection lost in the close
            # A close waits for the write buffer to drain: one the gateway stopped reading
            # (a flood held back) never would, and the socket would outlive the loop.
            for writer in self._writers:
                if not _closed(writer):
                    writer.transport.abort()
            # Every handler ends now (cancelled by `close_all`, which the handler's task then
            # does not end by: a task ending cancelled makes asyncio's stream server log
            # "Exception in callback ... connection_made" as an error), and connections
            # whose handler had not started are aborted; the aborts close their sockets on
            # the next loop turn.
            await self._accepted.close_all()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        connection = self._connections
        self._connections += 1
        # A small send buffer: what the backend managed to write is close to what the
        # gateway read (the tests bound it).
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                if head.startswith(b"GET "):
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                post = Post(connection, body, head)
                self.posts.append(post)
                try:
                    keep = await self._answer(writer, post)
                finally:
                    self.finished.set()
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the gateway dropped the connection: what some tests want
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            self._writers.discard(writer)
            self._ended += 1
