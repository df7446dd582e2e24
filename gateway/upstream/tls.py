"""TLS to a private backend: its client context, its key pins and the facts its certificate
attests.

A backend with `tls:` in gateway.yaml gets its own `ssl.SSLContext` (its CA file as the
only roots, the gateway's client certificate for mutual TLS, TLS 1.2 or later without
renegotiation (`gateway/tls_options.py`), the hostname checked against `server_name`).
After every handshake, and before a request byte is written, `BackendTLS.check` reads the
certificate the backend presented on that connection: the SHA-256 of its
SubjectPublicKeyInfo must be one of the pins (if any), and with `identity: certificate`
the facts in its URI SANs must equal what gateway.yaml declares (refused renegotiation
keeps that certificate the connection's). What it returns (`Peer`) is what the dispatch
record names, and until when it holds: a kept-alive connection is not reused past the
expiry of its certificate or of a CA certificate its chain was verified through
(`Peer.until`; the pool asks `BackendTLS.clock`), or a record written then would name a
key, and `attested: true` facts, that no valid certificate vouched for any more.

Pins are written `sha256//` + the standard base64 of the digest (with padding), as
`curl --pinnedpubkey` takes them. Certificate facts are URI SANs (docs/backend-tls.md):

    owngate:region:<name>          e.g. owngate:region:eu-west-1
    owngate:owner:<name>           e.g. owngate:owner:acme
    owngate:retention:<terms>      none | <days>d[+zdr], then optionally +training:
                                   none, 30d, 30d+zdr, 30d+training, 30d+zdr+training

`<name>` is 1-63 of `A-Z a-z 0-9 . _ -`; each fact appears at most once, and the scheme
only lowercase (any other case is the same scheme to other readers: ambiguous). `none` is zero
days with the zero-data-retention declaration; `0d` is zero days without it; `+zdr` states
that declaration for days kept (`30d+zdr`). Retention must equal the declaration exactly, so a
zero-data-retention flag the certificate does not state excludes the backend: the record's
`attested: true` covers every retention term it carries.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from gateway.config.backends import FACT_NAME
from gateway.config.schema import BackendSettings
from gateway.tls_files import load_ca_bundle, load_cert_chain, read_tls_file
from gateway.tls_options import harden, os_roots_context
from gateway.upstream.tls_anchors import partial_chain

__all__ = [
    "BackendTLS",
    "CertificateFacts",
    "Peer",
    "TLSRejectedError",
    "backend_tls",
    "facts_from_uris",
    "retention_terms",
    "spki_sha256",
    "system_tls",
]

FACT_PREFIX = "owngate:"
# `0d+zdr` is not a spelling: zero days with zero data retention is `none`, one per claim
_TERMS = re.compile(r"(none|0d|[1-9][0-9]{0,5}d(\+zdr)?)(\+training)?\Z")
_FACTS = ("region", "owner", "retention")
# A URI quoted in an error (the breaker's reason, /admin/status, the log): cut to this
_SHOWN = 80


class TLSRejectedError(Exception):
    """The backend's certificate is not the one this backend may present."""


@dataclass(frozen=True, slots=True)
class Peer:
    """The authenticated identity of one connection: what the dispatch record names."""

    spki_sha256: str  # sha256//base64 of the leaf certificate's SubjectPublicKeyInfo
    attested: bool  # region, owner and retention were read from the certificate and matched
    # POSIX time at which the certificate, or a CA certificate of its verified chain,
    # expires: the connection is not reused from then on (`HttpPool._acquire`)
    until: float = field(default=math.inf, compare=False)


@dataclass(frozen=True, slots=True)
class CertificateFacts:
    region: str | None = None
    owner: str | None = None
    retention: str | None = None


def spki_sha256(der_certificate: bytes) -> str:
    """The pin of a DER certificate: `sha256//` + base64(SHA-256(SubjectPublicKeyInfo))."""
    return _pin(x509.load_der_x509_certificate(der_certificate))


def retention_terms(days: int, zero_data_retention: bool, training: bool) -> str:
    """The `owngate:retention:` value that states these retention terms."""
    if zero_data_retention and days == 0:
        return "none" + ("+training" if training else "")
    return f"{days}d" + ("+zdr" if zero_data_retention else "") + ("+training" if training else "")


def facts_from_uris(uris: Iterable[str]) -> CertificateFacts:
    """The owngate facts among a certificate's URI SANs; ValueError on a malformed or
    repeated one (an ambiguous certificate attests nothing)."""
    found: dict[str, str] = {}
    for uri in uris:
        if uri[: len(FACT_PREFIX)].lower() != FACT_PREFIX:
            continue
        if not uri.startswith(FACT_PREFIX):  # the same scheme to another reader (RFC 3986)
            raise ValueError(
                f"certificate fact {_shown(uri)}: write the scheme lowercase, owngate:"
            )
        fact, _, value = uri[len(FACT_PREFIX) :].partition(":")
        if fact not in _FACTS:
            raise ValueError(f"unknown certificate fact {_shown(uri)}")
        pattern = _TERMS if fact == "retention" else FACT_NAME
        if not pattern.match(value):
            raise ValueError(f"malformed certificate fact {_shown(uri)}")
        if fact in found:
            raise ValueError(f"the certificate states {fact} more than once")
        found[fact] = value
    return CertificateFacts(**found)


def _shown(uri: str) -> str:
    """A certificate's URI as an error quotes it: ASCII with every other character escaped
    (no control character, escape sequence or look-alike reaches a log or a terminal),
    and at most `_SHOWN` characters of it (a SAN may be kilobytes long)."""
    return ascii(uri[:_SHOWN]) + ("..." if len(uri) > _SHOWN else "")


@dataclass(frozen=True, slots=True)
class BackendTLS:
    """How to open and check a TLS connection to one backend."""

    backend: str
    context: ssl.SSLContext
    server_name: str
    pins: frozenset[str] = frozenset()
    # identity: certificate: the declared facts the certificate must state
    declared: CertificateFacts | None = None
    digest: str = ""  # of the settings and the files read: a reload with new files differs
    files: tuple[Path, ...] = ()  # the files read (CA, client certificate and key)
    files_digest: str = ""  # of their contents, as read
    # the wall clock a pooled connection's `Peer.until` is read against (a test's fake)
    clock: Callable[[], float] = field(default=time.time, compare=False)

    def files_changed(self) -> bool:
        """Whether the files now read differently from when this was built (a file gone
        or unreadable counts as changed: the reload that follows names the problem)."""
        try:
            return _files_digest(self.backend, self.files) != self.files_digest
        except ValueError:
            return True

    def check(self, ssl_object: ssl.SSLObject | None) -> Peer:
        """The peer of a connection whose handshake just completed; raises
        `TLSRejectedError` when its key is not pinned or its facts disagree."""
        der = None if ssl_object is None else ssl_object.getpeercert(binary_form=True)
        if ssl_object is None or der is None:
            raise TLSRejectedError("the backend presented no certificate")
        # Read with `cryptography` from the DER, key and facts alike: `getpeercert()`'s
        # dict raises UnicodeDecodeError on a URI (SAN, OCSP, CRL) that is not UTF-8.
        try:
            certificate = x509.load_der_x509_certificate(der)
            pin = _pin(certificate)
            until = _valid_until(ssl_object, certificate)
            uris = [] if self.declared is None else _uris(certificate)
        except (
            ValueError,  # also a SAN that does not parse (a URI that is not IA5String)
            UnsupportedAlgorithm,  # e.g. an SM2 or GOST key
            x509.DuplicateExtension,
            x509.UnsupportedGeneralNameType,
        ) as exc:
            why = _bounded(f"{type(exc).__name__}: {exc}")
            raise TLSRejectedError(f"the backend's certificate cannot be read ({why})") from exc
        if self.pins and pin not in self.pins:
            raise TLSRejectedError(f"certificate key {pin} is not among tls.pin_spki_sha256")
        if self.declared is None:
            return Peer(pin, attested=False, until=until)
        try:
            stated = facts_from_uris(uris)
        except ValueError as exc:
            raise TLSRejectedError(str(exc)) from exc
        for fact in _FACTS:
            want, got = getattr(self.declared, fact), getattr(stated, fact)
            if got is None:
                raise TLSRejectedError(f"the certificate states no {fact} (owngate:{fact}:...)")
            if got != want:
                raise TLSRejectedError(
                    f"{fact} differs: the certificate says {got!r}, gateway.yaml says {want!r}"
                )
        return Peer(pin, attested=True, until=until)


def _pin(certificate: x509.Certificate) -> str:
    spki = certificate.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return "sha256//" + base64.b64encode(hashlib.sha256(spki).digest()).decode("ascii")


_ENCODING_DER = 2  # `_ssl.ENCODING_DER`, what `_ssl.Certificate.public_bytes` takes


def _valid_until(ssl_object: ssl.SSLObject, leaf: x509.Certificate) -> float:
    """When the first certificate of the verified chain (the leaf, the CAs it was
    verified through, the trust anchor) expires, as POSIX time."""
    until = leaf.not_valid_after_utc.timestamp()
    chain = getattr(ssl_object, "get_verified_chain", None)  # public from Python 3.13
    if chain is None:  # Python 3.10 to 3.12: the same method, on the C object only
        chain = getattr(getattr(ssl_object, "_sslobj", None), "get_verified_chain", None)
    for cert in ([] if chain is None else chain() or [])[1:]:  # None: nothing verified
        # DER as 3.13's public method gives it, or an `_ssl.Certificate`'s: never its
        # `get_info()` text, whose URIs (CRL, OCSP) must be UTF-8 (a CA's byte above 0x7f
        # refused every backend under it)
        der = cert if isinstance(cert, bytes) else cert.public_bytes(_ENCODING_DER)
        expires = x509.load_der_x509_certificate(der).not_valid_after_utc.timestamp()
        until = min(until, expires)
    return until


def _uris(certificate: x509.Certificate) -> list[str]:
    """The certificate's URI SANs (none without the extension)."""
    try:
        sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return [str(uri) for uri in sans.value.get_values_for_type(x509.UniformResourceIdentifier)]


def _bounded(text: str) -> str:
    """`text` for an error message: ASCII, escaped where not printable, at most 200 characters."""
    shown = ascii(text)[1:-1]
    return shown if len(shown) <= 200 else shown[:200] + "..."


def system_tls(host: str) -> BackendTLS:
    """An https backend without `tls:`: the system's roots, the URL's host checked."""
    context = os_roots_context()
    context.set_alpn_protocols(["http/1.1"])
    return BackendTLS(host, context, host)


def backend_tls(backend: BackendSettings, host: str, config_dir: Path) -> BackendTLS:
    """The TLS setup of an https backend (`host`: base_url's), its files read from
    `config_dir`; ValueError naming the backend and the file that cannot be used."""
    settings = backend.tls
    own_ca = settings is not None and settings.ca_file is not None
    # PROTOCOL_TLS_CLIENT checks the chain and the name and trusts no roots until told.
    context = harden(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)) if own_ca else os_roots_context()
    context.set_alpn_protocols(["http/1.1"])
    files: list[Path] = []
    read: list[str] = []  # each file's SHA-256, taken from the bytes read before loading it
    pins: frozenset[str] = frozenset()
    server_name = host
    if settings is not None:
        if settings.ca_file is not None:
            files.append(config_dir / settings.ca_file)
            data = _read(backend.id, "ca_file", files[-1])
            read.append(hashlib.sha256(data).hexdigest())
            try:  # its PEM blocks, text around them skipped as OpenSSL's file loader does
                pem = load_ca_bundle(context, data)
            except ValueError as exc:
                # What the file says, not whether it could be read: a ValueError, never an
                # OSError (an SSLError is one), and a reload reads again one whose cause is
                # (a worker of several stale meanwhile: every worker, refusing everything).
                raise ValueError(
                    f"backend {backend.id}: tls.ca_file {config_dir / settings.ca_file}: {exc}"
                ) from None
            try:
                # An issuing CA as an anchor of its own, its root absent (tls_anchors.py):
                # the root (and every CA it issued: users', other teams') need not be
                # trusted to attest a backend's facts.
                if partial_chain(pem):
                    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
            except ValueError as exc:
                raise ValueError(
                    f"backend {backend.id}: tls.ca_file {config_dir / settings.ca_file}: {exc}"
                ) from None
        if settings.client_cert_file is not None and settings.client_key_file is not None:
            cert = config_dir / settings.client_cert_file
            key = config_dir / settings.client_key_file
            files += (cert, key)
            cert_pem = _read(backend.id, "client_cert_file", cert)
            key_pem = _read(backend.id, "client_key_file", key)
            read += (hashlib.sha256(cert_pem).hexdigest(), hashlib.sha256(key_pem).hexdigest())
            try:  # an encrypted key fails here, never prompts for a passphrase
                # the bytes read and digested, never the paths opened again (tls_files)
                load_cert_chain(context, cert_pem, key_pem, _no_passphrase)
            except (ssl.SSLError, _EncryptedKeyError) as exc:  # what they say (`from None`)
                why = "it is encrypted" if isinstance(exc, _EncryptedKeyError) else exc.reason
                raise ValueError(
                    f"backend {backend.id}: tls.client_cert_file {cert} and client_key_file "
                    f"{key}: not a PEM certificate and its unencrypted key ({why})"
                ) from None
            except OSError as exc:  # no memory file (out of descriptors): read again
                raise ValueError(
                    f"backend {backend.id}: tls.client_cert_file {cert}: {exc.strerror}"
                ) from exc
        pins = frozenset(settings.pin_spki_sha256)
        server_name = settings.server_name or host
    declared = None
    if backend.identity == "certificate":
        r = backend.retention
        terms = retention_terms(r.days, r.zero_data_retention, r.training)
        declared = CertificateFacts(backend.region, backend.owner, terms)
    # Digested as read before loading: a file replaced between the two reads makes the
    # next reload see a change, never miss one.
    contents = hashlib.sha256("\n".join(read).encode()).hexdigest()
    settings_json = backend.model_dump_json(
        include={"tls", "identity", "region", "owner", "retention"}
    )
    digest = hashlib.sha256(f"{settings_json}\n{contents}".encode()).hexdigest()
    return BackendTLS(
        backend.id, context, server_name, pins, declared, digest, tuple(files), contents
    )


class _EncryptedKeyError(Exception):
    pass


def _no_passphrase() -> bytes:
    raise _EncryptedKeyError


def _files_digest(backend: str, files: Iterable[Path]) -> str:
    """SHA-256 over the SHA-256 of each file's contents, in order."""
    parts = [hashlib.sha256(_read(backend, "file", path)).hexdigest() for path in files]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _read(backend: str, key: str, path: Path) -> bytes:
    try:
        return read_tls_file(path)
    except OSError as exc:
        raise ValueError(f"backend {backend}: tls.{key} {path}: {exc.strerror}") from exc
