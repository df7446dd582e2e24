"""What `tls.ca_file` trusts now that its certificates are anchors of their own
(`VERIFY_X509_PARTIAL_CHAIN`, gateway/upstream/tls.py), over real TLS (`TLSFront`): no
more than before where the file is a root with CAs below it (a bundle `ca-chain.pem`
as step-ca or a PKI's export writes it): the root's path length, name constraints and
expiry still bind the CAs it issued; and a server's certificate in the file is trusted as
itself alone, never as the issuer of another."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gateway.config.schema import BackendSettings
from gateway.pki import Issued
from gateway.upstream.http import HttpPool, UpstreamError
from gateway.upstream.tls import BackendTLS, backend_tls
from tests.helpers.cert_chains import chain_cert
from tests.helpers.gateways import backend
from tests.helpers.tls import Pki, TLSFront, patched, server_context
from tests.helpers.tls_fixtures import pki, sim, start_front  # fixtures, used by name
from tests.helpers.waiting import until_async

__all__ = ["pki", "sim", "start_front"]


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _issued(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, *chain: Any) -> Issued:
    pem = cert.public_bytes(serialization.Encoding.PEM)
    pem += b"".join(c.public_bytes(serialization.Encoding.PEM) for c, _ in chain)
    return Issued(pem, _pem(key))


def _connect(url: str, tls: BackendTLS) -> str:
    """`ok`, or `tls: <why>` refused."""

    async def run() -> str:
        pool, _ = HttpPool.for_url(
            url,
            connect_timeout=5,
            first_byte_timeout=5,
            read_timeout=5,
            max_connections=2,
            tls=tls,
        )
        try:
            connection = await pool.connect()
        except UpstreamError as exc:
            await pool.close()
            return f"{exc.kind}: {exc.detail}"
        assert connection._conn is not None and connection._conn.transport is not None
        sock = connection._conn.transport.get_extra_info("socket")
        connection.release()
        await pool.close()
        await until_async(lambda: sock.fileno() == -1, "the connection to close")
        return "ok"

    return asyncio.run(run())


def _try(
    start_front: Callable[[Any], TLSFront], pki: Pki, tmp_path: Path, ca_file: bytes, served: Issued
) -> str:
    front = start_front(server_context(pki, served))
    (tmp_path / "ca.pem").write_bytes(ca_file)
    tls = {"ca_file": str(tmp_path / "ca.pem")}
    settings = BackendSettings.model_validate(backend("gpu", front.url, "m", tls=tls))
    return _connect(front.url, backend_tls(settings, "127.0.0.1", tmp_path))


def _bundle(*certs: Any) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c, _ in certs)


def test_a_server_certificate_in_the_ca_file_vouches_for_no_other(
    start_front: Callable[[Any], TLSFront], pki: Pki, tmp_path: Path
) -> None:
    # A backend's own certificate given as `ca_file` (a pin, in effect): whoever holds
    # its key must not sign certificates the gateway accepts (its CA:FALSE binds).
    root = chain_cert("org root", None, ca=True)
    pinned = chain_cert("gpu", root, ca=False)
    forged = chain_cert("gpu forged", pinned, ca=False)
    assert _try(start_front, pki, tmp_path, _bundle(pinned), _issued(*pinned)) == "ok"
    got = _try(start_front, pki, tmp_path, _bundle(pinned), _issued(*forged, pinned))
    assert got == "tls: certificate verify failed: invalid CA certificate"


@pytest.mark.parametrize("bound", ["path-length", "name-constraints", "root-expired"])
def test_a_root_in_the_ca_file_still_binds_the_cas_below_it(
    start_front: Callable[[Any], TLSFront], pki: Pki, tmp_path: Path, bound: str
) -> None:
    # `ca_file` = the root and its issuing CA, as a chain file holds them: the issuing CA
    # must not become an anchor that escapes what the root allows it (it was not one
    # before anchors could be any certificate of the file).
    only_10 = x509.NameConstraints([x509.IPAddress(ipaddress.ip_network("10.0.0.0/8"))], None)
    root = chain_cert(
        "org root",
        None,
        ca=True,
        path_length=0 if bound == "path-length" else None,
        constraints=only_10 if bound == "name-constraints" else None,
        hours=(-48, -24) if bound == "root-expired" else (-1, 24),
    )
    issuing = chain_cert("backends CA", root, ca=True)
    below = chain_cert("team CA", issuing, ca=True) if bound == "path-length" else issuing
    leaf = chain_cert("gpu", below, ca=False)
    chain = (below, issuing) if below is not issuing else (issuing,)
    got = _try(start_front, pki, tmp_path, _bundle(root, issuing), _issued(*leaf, *chain))
    why = {
        "path-length": "path length constraint exceeded",
        "name-constraints": "permitted subtree violation",
        "root-expired": "certificate has expired",
    }[bound]
    assert got == f"tls: certificate verify failed: {why}"


def test_an_issuing_ca_alone_in_the_ca_file_is_an_anchor(
    start_front: Callable[[Any], TLSFront], pki: Pki, tmp_path: Path
) -> None:
    # What the change is for, kept: the root absent, its issuing CA anchors the chain.
    root = chain_cert("org root", None, ca=True)
    issuing = chain_cert("backends CA", root, ca=True)
    leaf = chain_cert("gpu", issuing, ca=False)
    assert _try(start_front, pki, tmp_path, _bundle(issuing), _issued(*leaf, issuing)) == "ok"


def test_a_ca_file_mixing_a_lone_issuing_ca_with_a_root_and_its_ca_is_refused(
    tmp_path: Path,
) -> None:
    # One issuing CA alone (its anchor, the flag) and another with its root: under the
    # flag the second's chain ends at it, out of its root's limits; without, the first
    # anchors nothing. Refused at load, naming both, rather than either silently.
    root = chain_cert("org root", None, ca=True, path_length=0)
    issuing = chain_cert("backends CA", root, ca=True)
    lone = chain_cert("other team CA", chain_cert("other root", None, ca=True), ca=True)
    (tmp_path / "ca.pem").write_bytes(_bundle(root, issuing, lone))
    tls = {"ca_file": "ca.pem"}
    settings = BackendSettings.model_validate(backend("gpu", "https://gpu:8443", "m", tls=tls))
    with pytest.raises(ValueError, match=r"tls\.ca_file") as refused:
        backend_tls(settings, "gpu", tmp_path)
    assert "'CN=other team CA', trusted without its issuer, and 'CN=backends CA'" in str(
        refused.value
    )
    assert "its issuer 'CN=org root'" in str(refused.value)


def test_a_ca_with_a_uri_that_is_not_text_does_not_make_its_chain_unreadable(
    start_front: Callable[[Any], TLSFront], pki: Pki, tmp_path: Path
) -> None:
    # The chain's expiry (`Peer.until`) is read from each CA certificate OpenSSL
    # verified: through `getpeercert()`-style text, a CRL distribution point of the
    # organisation's CA with a byte above 0x7f (an IA5String a CA can still write, and
    # OpenSSL accepts) raised UnicodeDecodeError, and every backend under that CA was
    # refused as "cannot be read", which before it was not.
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "org root")])
    now = datetime.now(UTC)
    crl = x509.DistributionPoint(
        [x509.UniformResourceIdentifier("http://crl.test/AA")], None, None, None
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(hours=24))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.CRLDistributionPoints([crl]), critical=False)
        .sign(key, hashes.SHA256())
    )
    signer = cast(Pki, SimpleNamespace(ca=Issued(b"", _pem(key))))
    root = patched(
        signer, Issued(cert.public_bytes(serialization.Encoding.PEM), b""), b"/AA", b"/\xff\xfe"
    )
    root_cert = root.certificate
    leaf = chain_cert("gpu", (root_cert, key), ca=False)
    assert _try(start_front, pki, tmp_path, root.cert_pem, _issued(*leaf)) == "ok"
