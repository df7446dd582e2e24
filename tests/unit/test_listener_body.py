"""A request body reaches the app as the listener read it (gateway/listener_body.py):
one that arrives in one read is not copied on its way, one in several pieces is whole
and in order, driven with a recording transport (no socket)."""

from __future__ import annotations

import asyncio
import tracemalloc
from typing import Any

import pytest

from tests.helpers.listener_protocol import RecordingTransport, listener_protocol

SIZE = 4 * 1024 * 1024


def _head(size: int) -> bytes:
    return b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n\r\n" % size


class _Reader:
    """An app that keeps the body's pieces as `receive` hands them over and answers."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.peak = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            self.pieces.append(message["body"])
            if not message.get("more_body"):
                break
        self.peak = tracemalloc.get_traced_memory()[1]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def test_a_body_read_in_one_piece_is_not_copied_on_its_way_to_the_app() -> None:
    # uvicorn copied it into a bytearray, then into bytes: the process held it three
    # times (the read's piece, the bytearray, the copy), 12 MiB for a 4 MiB body.
    request = _head(SIZE) + b"x" * SIZE

    async def scenario() -> _Reader:
        app = _Reader()
        protocol = listener_protocol(app)
        protocol.connection_made(RecordingTransport())  # type: ignore[arg-type]
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            protocol.data_received(request)
            await asyncio.gather(*protocol.tasks)
        finally:
            tracemalloc.stop()
        return app

    app = asyncio.run(scenario())
    assert app.pieces == [b"x" * SIZE]
    assert app.peak < 1.5 * SIZE  # the read's piece, and nothing the size of it again


@pytest.mark.parametrize("cuts", [[1], [100, 70_000], [65_537, 65_538, 200_000]])
def test_a_body_in_pieces_reaches_the_app_whole_and_in_order(cuts: list[int]) -> None:
    body = bytes(range(256)) * 1024
    request = _head(len(body)) + body
    ends = [len(request) - len(body) + cut for cut in cuts]

    async def scenario() -> _Reader:
        app = _Reader()
        protocol = listener_protocol(app)
        protocol.connection_made(RecordingTransport())  # type: ignore[arg-type]
        start = 0
        for end in [*ends, len(request)]:
            protocol.data_received(request[start:end])
            start = end
            await asyncio.sleep(0)  # the app may take what came so far, or not yet
        await asyncio.gather(*protocol.tasks)
        return app

    app = asyncio.run(scenario())
    assert b"".join(app.pieces) == body
