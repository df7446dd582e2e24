"""What the listener holds of a request body that was answered before it was read.

uvicorn buffers a body as it arrives, up to one read past 64 KiB, for the app to take;
an app that answers first (the gateway's 401 for a missing key, 404, 413, a 429 from the
body budget) never takes it, and uvicorn kept it until the connection's next request or
its end: the body deadline away (60 s by default) for a client that declares a long body
and sends part of it. Such a client needs no key; with thousands of connections that was
hundreds of MB (measured: 2,000 connections each sending 320 KiB of a declared 8 MB
body to `owngate serve` grew it by 264 MB for the body deadline). The listener drops it
with the answer.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from typing import Any

from tests.helpers.protocol_wire import connect_protocol, finish

_BODY = 1 << 20  # what one read of the body brings (uvicorn's buffer takes a whole read)


async def _refuse_unread(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An early answer: the body is never read."""
    headers = [(b"content-length", b"0")]
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


def test_a_body_answered_before_it_was_read_is_not_held() -> None:
    async def held_after_answer() -> tuple[int, bytes, bool]:
        protocol, wire, tasks = connect_protocol(_refuse_unread)
        head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-length: 8000000\r\n\r\n"
        request = head + b"[" * _BODY
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            protocol.data_received(request)
            await finish(tasks)
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        open_ = not wire.closed  # the rest of the body is still awaited (and dropped)
        wire.close()
        return held, bytes(wire.out), open_

    held, answer, still_open = asyncio.run(held_after_answer())
    assert answer.startswith(b"HTTP/1.1 401 ")
    assert still_open
    assert held < _BODY // 4, f"{held} bytes held after the answer"
