"""A hosted provider out of step over TLS: a response it wrote after one tenant's answer
never answers the next request on the pooled connection, also while part of it waits in
the TLS layer (gateway/upstream/hosted_sockets.py `_out_of_step`).

Hosted providers are HTTPS. The event loop's TLS transport reads the socket into its
TLS object and hands aiohttp only whole decrypted records: a record that arrived but for
its last bytes is in neither place the plain-HTTP check looked (aiohttp's parser, the
socket), and the provider's next bytes, sent after the next tenant's request, completed
it as that request's answer. Run on uvloop (the gateway's loop) and on asyncio's.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import select
import socket
import ssl
import struct
import termios
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import uvloop

from tests.helpers.gateways import LITELLM_WARNINGS
from tests.helpers.tls import Pki, server_context
from tests.helpers.waiting import until, until_async

pytestmark = LITELLM_WARNINGS

ACME, OTHER = "acme-secret-7f3a", "other-question-19c2"


def _response(content: str) -> bytes:
    body = json.dumps({"content": content}).encode()
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    return head % len(body) + body


class _TLSProvider:
    """One TLS connection served by hand (`ssl.SSLObject` over memory BIOs), so the test
    chooses where the bytes of a record stop: answers each request with its `q` query;
    once the client has ACME's answer (`answered`) it writes one more response, a whole
    TLS record but its last byte, and sends that byte with the answer to the next
    request."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self._context = context
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.answered, self.partial = threading.Event(), threading.Event()
        self.late = True
        self.connections = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._listener.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = self._context.wrap_bio(incoming, outgoing, server_side=True)
        conn.settimeout(10)
        held = b""  # the last byte of the late record, sent with the next answer
        try:
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    conn.sendall(outgoing.read())
                    incoming.write(conn.recv(65536))
            conn.sendall(outgoing.read())
            buffer = b""
            while True:
                while b"\r\n\r\n" not in buffer:
                    try:
                        data = tls.read(65536)
                        if not data:  # the client's close_notify
                            return
                        buffer += data
                    except ssl.SSLWantReadError:
                        conn.sendall(outgoing.read())
                        data = conn.recv(65536)
                        if not data:
                            return
                        incoming.write(data)
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                asked = head.split(b" ", 2)[1].split(b"q=", 1)[1].decode()
                tls.write(_response(asked))
                conn.sendall(held + outgoing.read())
                held = b""
                if asked == ACME and self.late and not self.partial.is_set():
                    self.answered.wait(10)  # the connection idle in the client's pool
                    tls.write(_response(f"for {ACME}"))
                    record = outgoing.read()
                    conn.sendall(record[:-1])
                    held = record[-1:]
                    until(lambda: _send_queue(conn) == 0, "the client's kernel to have it")
                    self.partial.set()
        except (OSError, ssl.SSLError):
            return
        finally:
            conn.close()


def _send_queue(conn: socket.socket) -> int:
    """Bytes sent on `conn` its peer's kernel has not acknowledged yet (Linux)."""
    queued = fcntl.ioctl(conn.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    return int(struct.unpack("=i", queued)[0])


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[tuple[_TLSProvider, Pki]]:
    pki = Pki.create(tmp_path / "pki")
    served = _TLSProvider(server_context(pki, pki.server("127.0.0.1")))
    yield served, pki
    served.close()


def _unread(connector: object) -> bool:
    """Whether any idle connection's socket holds bytes the event loop has not read."""
    idle = [proto for conns in connector._conns.values() for proto, _ in conns]  # type: ignore[attr-defined]
    poller = select.poll()
    for proto in idle:
        poller.register(proto.transport.get_extra_info("socket").fileno(), select.POLLIN)
    return bool(poller.poll(0))


@pytest.mark.parametrize(
    "new_loop", [uvloop.new_event_loop, asyncio.new_event_loop], ids=["uvloop", "asyncio"]
)
def test_a_response_cut_inside_a_tls_record_never_answers_the_next_request(
    provider: tuple[_TLSProvider, Pki], new_loop: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    from aiohttp import ClientSession  # loaded with LiteLLM in the gateway

    from gateway.upstream.hosted_sockets import CountedConnector

    served, pki = provider
    context = ssl.create_default_context(cadata=pki.ca.cert_pem.decode("ascii"))
    url = f"https://127.0.0.1:{served.port}/v1/chat/completions"

    async def two_calls() -> list[str]:
        contents = []
        connector = CountedConnector(ssl=context)
        async with ClientSession(connector=connector) as session:
            for asked in (ACME, OTHER):
                async with session.get(url, params={"q": asked}) as answer:
                    contents.append((await answer.json())["content"])
                if asked == ACME:
                    served.answered.set()  # the connection back in the pool
                    # The late record but its last byte read from the socket into the
                    # TLS layer (OpenSSL's record buffer, which no API tells): nothing of
                    # it left in the socket, nothing of it yet for aiohttp.
                    await until_async(
                        lambda: served.partial.is_set() and not _unread(connector),
                        "the late record's bytes read from the idle connection's socket",
                    )
        return contents

    with asyncio.Runner(loop_factory=new_loop) as runner:
        assert runner.run(two_calls()) == [ACME, OTHER]
    assert served.connections == 2  # the second call on a new connection


def test_an_idle_tls_connection_in_step_is_still_reused(
    provider: tuple[_TLSProvider, Pki],
) -> None:
    # What the check costs: nothing, for a provider that sent nothing while idle (its
    # TLS 1.3 session tickets came before its first answer).
    from aiohttp import ClientSession

    from gateway.upstream.hosted_sockets import CountedConnector

    served, pki = provider
    served.late = False
    context = ssl.create_default_context(cadata=pki.ca.cert_pem.decode("ascii"))
    url = f"https://127.0.0.1:{served.port}/v1/chat/completions"

    async def calls() -> list[str]:
        async with ClientSession(connector=CountedConnector(ssl=context)) as session:
            contents = []
            for asked in (ACME, OTHER, ACME):
                async with session.get(url, params={"q": asked}) as answer:
                    contents.append((await answer.json())["content"])
            return contents

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(calls()) == [ACME, OTHER, ACME]
    assert served.connections == 1
