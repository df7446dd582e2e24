"""A client that leaves while the gateway charges its tenant (the charge held at one await).

`Gate(monkeypatch, owner, name, when=..., after=...)` replaces the async method
`owner.name` with one that, on each call `when` accepts, sets `entered` and waits for
`released` (before the method runs, or with `after=True` once it ran, before its result
is returned); `arm()` makes fresh events for the next request. `lost_seen` tells when the
gateway's listener saw a client's connection go. `leave_during_charge` sends a request
on a raw socket, reads what the client reads before the charge (a stream's events up to
its `[DONE]`), closes the socket while the charge is held, waits until the listener saw
that, and lets the charge go on. Every wait is on an event or a condition, bounded.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest

from gateway.body_writer import BodyWriter
from tests.helpers.gateways import Gateway
from tests.helpers.waiting import until, until_async

__all__ = ["Gate", "leave_during_charge", "lost_seen", "request_bytes"]


class Gate:
    """`owner.name` (an async method) held on each call `when` accepts, until released."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        owner: type,
        name: str,
        *,
        when: Callable[..., bool] = lambda *_args: True,
        after: bool = False,
    ) -> None:
        self.entered, self.released = threading.Event(), threading.Event()
        self.calls = 0  # calls held
        method = getattr(owner, name)

        async def held(this: Any, *args: Any, **kwargs: Any) -> Any:
            if not when(this, *args):
                return await method(this, *args, **kwargs)
            result = await method(this, *args, **kwargs) if after else None
            self.calls += 1
            entered, released = self.entered, self.released
            entered.set()
            await until_async(released.is_set, "the test lets the charge go", timeout=60)
            return result if after else await method(this, *args, **kwargs)

        monkeypatch.setattr(owner, name, held)

    def arm(self) -> None:
        """Fresh events for the next request (the last one's stay set for its call)."""
        self.released.set()
        self.entered, self.released = threading.Event(), threading.Event()


def lost_seen(monkeypatch: pytest.MonkeyPatch) -> Callable[[], threading.Event]:
    """What tells the latest loss the gateway's listener saw (`BodyWriter.lost`, called
    from `connection_lost`): call it for the event of the connections since."""
    box = [threading.Event()]
    lost = BodyWriter.lost

    def noticed(writer: BodyWriter) -> None:
        lost(writer)
        box[0].set()

    monkeypatch.setattr(BodyWriter, "lost", noticed)

    def fresh() -> threading.Event:
        box[0] = threading.Event()
        return box[0]

    return fresh


def request_bytes(gateway: Gateway, ask: dict[str, Any]) -> bytes:
    body = json.dumps(ask).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer %s\r\ncontent-length: %d\r\n\r\n"
        % (gateway.key.encode(), len(body))
    )
    return head + body


def leave_during_charge(
    gateway: Gateway,
    ask: dict[str, Any],
    gate: Gate,
    seen: Callable[[], threading.Event],
) -> bytes:
    """Send `ask`; once the charge is held (a stream read up to its `[DONE]` first, or a
    refusal read whole), close the connection, wait until the listener saw it go, let the
    charge go on and wait until the request ended. Returns what the client read."""
    gate.arm()
    lost = seen()
    got = b""
    stream = bool(ask.get("stream"))
    try:
        with socket.create_connection((gateway.server.host, gateway.server.port), 10) as client:
            client.sendall(request_bytes(gateway, ask))
            while stream and b"data: [DONE]" not in got:
                chunk = client.recv(65536)  # bounded by the socket's timeout
                assert chunk, got
                got += chunk
                if got.startswith(b"HTTP/1.1 429") and got.endswith(b"}"):
                    return got  # refused at admission: no charge to hold
            assert gate.entered.wait(30), ("the charge was not reached", got)
        assert lost.wait(30), "the gateway did not see the client go"
    finally:
        gate.released.set()
        until(lambda: not gateway.app.serving, "the request ended", timeout=30)
    return got
