"""Real TLS for tests: certificates made with `gateway.pki` (the code behind `owngate backend
cert`), and `TLSFront`, a TLS-terminating TCP relay on loopback in front of a plain-HTTP
server (a simulator, llama-server).

The front takes each connection in plain TCP and starts TLS on it with whatever
`TLSFront.context` is at that moment, so a test swaps the server's certificate mid-run by
assigning a new context: connections made after that present the new certificate.
`TLSFront.carried` is the front's own account of each connection it relayed (the context
it presented, the bytes the client sent on it), the ground truth a test holds the
gateway's dispatch records to; `hold` and `release` stop and restart the answers of one
connection, so a test can keep it busy while the gateway opens another.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gateway.pki import Issued, fact_uris, issue, make_ca
from tests.helpers.accepted import Accepted, close_server

__all__ = ["Carried", "Pki", "TLSFront", "patched", "server_context"]

_BUFFER = 64 * 1024
_CARRIED_BYTES = 256 * 1024  # per connection: what a test reads back from `Carried.sent`


@dataclass
class Carried:
    """One connection the front relayed: the context whose certificate it presented, the
    first bytes the client sent on it (request heads carry `x-request-id`), and the gate
    its answers wait on (`TLSFront.hold`)."""

    context: ssl.SSLContext
    sent: bytearray
    gate: asyncio.Event

    def request_ids(self) -> list[str]:
        """The `x-request-id` of every request sent on this connection, in order."""
        sent = bytes(self.sent)
        name = b"\r\nx-request-id: "
        found, at = [], sent.lower().find(name)
        while at >= 0:
            value = sent[at + len(name) :].split(b"\r\n", 1)[0]
            found.append(value.decode("ascii"))
            at = sent.lower().find(name, at + 1)
        return found


@dataclass(frozen=True)
class Pki:
    """A test CA and where its files are written (`write`)."""

    ca: Issued
    directory: Path

    @classmethod
    def create(cls, directory: Path, name: str = "test CA") -> Pki:
        directory.mkdir(parents=True, exist_ok=True)
        pki = cls(make_ca(name, now=datetime.now(UTC), days=1), directory)
        pki.write("ca", pki.ca)
        return pki

    def server(
        self,
        name: str = "127.0.0.1",
        *,
        region: str | None = None,
        owner: str | None = None,
        retention: str | None = None,
        expired: bool = False,
    ) -> Issued:
        """A server certificate valid for a day (or one that expired days ago)."""
        now = datetime.now(UTC)
        start = now - timedelta(days=3) if expired else now
        uris = fact_uris(region, owner, retention)
        return issue(self.ca, name, now=now, not_before=start, days=1, uris=uris)

    def client(self, name: str = "gateway") -> Issued:
        return issue(self.ca, name, now=datetime.now(UTC), days=1, client=True)

    def write(self, stem: str, issued: Issued) -> tuple[Path, Path]:
        cert, key = self.directory / f"{stem}.pem", self.directory / f"{stem}-key.pem"
        cert.write_bytes(issued.cert_pem)
        key.write_bytes(issued.key_pem)
        return cert, key


def patched(pki: Pki, issued: Issued, old: bytes, new: bytes) -> Issued:
    """`issued` with the bytes `old` of its to-be-signed part replaced by `new` (as long),
    signed again by `pki`'s CA: a certificate `cryptography`'s builder refuses to write
    (a URI SAN that is not ASCII, say) that a CA can still issue and OpenSSL accept."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    assert len(old) == len(new)
    certificate = issued.certificate
    tbs = certificate.tbs_certificate_bytes
    assert tbs.count(old) == 1
    tbs = tbs.replace(old, new)
    ca_key = serialization.load_pem_private_key(pki.ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    signature = ca_key.sign(tbs, ec.ECDSA(hashes.SHA256()))
    der = certificate.public_bytes(serialization.Encoding.DER)
    # Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm, signatureValue }
    body = der[_header_length(der) :]
    original_tbs = certificate.tbs_certificate_bytes
    assert body.startswith(original_tbs)
    rest = body[len(original_tbs) :]
    algorithm = rest[: _header_length(rest) + rest[1]]  # a short AlgorithmIdentifier
    value = _der(0x03, b"\x00" + signature)
    cert_der = _der(0x30, tbs + algorithm + value)
    pem = x509.load_der_x509_certificate(cert_der).public_bytes(serialization.Encoding.PEM)
    return Issued(pem, issued.key_pem)


def _header_length(der: bytes) -> int:
    """The length of a DER element's tag and length octets."""
    return 2 if der[1] < 0x80 else 2 + (der[1] & 0x7F)


def _der(tag: int, content: bytes) -> bytes:
    size = len(content)
    if size < 0x80:
        return bytes([tag, size]) + content
    octets = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(octets)]) + octets + content


def server_context(pki: Pki, issued: Issued, *, client_ca: Pki | None = None) -> ssl.SSLContext:
    """A server context presenting `issued`; with `client_ca`, client certificates
    signed by it are required (mutual TLS)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    stem = f"front-{issued.certificate.serial_number:x}"
    cert, key = pki.write(stem, issued)
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=client_ca.ca.cert_pem.decode("ascii"))
    return context


class TLSFront:
    """A TLS-terminating relay on 127.0.0.1 to `target` (host, port), on its own event loop
    in a daemon thread. `handshakes` counts completed TLS handshakes; `failed` those that
    were refused."""

    def __init__(self, target: tuple[str, int], context: ssl.SSLContext) -> None:
        self.target = target
        self.context = context
        self.handshakes = 0
        self.failed = 0
        self._open: set[asyncio.StreamWriter] = set()
        self.carried: list[Carried] = []  # every connection relayed, in accept order
        self._accepted = Accepted(self._relay)  # every connection, from its hand-over on
        # Bumped by `swap`: a connection accepted before it is dropped even if it was still
        # being set up (handshake, upstream connect) when `swap` ran, since the client may
        # count it open from its own end of the handshake.
        self._generation = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tls-front", daemon=True)
        self.port = 0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> TLSFront:
        self._thread.start()
        if not self._ready.wait(10):
            raise TimeoutError("the TLS front did not start")
        return self

    def swap(self, context: ssl.SSLContext, *, keep_open: bool = False) -> None:
        """Present another certificate from now on: connections open now are dropped, so
        the next request of a client that pools connections opens a new one; with
        `keep_open` they stay open (and keep the certificate of their handshake), as a
        server whose certificate is replaced keeps its kept-alive connections."""
        self.context = context
        if keep_open:
            return

        async def drop() -> None:
            self._generation += 1
            for writer in list(self._open):
                writer.transport.abort()

        asyncio.run_coroutine_threadsafe(drop(), self._loop).result(10)

    def hold(self, index: int) -> None:
        """Answers on connection `index` of `carried` wait until `release`."""
        self._loop.call_soon_threadsafe(self.carried[index].gate.clear)

    def release(self, index: int) -> None:
        self._loop.call_soon_threadsafe(self.carried[index].gate.set)

    def stop(self) -> None:
        async def close() -> None:
            for writer in list(self._open):
                writer.transport.abort()
            if self._server is not None:
                await close_server(self._server)  # no accepted connection lost in the close

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def serve() -> None:
            self._server = await asyncio.start_server(self._accepted, "127.0.0.1", 0)
            self.port = self._server.sockets[0].getsockname()[1]
            self._ready.set()

        self._loop.run_until_complete(serve())
        self._loop.run_forever()
        # What is left ends now: relays of dropped connections, and connections whose relay
        # had not started (tests/helpers/accepted.py); the aborts close their sockets in a
        # callback, run in a last loop turn, so no socket is left for the garbage collector
        # to find open during a later test.
        self._loop.run_until_complete(self._accepted.close_all())

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve(reader, writer)
        except Exception:  # noqa: BLE001 - never leave a connection's socket open
            writer.transport.abort()
        except asyncio.CancelledError:
            # The front stopped with this relay running (its backend side still open). The
            # task must not end cancelled: Python 3.11's stream server asks a finished
            # task for its exception in a done callback, which raises for a cancelled one
            # (asyncio logged "Exception in callback StreamReaderProtocol.connection_made").
            writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        generation = self._generation
        context = self.context
        try:
            async with asyncio.timeout(10):
                await writer.start_tls(context)
        except Exception:  # noqa: BLE001 - any handshake failure (the client may abort
            # in any state of it) is a refused connection; one escaping this task would
            # leave its socket open for the garbage collector to find in a later test
            self.failed += 1
            writer.transport.abort()  # what the TLS layer left of the connection
            return
        self.handshakes += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        if generation != self._generation:  # swapped while it was being set up: dropped
            up_writer.transport.abort()
            writer.transport.abort()
            return
        self._open.add(writer)
        carried = Carried(context, bytearray(), asyncio.Event())
        carried.gate.set()
        self.carried.append(carried)
        try:
            await asyncio.gather(
                _pump(reader, up_writer, carried.sent), _pump(up_reader, writer, gate=carried.gate)
            )
        finally:
            self._open.discard(writer)
            up_writer.transport.abort()
            writer.transport.abort()


async def _pump(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    seen: bytearray | None = None,
    gate: asyncio.Event | None = None,
) -> None:
    """Copy `reader` to `writer`; keep the first bytes in `seen`, and wait on `gate`
    before each write."""
    try:
        while data := await reader.read(_BUFFER):
            if seen is not None:
                seen += data[: max(0, _CARRIED_BYTES - len(seen))]
            if gate is not None:
                await gate.wait()
            writer.write(data)
            await writer.drain()
    except (OSError, ssl.SSLError):
        pass  # one side went away: the relay of this connection is over
    finally:
        with contextlib.suppress(OSError, ssl.SSLError):
            writer.close()
