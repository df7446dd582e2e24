"""Certificates of any chain shape for tests: roots, CAs below them (with a path length or
name constraints), and end certificates for a TLS server (127.0.0.1) or client, each
valid for the hours a test names. `gateway.pki` makes only what `owngate backend cert`
makes (a root of path length 0 and its end certificates); the anchor tests need more."""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["LOOPBACK", "Signer", "chain_cert"]

LOOPBACK = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
Signer = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


def chain_cert(
    name: str,
    issuer: Signer | None,
    *,
    ca: bool,
    client: bool = False,
    path_length: int | None = None,
    constraints: x509.NameConstraints | None = None,
    hours: tuple[float, float] = (-1, 24),
    issuer_name: x509.Name | None = None,
) -> Signer:
    """A certificate for `name` and its key, signed by `issuer` (None: self-signed), valid
    from and until `hours` from now: a CA's (with `path_length`, `constraints`), else an
    end certificate for TLS clients (`client`) or for the server 127.0.0.1. `issuer_name`:
    its issuer field spelled so (default: the issuer's subject as it is)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    signer_cert, signer_key = issuer if issuer is not None else (None, key)
    now = datetime.now(UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name or (subject if signer_cert is None else signer_cert.subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + timedelta(hours=hours[0]))
        .not_valid_after(now + timedelta(hours=hours[1]))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=path_length), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    )
    if signer_cert is not None:
        aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(signer_key.public_key())
        builder = builder.add_extension(aki, critical=False)
    if ca:
        usage = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
        builder = builder.add_extension(usage, critical=True)
    elif client:
        eku = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH])
        builder = builder.add_extension(eku, critical=False)
    else:
        eku = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH])
        builder = builder.add_extension(eku, critical=False)
        builder = builder.add_extension(x509.SubjectAlternativeName([LOOPBACK]), False)
    if constraints is not None:
        builder = builder.add_extension(constraints, critical=True)
    return builder.sign(signer_key, hashes.SHA256()), key
