"""Which certificates of a backend's `tls.ca_file` anchor a chain.

An issuing CA may be the file alone, its root left out (the root's other CAs, users' or
other teams', then attest nothing): that takes OpenSSL's `VERIFY_X509_PARTIAL_CHAIN`,
under which a chain ends at the first certificate of the file it reaches. In a file that
also holds that CA's issuer (a root and its issuing CA, as a `ca-chain.pem` holds them)
the chain would end at the issuing CA too, and the root's path length, name constraints
and expiry, which bound the CAs below it before, would bind nothing. So the flag is set
only for a file with a CA whose issuer it lacks, and a file that has both kinds (one CA
standing alone, another below an issuer of the file) is refused: no flag could keep both
what it says of the first and what its issuer says of the second. A CA's issuer in the
file is found by name as OpenSSL finds it (`_same_name`: case and runs of spaces aside):
compared as written, a CA whose issuer field spelled its root's name in capitals was
taken for one without its issuer, and the flag made it an anchor past its root's limits.
"""

from __future__ import annotations

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm

__all__ = ["partial_chain"]


def partial_chain(pem: bytes) -> bool:
    """Whether the certificates of `pem` (a `ca_file` OpenSSL loaded) need
    `VERIFY_X509_PARTIAL_CHAIN`; ValueError for a file that mixes an anchor below a root
    it lacks with a certificate below one it holds (its text names both)."""
    try:
        certificates = x509.load_pem_x509_certificates(pem)
    except ValueError:  # OpenSSL read it, this cannot: its chains end at a root, as before
        return False
    alone: list[x509.Certificate] = []  # issued by no certificate of the file
    below: list[tuple[x509.Certificate, x509.Certificate]] = []  # and its issuer there
    for cert in certificates:
        if _same_name(cert.issuer, cert.subject):
            continue  # a root: it anchors without the flag
        issuer = next((other for other in certificates if _issued(cert, other)), None)
        if issuer is None:
            alone.append(cert)
        else:
            below.append((cert, issuer))
    if alone and below:
        (cert, issuer), lone = below[0], alone[0]
        raise ValueError(
            f"holds {_name(lone)}, trusted without its issuer, and {_name(cert)} with its "
            f"issuer {_name(issuer)}, whose limits (path length, names, expiry) would no "
            "longer bind it: a file holds CAs without their issuers, or roots with the CAs "
            "below them, not both"
        )
    return bool(alone)


def _issued(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    if issuer is cert or not _same_name(issuer.subject, cert.issuer):
        return False
    try:
        cert.verify_directly_issued_by(issuer)
    except InvalidSignature:  # another key under the same name (a CA renewed, say)
        return False
    except (ValueError, TypeError, UnsupportedAlgorithm):  # a DSA key, or the name spelled
        return True  # otherwise: unchecked, taken as issued by it (its limits bind, no flag)
    return True


def _same_name(one: x509.Name, other: x509.Name) -> bool:
    """Whether OpenSSL may take `one` and `other` for the same name: X.509 compares a
    name's strings with case and runs of spaces aside (OpenSSL's canonical form), so
    `CN=ORG  Root` issues below `CN=org root`. Folded at least as far as OpenSSL does, so
    that a pair it chains is never taken for a CA without its issuer here."""
    return _folded(one) == _folded(other)


def _folded(name: x509.Name) -> list[frozenset[tuple[str, object]]]:
    return [
        frozenset(
            (part.oid.dotted_string, " ".join(part.value.split()).casefold())
            if isinstance(part.value, str)
            else (part.oid.dotted_string, part.value)
            for part in relative
        )
        for relative in name.rdns
    ]


def _name(cert: x509.Certificate) -> str:
    return repr(cert.subject.rfc4514_string()[:120])
