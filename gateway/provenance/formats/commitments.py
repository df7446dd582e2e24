"""Salted commitments to request and response bodies: the log proves, never reveals.

commitment = SHA-256(domain || salt || SHA-256(body)), with a fresh 32-byte salt per body.
The salt goes only to the client (in its receipt); the gateway never stores it, so the log
alone cannot confirm a guessed prompt. With the salt and the body, anyone can open it.
Domains are NUL-terminated, so no request commitment can be read as a response one.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from gateway.provenance.errors import CommitmentMismatchError

__all__ = [
    "REQUEST_DOMAIN",
    "RESPONSE_DOMAIN",
    "SALT_SIZE",
    "BodyKind",
    "Salts",
    "commit",
    "commit_digest",
    "verify_commitment",
    "verify_digest",
]

SALT_SIZE = 32
REQUEST_DOMAIN = b"owngate/provenance/v1/request-commitment\x00"
RESPONSE_DOMAIN = b"owngate/provenance/v1/response-commitment\x00"
BodyKind = Literal["request", "response"]
_DOMAINS: dict[str, bytes] = {"request": REQUEST_DOMAIN, "response": RESPONSE_DOMAIN}


@dataclass(frozen=True, slots=True)
class Salts:
    """The two salts of one request; they travel only in the client's receipt."""

    request: bytes
    response: bytes

    @classmethod
    def generate(cls, random: Callable[[int], bytes] = os.urandom) -> Salts:
        both = random(2 * SALT_SIZE)  # one system call per request, not two
        return cls(both[:SALT_SIZE], both[SALT_SIZE:])

    def __post_init__(self) -> None:
        if len(self.request) != SALT_SIZE or len(self.response) != SALT_SIZE:
            raise ValueError(f"salts are {SALT_SIZE} bytes")

    def __repr__(self) -> str:  # salts are secrets of the client: never in logs
        return "Salts(<redacted>)"


def commit_digest(kind: BodyKind, salt: bytes, body_sha256: bytes) -> str:
    """Commitment (lowercase hex) from a body's SHA-256, for bodies hashed incrementally."""
    if len(salt) != SALT_SIZE:
        raise ValueError(f"salt must be {SALT_SIZE} bytes")
    if len(body_sha256) != 32:
        raise ValueError("body digest must be a 32-byte SHA-256")
    return hashlib.sha256(_DOMAINS[kind] + salt + body_sha256).hexdigest()


def commit(kind: BodyKind, salt: bytes, body: bytes) -> str:
    """Commitment (lowercase hex) to `body` under `salt`."""
    return commit_digest(kind, salt, hashlib.sha256(body).digest())


def verify_commitment(kind: BodyKind, commitment: str, salt: bytes, body: bytes) -> None:
    """Raise CommitmentMismatchError unless `body` and `salt` open `commitment`."""
    verify_digest(kind, commitment, salt, hashlib.sha256(body).digest())


def verify_digest(kind: BodyKind, commitment: str, salt: bytes, body_sha256: bytes) -> None:
    """Raise CommitmentMismatchError unless the body of SHA-256 `body_sha256` and `salt`
    open `commitment` (a body hashed incrementally: `audit.body_file`)."""
    actual = commit_digest(kind, salt, body_sha256)
    if not hmac.compare_digest(actual, commitment.strip().lower()):
        raise CommitmentMismatchError(
            f"the body and salt do not open this {kind} commitment "
            f"(they commit to {actual}, the record holds {commitment})"
        )
