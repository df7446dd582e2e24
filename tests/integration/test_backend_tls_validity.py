"""What a backend's certificate vouches for, and no more (issue 15, layers 1 and 2), over
real TLS (`TLSFront`, tests/helpers/tls.py), with certificates an organisation's CA could
issue for another purpose:

- its name only where a subject alternative name states it: a certificate whose SANs are
  the `owngate:` fact URIs, with the backend's name in its subject CN alone, names no host
  (RFC 6125 6.4.4: no CN fallback once URI identifiers are present);
- `tls.ca_file` may be the CA that issues backend certificates, below the organisation's
  root, so that the root's other issuing CAs (users', other teams') attest nothing;
- a kept-alive connection is not reused past its certificate's expiry: a record written
  then would name a key, and facts marked `attested`, that no valid certificate states.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gateway.config.schema import BackendSettings
from gateway.pki import Issued, fact_uris
from gateway.upstream.http import Connection, HttpPool, UpstreamError
from gateway.upstream.tls import BackendTLS, backend_tls
from tests.helpers.gateways import backend
from tests.helpers.tls import Pki, TLSFront, server_context
from tests.helpers.tls_fixtures import pki, sim, start_front  # fixtures, used by name
from tests.helpers.waiting import until_async

__all__ = ["pki", "sim", "start_front"]

FACTS = {"region": "eu-west-1", "owner": "test", "retention": "0d"}
# what `backend()` declares, and the retention those certificates state (`0d`)
FACTS_YAML: dict[str, Any] = {"retention": {"days": 0}}


def _signed(
    issuer: Issued,
    name: str,
    *,
    ca: bool = False,
    sans: list[x509.GeneralName] | None = None,
    subject_key: ec.EllipticCurvePrivateKey | None = None,
    hours: float = 24,
    usage: x509.ObjectIdentifier = ExtendedKeyUsageOID.SERVER_AUTH,
) -> Issued:
    """A certificate for `name` (its subject CN) signed by `issuer`, valid `hours`: a CA's,
    or one with exactly `sans` (none: no SAN extension) for `usage`."""
    key = subject_key or ec.generate_private_key(ec.SECP256R1())
    issuer_key = serialization.load_pem_private_key(issuer.key_pem, password=None)
    assert isinstance(issuer_key, ec.EllipticCurvePrivateKey)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.now(UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject if not issuer.cert_pem else issuer.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(hours=hours))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    )
    if not ca:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(issuer_key, hashes.SHA256())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), key_pem)


def _root(name: str) -> Issued:
    """A self-signed organisation root without a path length: it may have issuing CAs."""
    key = ec.generate_private_key(ec.SECP256R1())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return _signed(Issued(b"", key_pem), name, ca=True, subject_key=key)


def _facts() -> list[x509.GeneralName]:
    uris = fact_uris(FACTS["region"], FACTS["owner"], FACTS["retention"])
    return [x509.UniformResourceIdentifier(uri) for uri in uris]


def _settings(
    url: str, ca_file: Path, server_name: str | None = None, **extra: Any
) -> BackendSettings:
    tls = {"ca_file": str(ca_file)} | ({} if server_name is None else {"server_name": server_name})
    return BackendSettings.model_validate(backend("gpu", url, "m", tls=tls, **extra))


def _pool(url: str, tls: BackendTLS) -> HttpPool:
    pool, _ = HttpPool.for_url(
        url, connect_timeout=5, first_byte_timeout=5, read_timeout=5, max_connections=2, tls=tls
    )
    return pool


def _socket(connection: Connection) -> Any:
    """The socket under a connection `HttpPool.connect()` handed out (still unused)."""
    assert connection._conn is not None and connection._conn.transport is not None
    return connection._conn.transport.get_extra_info("socket")


async def _closed(sockets: list[Any]) -> None:
    """Wait for the TLS shutdown of these sockets' connections (the pool closes them
    politely: close_notify both ways) to end, so none is left open as the loop stops."""
    await until_async(lambda: all(s.fileno() == -1 for s in sockets), "the connections to close")


def _connect(url: str, tls: BackendTLS) -> str:
    """The pin of the peer a new connection authenticated, or `tls: <why>` refused."""

    async def run() -> str:
        pool = _pool(url, tls)
        try:
            connection = await pool.connect()
        except UpstreamError as exc:
            await pool.close()
            return f"{exc.kind}: {exc.detail}"
        sockets = [_socket(connection)]
        connection.release()  # idle: closed with the pool
        await pool.close()
        await _closed(sockets)
        assert connection.peer is not None
        return connection.peer.spki_sha256

    return asyncio.run(run())


def _front(
    start_front: Callable[[Any], TLSFront], pki: Pki, issued: Issued, chain: bytes = b""
) -> TLSFront:
    return start_front(server_context(pki, Issued(issued.cert_pem + chain, issued.key_pem)))


@pytest.mark.parametrize("sans", ["fact-uris", "none"])
def test_a_name_only_in_the_subject_cn_names_no_backend(
    start_front: Callable[[Any], TLSFront], pki: Pki, tmp_path: Path, sans: str
) -> None:
    # From the backends' own CA: its facts as URIs and the backend's name in the CN, as a
    # CA issues a certificate for a workload or user (a SPIFFE-style URI identity) whose
    # subject happens to be, or is chosen as, the backend's host. RFC 6125: a client
    # looks for a CN-ID only where no DNS-ID, URI-ID or other SAN identity is presented;
    # OpenSSL's fallback ignores URIs, and the certificate passed as `gpu.internal`'s.
    other = _signed(pki.ca, "gpu.internal", sans=_facts() if sans == "fact-uris" else None)
    front = _front(start_front, pki, other)
    # With the facts it would attest them; without, it would still be the backend's TLS.
    identity = {"identity": "certificate", **FACTS_YAML} if sans == "fact-uris" else {}
    settings = _settings(front.url, pki.directory / "ca.pem", "gpu.internal", **identity)
    refused = _connect(front.url, backend_tls(settings, "127.0.0.1", tmp_path))
    assert refused == (
        "tls: certificate verify failed: Hostname mismatch, certificate is not valid for "
        "'gpu.internal'."
    )


def test_the_ca_file_may_be_the_issuing_ca_of_backends_alone(
    start_front: Callable[[Any], TLSFront], pki: Pki, tmp_path: Path
) -> None:
    # An organisation root with two issuing CAs: one for backends, one for users (or
    # another team). Trusting the root lets the users' CA attest a backend's region; the
    # backends' CA as `ca_file` was refused ("unable to get issuer certificate"), so the
    # root was the only choice.
    root = _root("org root")
    backends_ca, users_ca = _signed(root, "backends CA", ca=True), _signed(root, "users", ca=True)
    (tmp_path / "backends-ca.pem").write_bytes(backends_ca.cert_pem)
    ip = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
    good = _signed(backends_ca, "gpu", sans=[ip, *_facts()])
    rogue = _signed(users_ca, "gpu", sans=[ip, *_facts()])
    for presented, chain in ((good, backends_ca.cert_pem), (rogue, users_ca.cert_pem)):
        front = _front(start_front, pki, presented, chain)
        settings = _settings(
            front.url, tmp_path / "backends-ca.pem", identity="certificate", **FACTS_YAML
        )
        tls = backend_tls(settings, "127.0.0.1", tmp_path)
        got = _connect(front.url, tls)
        if presented is good:
            assert got == good.pin
        else:
            assert got == "tls: certificate verify failed: unable to get local issuer certificate"


def test_a_kept_alive_connection_is_not_reused_once_its_certificate_expired(
    start_front: Callable[[Any], TLSFront], pki: Pki, tmp_path: Path
) -> None:
    # A backend (or whoever holds a short-lived certificate's key) keeps its connection
    # alive past the certificate's end: the pool reused it, and every request's record
    # named its key, `attested: true`, with nothing valid vouching for either.
    first, renewed = pki.server(), pki.server()
    front = start_front(server_context(pki, first))
    wall = [datetime.now(UTC).timestamp()]
    settings = _settings(front.url, pki.directory / "ca.pem")
    tls = dataclasses.replace(backend_tls(settings, "127.0.0.1", tmp_path), clock=lambda: wall[0])

    async def run() -> None:
        pool = _pool(front.url, tls)
        sockets = []
        try:
            connection = await pool.connect()
            sockets.append(_socket(connection))
            assert connection.peer is not None and connection.peer.spki_sha256 == first.pin
            response = await pool.request(b"GET", b"/health", [], b"", connection=connection)
            await response.read()  # back to the pool, kept alive
            front.swap(server_context(pki, renewed), keep_open=True)
            again = await pool.connect()  # still valid: the same connection
            assert again.peer is not None and again.peer.spki_sha256 == first.pin
            again.release()
            wall[0] = first.certificate.not_valid_after_utc.timestamp()
            later = await pool.connect()
            sockets.append(_socket(later))
            assert later.peer is not None and later.peer.spki_sha256 == renewed.pin
            later.release()
        finally:
            await pool.close()
            await _closed(sockets)

    asyncio.run(run())


def test_a_certificate_for_client_authentication_alone_names_no_backend(
    start_front: Callable[[Any], TLSFront], pki: Pki, tmp_path: Path
) -> None:
    # Holds (OpenSSL checks the server purpose): a certificate the CA issued to a client,
    # with the backend's name and facts, as `owngate backend cert issue --client` or a
    # template that copies any SAN asked for could, is no server's.
    ip = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
    client = _signed(pki.ca, "gpu", sans=[ip, *_facts()], usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    front = _front(start_front, pki, client)
    settings = _settings(front.url, pki.directory / "ca.pem", identity="certificate", **FACTS_YAML)
    refused = _connect(front.url, backend_tls(settings, "127.0.0.1", tmp_path))
    assert refused == "tls: certificate verify failed: unsuitable certificate purpose"


def test_a_connection_lapses_with_the_first_certificate_of_its_chain_to_expire(
    start_front: Callable[[Any], TLSFront], pki: Pki, tmp_path: Path
) -> None:
    # An issuing CA that expires before the certificates it issued: their connections
    # lapse with it (OpenSSL would refuse the chain on a new handshake from then on).
    root = _root("org root")
    (tmp_path / "root.pem").write_bytes(root.cert_pem)
    issuing = _signed(root, "backends CA", ca=True, hours=2)
    ip = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
    leaf = _signed(issuing, "gpu", sans=[ip])
    front = _front(start_front, pki, leaf, issuing.cert_pem)
    tls = backend_tls(_settings(front.url, tmp_path / "root.pem"), "127.0.0.1", tmp_path)

    async def run() -> float:
        pool = _pool(front.url, tls)
        connection = await pool.connect()
        sockets = [_socket(connection)]
        connection.release()
        await pool.close()
        await _closed(sockets)
        assert connection.peer is not None and connection.peer.spki_sha256 == leaf.pin
        return connection.peer.until

    assert asyncio.run(run()) == issuing.certificate.not_valid_after_utc.timestamp()
    assert issuing.certificate.not_valid_after_utc < leaf.certificate.not_valid_after_utc


def test_a_leased_connection_whose_certificate_expired_meanwhile_carries_no_request(
    start_front: Callable[[Any], TLSFront], pki: Pki, tmp_path: Path
) -> None:
    # Leased for its dispatch record, then the certificate expired while the record was
    # made durable (a slow disk): the request goes on a new connection, which must show
    # the same key (as a stale leased connection's retry does), never on the lapsed one.
    first = pki.server()
    front = start_front(server_context(pki, first))
    wall = [datetime.now(UTC).timestamp()]
    settings = _settings(front.url, pki.directory / "ca.pem")
    tls = dataclasses.replace(backend_tls(settings, "127.0.0.1", tmp_path), clock=lambda: wall[0])

    async def run() -> None:
        pool = _pool(front.url, tls)
        sockets = []
        try:
            connection = await pool.connect()
            sockets.append(_socket(connection))
            response = await pool.request(b"GET", b"/health", [], b"", connection=connection)
            await response.read()
            leased = await pool.connect()  # the same connection, kept alive
            wall[0] = first.certificate.not_valid_after_utc.timestamp()
            response = await pool.request(b"GET", b"/health", [], b"", connection=leased)
            assert response._conn.transport is not None
            sockets.append(response._conn.transport.get_extra_info("socket"))  # the new one
            assert response.status == 200
            await response.read()
        finally:
            await pool.close()
            await _closed(sockets)

    asyncio.run(run())
    assert [bytes(c.sent).count(b"GET /health ") for c in front.carried] == [1, 1]


def test_a_new_leased_connection_whose_certificate_expired_meanwhile_carries_no_request(
    start_front: Callable[[Any], TLSFront], pki: Pki, tmp_path: Path
) -> None:
    # As above, with the connection made for this request rather than kept alive: it
    # waited as long for the dispatch record, and was written on past its certificate's
    # end. The reconnect finds a renewed certificate (another key): the request is not
    # sent under the record's key, as for a stale leased connection.
    first, renewed = pki.server(), pki.server()
    front = start_front(server_context(pki, first))
    wall = [datetime.now(UTC).timestamp()]
    settings = _settings(front.url, pki.directory / "ca.pem")
    tls = dataclasses.replace(backend_tls(settings, "127.0.0.1", tmp_path), clock=lambda: wall[0])

    async def run() -> str:
        pool = _pool(front.url, tls)
        sockets = []
        try:
            leased = await pool.connect()  # a new connection, for the record
            sockets.append(_socket(leased))
            front.swap(server_context(pki, renewed), keep_open=True)
            wall[0] = first.certificate.not_valid_after_utc.timestamp()
            try:
                response = await pool.request(b"GET", b"/health", [], b"", connection=leased)
            except UpstreamError as exc:
                return f"{exc.kind}: {exc.detail}"
            await response.read()
            return f"sent on {'the leased' if sockets[0].fileno() != -1 else 'another'} one"
        finally:
            await pool.close()
            await _closed(sockets)

    got = asyncio.run(run())
    assert got == "closed: the backend presented another certificate on reconnecting"
