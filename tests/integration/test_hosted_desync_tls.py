"""A hosted provider out of step over TLS: a response it wrote after one tenant's answer
never answers the next request on the pooled connection, also while part of it waits in
the TLS layer (gateway/upstream/hosted_sockets.py `_out_of_step`).

Hosted providers are HTTPS. The event loop's TLS transport reads the socket into its
TLS object and hands aiohttp only whole decrypted records: a record that arrived but for
its last bytes is in neither place the plain-HTTP check looked (aiohttp's parser, the
socket), and the provider's next bytes, sent after the next tenant's request, completed
it as that request's answer: through the gateway, tenant `other` was answered with the
response the provider wrote after `acme`'s. Run on uvloop (the gateway's loop) and on
asyncio's, on aiohttp with the gateway's connector, and through the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from typing import Any

import httpx
import pytest
import uvloop

from gateway.tenants import hash_api_key
from tests.helpers.gateways import (
    HOSTED_ONLY_POLICY,
    LITELLM_WARNINGS,
    OTHER_KEY,
    TENANT_KEY,
    Gateway,
    backend,
    hosted_backend,
)
from tests.helpers.raw_backend import completion_response
from tests.helpers.tls import Pki, server_context
from tests.helpers.waiting import until, until_async

pytestmark = LITELLM_WARNINGS

ACME, OTHER = "acme-secret-7f3a", "other-question-19c2"
TWO_TENANTS = [
    {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["m"]},
    {"id": "other", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["m"]},
]


def _asked(head: bytes, body: bytes) -> str:
    """A request's question: its `q` query, else its first message's content."""
    target = head.split(b" ", 2)[1]
    if b"q=" in target:
        return target.split(b"q=", 1)[1].decode()
    return str(json.loads(body)["messages"][0]["content"])


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
        self._accepted: list[socket.socket] = []
        self.asked_on: list[int] = []  # the connection (1, 2, ...) each question came on
        self.client_port = 0  # the client's end of the connection the late record went on
        self.connections = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._listener.close()

    def hang_up(self) -> None:
        """Close every connection (before a gateway stops: its TLS connections then end
        as the backend's, not while its loop closes), and wait until the client's ends
        are gone."""
        for conn in self._accepted:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        until(lambda: _established_to(self.port) == 0, "the client's connections closed")

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            self._accepted.append(conn)
            number = self.connections
            threading.Thread(target=self._connection, args=(conn, number), daemon=True).start()

    def _connection(self, conn: socket.socket, number: int) -> None:
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
            buffer = bytearray()

            def more() -> bool:
                while True:
                    try:
                        data = tls.read(65536)
                        if not data:  # the client's close_notify
                            return False
                        buffer.extend(data)
                        return True
                    except ssl.SSLWantReadError:
                        conn.sendall(outgoing.read())
                        data = conn.recv(65536)
                        if not data:
                            return False
                        incoming.write(data)

            while True:
                while b"\r\n\r\n" not in buffer:
                    if not more():
                        return
                head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
                length = 0
                for line in head.lower().split(b"\r\n")[1:]:
                    if line.startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                while len(rest) < length:
                    if not more():
                        return
                    rest = bytes(buffer).partition(b"\r\n\r\n")[2]
                buffer[:] = rest[length:]
                if not head.startswith(b"POST") and b"q=" not in head.split(b"\r\n")[0]:
                    tls.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")  # probes
                    conn.sendall(outgoing.read())
                    continue
                asked = _asked(head, rest[:length])
                self.asked_on.append(number)
                tls.write(completion_response(asked))
                conn.sendall(held + outgoing.read())
                held = b""
                if asked == ACME and self.late and not self.partial.is_set():
                    self.answered.wait(10)  # the connection idle in the client's pool
                    tls.write(completion_response(f"for {ACME}"))
                    record = outgoing.read()
                    conn.sendall(record[:-1])
                    held = record[-1:]
                    until(lambda: _send_queue(conn) == 0, "the client's kernel to have it")
                    self.client_port = conn.getpeername()[1]
                    self.partial.set()
        except (OSError, ssl.SSLError):
            return
        finally:
            conn.close()


def _send_queue(conn: socket.socket) -> int:
    """Bytes sent on `conn` its peer's kernel has not acknowledged yet (Linux)."""
    queued = fcntl.ioctl(conn.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    return int(struct.unpack("=i", queued)[0])


def _unread_at(port: int) -> int:
    """Bytes waiting unread in the loopback socket whose local port is `port`, whichever
    process holds it (/proc/net/tcp's rx_queue); -1 when there is none."""
    local = f"0100007F:{port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == local:
            return int(fields[4].split(":")[1], 16)
    return -1


def _established_to(port: int) -> int:
    """Loopback connections to `port` whose client end is still open: established, or
    hung up by the backend and not yet closed by the client (CLOSE_WAIT). Waiting for the
    first alone let a gateway stop while its loop had yet to close a connection the
    backend hung up on, a transport left unclosed (a ResourceWarning at a later test's
    teardown, seen under a loaded parallel run)."""
    remote = f"0100007F:{port:04X}"
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for line in lines if line.split()[2] == remote and line.split()[3] in ("01", "08"))


def _ask(gateway: Gateway, key: str, content: str) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": content}]},
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )


def _content(answer: dict[str, Any]) -> str:
    return str(answer["choices"][0]["message"]["content"])


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
                    contents.append(_content(await answer.json()))
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
                    contents.append(_content(await answer.json()))
            return contents

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(calls()) == [ACME, OTHER, ACME]
    assert served.connections == 1


def test_through_the_gateway_another_tenant_never_reads_acmes_late_response(
    provider: tuple[_TLSProvider, Pki],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The same, through the gateway (uvloop, LiteLLM's aiohttp transport, the provider's
    # CA given as LiteLLM reads it: SSL_CERT_FILE), two tenants.
    served, pki = provider
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.directory / "ca.pem"))
    policy = HOSTED_ONLY_POLICY.replace("tenants: [acme]", "tenants: [acme, other]")
    (tmp_path / "policy.yaml").write_text(policy)
    gateway = start_gateway(
        [hosted_backend("hosted", f"https://127.0.0.1:{served.port}/v1", "m")],
        policy={"paths": [str(tmp_path)]},
        environ={"HOSTED_KEY": "test-key"},
        tenants=TWO_TENANTS,
    )

    first = _ask(gateway, TENANT_KEY, ACME)
    assert first.status_code == 200, first.text
    assert _content(first.json()) == ACME
    served.answered.set()
    assert served.partial.wait(10)
    # The gateway's loop read it from the socket into OpenSSL (nothing left unread there).
    until(lambda: _unread_at(served.client_port) == 0, "the gateway to read the late bytes")
    second = _ask(gateway, OTHER_KEY, OTHER)
    assert ACME not in second.text
    assert second.status_code == 200, second.text
    assert _content(second.json()) == OTHER
    assert served.connections == 2


def test_a_private_tls_backend_out_of_step_never_answers_another_tenant(
    provider: tuple[_TLSProvider, Pki],
    start_gateway: Callable[..., Gateway],
) -> None:
    # The private pools read a TLS backend through the same kind of transport, and their
    # idle check (gateway/upstream/connection.py `unread`) looked at the same two places.
    served, pki = provider
    gpu = backend("gpu", f"https://127.0.0.1:{served.port}", "m")
    gpu["tls"] = {"ca_file": str(pki.directory / "ca.pem")}
    gateway = start_gateway(
        [gpu],
        limits={"max_connections_per_backend": 1, "read_timeout_s": 5.0},
        tenants=TWO_TENANTS,
    )
    first = _ask(gateway, TENANT_KEY, ACME)
    assert first.status_code == 200, first.text
    assert _content(first.json()) == ACME
    served.answered.set()
    assert served.partial.wait(10)
    until(lambda: _unread_at(served.client_port) == 0, "the gateway to read the late bytes")
    second = _ask(gateway, OTHER_KEY, OTHER)
    assert ACME not in second.text
    assert second.status_code == 200, second.text
    assert _content(second.json()) == OTHER
    served.hang_up()


def test_a_private_tls_backend_in_step_keeps_its_connection(
    provider: tuple[_TLSProvider, Pki],
    start_gateway: Callable[..., Gateway],
) -> None:
    served, pki = provider
    served.late = False
    gpu = backend("gpu", f"https://127.0.0.1:{served.port}", "m")
    gpu["tls"] = {"ca_file": str(pki.directory / "ca.pem")}
    gateway = start_gateway([gpu], limits={"max_connections_per_backend": 1}, tenants=TWO_TENANTS)
    for key, asked in ((TENANT_KEY, ACME), (OTHER_KEY, OTHER), (TENANT_KEY, ACME)):
        answer = _ask(gateway, key, asked)
        assert answer.status_code == 200, answer.text
        assert _content(answer.json()) == asked
    assert len(set(served.asked_on)) == 1, served.asked_on  # one connection, reused
    served.hang_up()
