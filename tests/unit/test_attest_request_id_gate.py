"""The statement is formatted from a template (gateway/attest/notary.py `_PAYLOAD`), which
escapes nothing: only the relay's check of `x-request-id` against a record's form
(receipt_payload.py `REQUEST_ID`, A-Za-z0-9._:- up to 128) keeps a client's text out of it.
A hostile id (a quote that would close the string and add a second "request_id" member, a
backslash, a tab, bytes past ASCII, 129 characters) is replaced by a fresh
`attest-` id; the signed bytes parse strictly (no member twice) to one statement, are its
canonical JSON, and are the entry the sidecar's log holds."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from pathlib import Path

import pytest

from gateway.attest import AttestRelay, AttestSettings
from gateway.attest.protocol import Listener
from gateway.canonical import canonical_json
from gateway.provenance import write_signing_key
from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.formats.attestation import Statement
from gateway.provenance.formats.dsse import loads_strict
from tests.helpers.fake_transport import LIMITS, WAIT_S, FakeTransport

_CHAT = b'{"model": "m", "messages": []}'
_ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
_FRESH = re.compile(r"attest-[0-9a-f]{16}\Z")

_HOSTILE = [
    b'x","request_id":"evil',
    b'x\\"',
    b"x\\u0022",
    b"a\tb",  # other control characters: the HTTP parser refuses the request (400)
    b"caf\xc3\xa9",
    b"\xff",
    b"a b",
    b"a" * 129,
    b"",
]


async def _statement_of(tmp_path: Path, request_id: bytes) -> tuple[bytes, bytes]:
    """The payload the sidecar signed for one request sent with `request_id`, and the
    request id its backend received."""
    seen: list[bytes] = []

    async def backend(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        found = re.search(rb"\r\nx-request-id: ([^\r]*)\r\n", head)
        seen.append(found[1] if found else b"")
        await reader.readexactly(len(_CHAT))
        writer.write(_ANSWER)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(backend, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    key = tmp_path / "sidecar.key"
    write_signing_key(key, "sidecar")
    log_dir = tmp_path / "log"
    settings = AttestSettings(backend=f"http://127.0.0.1:{port}", key_file=key, log_dir=log_dir)
    relay = AttestRelay(settings)
    assert await relay.open() is None
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-request-id: %s\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (request_id, len(_CHAT), _CHAT)
    )
    try:
        connection = Listener(relay, LIMITS, 4096, keepalive_s=30.0).protocol()
        transport = FakeTransport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        connection.data_received(request)
        assert connection.task is not None
        await asyncio.wait_for(asyncio.shield(connection.task), WAIT_S)
    finally:
        await relay.close()  # the log flushed and checkpointed
        server.close()
    written = bytes(transport.written)
    found = re.search(rb"\r\nx-owngate-attest: ([^\r]*)\r\n", written)
    assert found is not None, written[:300]
    envelope = json.loads(base64.b64decode(found[1]))
    payload = base64.b64decode(envelope["payload"])
    assert LogDirectory(log_dir).bundle(0, 1) == [payload]  # what the log holds
    return payload, seen[0]


@pytest.mark.parametrize("request_id", _HOSTILE, ids=repr)
def test_a_hostile_request_id_never_reaches_the_signed_statement(
    tmp_path: Path, request_id: bytes
) -> None:
    payload, relayed = asyncio.run(_statement_of(tmp_path, request_id))
    record = loads_strict(payload, "statement")  # a member twice is refused here
    assert isinstance(record, dict)
    assert canonical_json(record) == payload
    statement = Statement.from_record(record)
    assert _FRESH.match(statement.request_id), statement.request_id
    assert relayed == statement.request_id.encode()  # the backend saw the same id


@pytest.mark.parametrize("request_id", [b"chatcmpl-abc", b"A.b:c_d-9", b"z" * 128])
def test_a_request_id_in_a_records_form_is_signed_as_sent(
    tmp_path: Path, request_id: bytes
) -> None:
    payload, relayed = asyncio.run(_statement_of(tmp_path, request_id))
    record = loads_strict(payload, "statement")
    assert isinstance(record, dict)
    assert canonical_json(record) == payload
    assert Statement.from_record(record).request_id == request_id.decode() == relayed.decode()
