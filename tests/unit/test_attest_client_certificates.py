"""Which client certificates `owngate attest --client-ca` admits: any certificate that
chains to that CA and may authenticate a TLS client. A backend's server certificate from
the same CA, as `owngate backend cert issue` makes it (extended key usage serverAuth
alone), is refused: another backend host cannot reach a sidecar with its own
certificate. One whose extended key usage also allows clientAuth (step-ca's default leaf
template), or that has none, is admitted: so `--client-ca` should name a CA that issues
only the gateway's client certificates, or the sidecar pin the gateway's key
(`--client-pin`, tests/integration/test_attest_client_pin.py; docs/backend-tls.md)."""

from __future__ import annotations

import asyncio
import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gateway.attest import listener_context
from gateway.pki import Issued
from tests.helpers.tls import Pki

WAIT_S = 30.0


def _leaf(pki: Pki, usages: list[x509.ObjectIdentifier] | None) -> Issued:
    """A certificate for 127.0.0.1 from `pki`'s CA with these extended key usages (None:
    no such extension, good for any purpose)."""
    key = ec.generate_private_key(ec.SECP256R1())
    ca_key = serialization.load_pem_private_key(pki.ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    now = datetime.now(UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "other-backend")]))
        .issuer_name(pki.ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    )
    if usages is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return Issued(
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


async def _answered(pki: Pki, client: Issued) -> bool:
    """Whether a sidecar listener with `--client-ca` (`pki`'s CA) answers a client that
    presents `client`."""
    cert, key = pki.write("sidecar", pki.server())
    context = listener_context(cert, key, pki.directory / "ca.pem")

    async def serve(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"answered")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    client_cert, client_key = pki.write("client", client)
    outbound = ssl.create_default_context(cafile=pki.directory / "ca.pem")
    outbound.load_cert_chain(client_cert, client_key)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=outbound)
        try:
            return await asyncio.wait_for(reader.read(), WAIT_S) == b"answered"
        except (ssl.SSLError, ConnectionError):
            return False  # TLS 1.3: the client's certificate is refused after its handshake
        finally:
            writer.close()
    finally:
        server.close()
        await server.wait_closed()


def test_the_gateways_client_certificate_is_admitted(tmp_path: Path) -> None:
    pki = Pki.create(tmp_path / "pki")
    assert asyncio.run(_answered(pki, pki.client()))


@pytest.mark.parametrize(
    ("usages", "admitted"),
    [
        ([ExtendedKeyUsageOID.SERVER_AUTH], False),  # owngate backend cert issue's
        ([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH], True),  # step-ca's
        (None, True),
    ],
    ids=["server-auth", "server-and-client-auth", "no-extended-key-usage"],
)
def test_another_certificate_of_the_ca_is_admitted_only_for_client_auth(
    tmp_path: Path, usages: list[x509.ObjectIdentifier] | None, admitted: bool
) -> None:
    pki = Pki.create(tmp_path / "pki")
    assert asyncio.run(_answered(pki, _leaf(pki, usages))) is admitted
