"""A small certificate authority for backends: what `owngate backend cert` issues.

For tests and small deployments; an organisation with a PKI issues the same certificates
with cert-manager or step-ca (docs/backend-tls.md). A server certificate names its host
(DNS or IP SAN) and, as URI SANs, the facts a backend with `identity: certificate` must
match (`owngate:region:...`, `owngate:owner:...`, `owngate:retention:...`; the grammar is
in gateway/upstream/tls.py); a client certificate is the gateway's, for mutual TLS.
Keys are ECDSA P-256. Time is passed in, so tests make expired certificates without
waiting.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gateway.upstream.tls import FACT_PREFIX, facts_from_uris, spki_sha256

__all__ = ["Issued", "chain_above", "fact_uris", "issue", "load_issued", "make_ca"]


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate and its private key, as PEM."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    @property
    def pin(self) -> str:
        """The `tls.pin_spki_sha256` entry that pins this certificate's key."""
        return spki_sha256(self.certificate.public_bytes(serialization.Encoding.DER))


def fact_uris(region: str | None, owner: str | None, retention: str | None) -> list[str]:
    """The URI SANs stating these facts (ValueError if one breaks the grammar)."""
    given = (("region", region), ("owner", owner), ("retention", retention))
    uris = [f"{FACT_PREFIX}{fact}:{value}" for fact, value in given if value is not None]
    facts_from_uris(uris)  # the reader's grammar is the writer's
    return uris


def make_ca(name: str, *, now: datetime, days: float = 3650) -> Issued:
    """A self-signed CA certificate (path length 0: it issues only end certificates)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        _base(subject, subject, key.public_key(), now, days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return _issued(cert, key)


def issue(
    ca: Issued,
    name: str,
    *,
    now: datetime,
    days: float = 90,
    client: bool = False,
    uris: list[str] | None = None,
    not_before: datetime | None = None,
) -> Issued:
    """An end certificate for `name` signed by `ca`: a server's (a DNS or IP SAN for
    `name`, plus `uris`), or with `client` the gateway's for mutual TLS."""
    key = ec.generate_private_key(ec.SECP256R1())
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ValueError(f"a {type(ca_key).__name__} CA key: owngate signs with ECDSA or RSA keys")
    ca_cert = ca.certificate
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in uris or []]
    if not client:
        try:
            sans.insert(0, x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.insert(0, x509.DNSName(name))
    builder = (
        _base(subject, ca_cert.subject, key.public_key(), not_before or now, days)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return _issued(builder.sign(ca_key, hashes.SHA256()), key)


def chain_above(ca_file: bytes) -> bytes:
    """What a certificate issued by the CA of `ca_file` (PEM: the CA first, optionally the
    rest of its chain) must carry after it for a verifier that holds only the root: the
    file's certificates that are not self-issued roots, as PEM (none for a root CA). A
    server sends its certificate file as its chain, so a leaf of an issuing CA written
    alone chained to nothing a client holding the root (the gateway's `ca_file`) trusts."""
    return b"".join(
        cert.public_bytes(serialization.Encoding.PEM)
        for cert in x509.load_pem_x509_certificates(ca_file)
        if cert.subject != cert.issuer
    )


def load_issued(cert_pem: bytes, key_pem: bytes) -> Issued:
    """A CA read from its files (ValueError if they do not parse, do not match, are not a
    CA's, or its key is neither ECDSA nor RSA)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    key = serialization.load_pem_private_key(key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ValueError(f"a {type(key).__name__} CA key: owngate signs with ECDSA or RSA keys")
    if cert.public_key() != key.public_key():
        raise ValueError("the key does not belong to the certificate")
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise ValueError("the certificate is not a CA's (basicConstraints CA:TRUE)")
    return Issued(cert_pem, key_pem)


def _base(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    start: datetime,
    days: float,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - timedelta(minutes=5))  # small clock skew
        .not_valid_after(start + timedelta(days=days))
    )


def _issued(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Issued:
    return Issued(
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
