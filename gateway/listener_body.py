"""A request body's pieces as the listener hands them to the app, with no copy of the
usual one.

uvicorn's httptools protocol appends each piece of a request body (`on_body`) to the
cycle's `bytearray`, and its `receive` hands the app `bytes(body)`: two copies of every
body, 200 KB of copying for a 100 KB prompt that arrived in one read. `hold_piece` holds
the first piece since the app last took the body as it is (httptools made it a `bytes`
of its own), and `receive`'s `bytes(body)` of a `bytes` is that same object: no copy. A
second piece before the app takes them turns it into uvicorn's `bytearray`, and every
piece after that is appended as uvicorn appends it (amortized, never a copy of all that
is held per piece). Flow control is uvicorn's: reading pauses past its high-water mark.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT

__all__ = ["hold_piece"]


def hold_piece(cycle: Any, body: bytes, flow: Any) -> bool:
    """Hold `body`, the first piece of a request body since the app last took it, as it
    is; False (nothing done) for any other piece, which uvicorn's `on_body` appends."""
    held = cycle.body
    if held or cycle.response_complete:
        if type(held) is bytes:  # a second piece: appended from here on
            cycle.body = bytearray(held)
        return False
    cycle.body = body
    if len(body) > HIGH_WATER_LIMIT:
        flow.pause_reading()
    cycle.message_event.set()
    return True
