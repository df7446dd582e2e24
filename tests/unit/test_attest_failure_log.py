"""A fault in the sidecar's relay is logged as where it happened, never as what the
relayed request said: its exception's message (which may quote the request) was logged
as `detail`, 200 characters of it."""

from __future__ import annotations

import asyncio
import json

from gateway.attest.protocol import Connection, Listener, Request
from tests.helpers.fake_transport import LIMITS, WAIT_S, FakeTransport
from tests.helpers.log_capture import rendered_logs
from tests.helpers.waiting import until_async

CANARY = "CANARY-7f3a"


def test_a_relay_fault_is_logged_without_the_request_it_quotes() -> None:
    async def relay(_conn: Connection, request: Request) -> None:
        raise ValueError(f"cannot relay {request.body!r}")

    async def main(listener: Listener) -> bytes:
        connection = listener.protocol()
        transport = FakeTransport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        body = json.dumps({"messages": [{"role": "user", "content": CANARY}]}).encode()
        head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n"
        connection.data_received(head % len(body) + body)
        await asyncio.wait_for(
            until_async(lambda: b"internal_error" in transport.written, "the 500"), WAIT_S
        )
        return bytes(transport.written)

    with rendered_logs() as logs:
        listener = Listener(relay, LIMITS, 4096, keepalive_s=30.0)
        answer = asyncio.run(main(listener))
    assert answer.startswith(b"HTTP/1.1 500")
    assert listener.errors == 1
    assert CANARY not in logs.getvalue()
    [failed] = [json.loads(line) for line in logs.getvalue().splitlines()]
    assert failed["event"] == "relay failed" and failed["reason"] == "ValueError"
    assert "in relay" in failed["exception"]  # where, for the operator
