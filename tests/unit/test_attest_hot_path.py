"""The sidecar's per-request Python work (issue 15's CPU target): a whole answer of a
declared length is held against the budgets once per body, not again per piece as it
arrives, and the upstream client calls no default `withdrawn`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gateway.attest import AttestRelay, AttestSettings
from gateway.attest.protocol import Listener
from gateway.provenance import write_signing_key
from tests.helpers.fake_transport import LIMITS, WAIT_S, FakeTransport
from tests.helpers.python_calls import by_qualname, python_calls
from tests.helpers.raw_backend import Post, RawBackend, completion_response

_CHAT = b'{"model": "m", "messages": []}'
_POST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    b"x-request-id: chatcmpl-1\r\ncontent-length: %d\r\n\r\n%s" % (len(_CHAT), _CHAT)
)


async def _kept_alive(writer: asyncio.StreamWriter, _post: Post) -> bool:
    writer.write(completion_response("hi"))
    await writer.drain()
    return True


def _second_request_calls(tmp_path: Path) -> tuple[list[str], bytes]:
    """The Python functions this thread ran for the second request of a keep-alive
    connection (the backend's connection pooled by then, as in steady state), and what
    the client got."""
    backend = RawBackend(_kept_alive).start()
    loop = asyncio.new_event_loop()
    key = tmp_path / "sidecar.key"
    write_signing_key(key, "sidecar")
    relay = AttestRelay(AttestSettings(backend=backend.url, key_file=key, log_dir=tmp_path / "l"))
    try:
        assert loop.run_until_complete(relay.open()) is None

        async def setup() -> tuple[Any, FakeTransport]:
            connection = Listener(relay, LIMITS, 4096, keepalive_s=30.0).protocol()
            transport = FakeTransport()
            connection.connection_made(transport)  # type: ignore[arg-type]
            return connection, transport

        connection, transport = loop.run_until_complete(setup())

        def one() -> None:
            connection.data_received(_POST)
            assert connection.task is not None
            loop.run_until_complete(asyncio.wait_for(asyncio.shield(connection.task), WAIT_S))

        one()
        first = len(transport.written)
        calls = python_calls(one, by_qualname)
        return calls, bytes(transport.written[first:])
    finally:
        loop.run_until_complete(relay.close())
        loop.close()
        backend.stop()


def test_a_whole_answer_is_relayed_without_per_piece_budget_calls_or_wrappers(
    tmp_path: Path,
) -> None:
    calls, answer = _second_request_calls(tmp_path)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"\r\nx-owngate-attest: " in answer  # countersigned, as before
    # One reservation per body: the request's from its declared length (not again in
    # on_body), the answer's from its content-length (no reserve callback per piece).
    assert calls.count("Held.take") == 2, calls
    assert "AttestRelay._read.<locals>.<lambda>" not in calls
    assert "HttpPool.<lambda>" not in calls  # no default `withdrawn` asked per request


def test_a_whole_answer_of_a_type_seen_before_is_not_parsed_or_held_through_wrappers(
    tmp_path: Path,
) -> None:
    calls, answer = _second_request_calls(tmp_path)
    assert b"\r\nx-owngate-attest: " in answer  # countersigned, as before
    # The backend's content type was judged for the first answer: the rule's verdict is
    # kept, not parsed again (a split, a regular expression and a generator per answer).
    assert "relayed_kind" not in calls, calls
    # The answer's declared length is held with one `Held.take`; the wrappers that word a
    # refusal run only when it is refused.
    assert "_cover" not in calls and "hold_answer" not in calls, calls
    # No `100 Continue` was owed: the connection does not call in to find that out.
    assert "RequestReader.send_continue" not in calls, calls
