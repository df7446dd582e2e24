"""Tenants and their API keys: the key index the gateway authenticates against, key and
admin-token generation, hashing; the key-hash file `owngate keys` writes is read and
changed by gateway/keys_file.py (its names are re-exported here).

Keys are 32 random bytes (base64url, prefixed `og-`); only `sha256:<hex>` digests are
stored. A fast hash is right here: the keys are random and high-entropy, so there is
nothing for a slow KDF to protect, and hashing sits on every request. `index_keys` maps
each digest to its tenant (`TenantEntry`: the models it may use, its rate limits); a
request's key is one dict lookup there.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field

from gateway.config.schema import TenantSettings
from gateway.keys_file import (
    DIGEST,
    KeysFileBusy,
    add_key_hash,
    keys_file_lock,
    read_keys_file,
    remove_key_hash,
)
from gateway.state.types import TenantLimits

__all__ = [
    "ADMIN_TOKEN_PREFIX",
    "KEY_PREFIX",
    "KeysFileBusy",
    "TenantEntry",
    "add_key_hash",
    "hash_api_key",
    "index_keys",
    "key_hash_of",
    "keys_file_lock",
    "new_admin_token",
    "new_api_key",
    "read_keys_file",
    "remove_key_hash",
    "tenant_limits",
]

KEY_PREFIX = "og-"
ADMIN_TOKEN_PREFIX = "og-admin-"  # noqa: S105 - a prefix, not a secret


@dataclass(frozen=True, slots=True)
class TenantEntry:
    """A configured tenant as the request path sees it."""

    id: str
    all_models: bool
    models: frozenset[str]
    limits: TenantLimits = field(default_factory=TenantLimits)
    # Tokens reserved per answer of a request without max_tokens (gateway/api/reservation.py);
    # None: the default share of `limits.tokens_per_minute`.
    reserved_tokens_per_answer: int | None = None
    # Tokens reserved per image, audio, video or file part; None: `MEDIA_RESERVED`.
    reserved_tokens_per_media: int | None = None

    def may_use(self, model: str) -> bool:
        return self.all_models or model in self.models


def tenant_limits(tenant: TenantSettings) -> TenantLimits:
    """The limits the state enforces for a configured tenant."""
    return TenantLimits(
        requests_per_minute=tenant.limits.requests_per_minute,
        tokens_per_minute=tenant.limits.tokens_per_minute,
        concurrent=tenant.limits.concurrent_requests,
    )


def index_keys(tenants: Iterable[TenantSettings]) -> dict[str, TenantEntry]:
    """Each tenant API key digest (`sha256:<hex>`) to its tenant. Raises ValueError
    naming every digest listed for two tenants, one per line."""
    index: dict[str, TenantEntry] = {}
    problems: list[str] = []
    for tenant in tenants:
        limits = tenant_limits(tenant)
        entry = TenantEntry(
            tenant.id,
            "*" in tenant.models,
            frozenset(tenant.models),
            limits,
            tenant.limits.reserved_tokens_per_answer,
            tenant.limits.reserved_tokens_per_media,
        )
        for key_hash in tenant.api_key_hashes:
            other = index.setdefault(key_hash, entry)
            if other is not entry:
                problems.append(
                    f"one API key hash is listed for tenants {other.id!r} and {tenant.id!r}"
                )
    if problems:
        raise ValueError("\n".join(problems))
    return index


def new_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def new_admin_token() -> str:
    """A token for the admin surface (`admin.token_hashes` holds its `hash_api_key`)."""
    return ADMIN_TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_api_key(key: str | bytes) -> str:
    raw = key.encode() if isinstance(key, str) else key
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def key_hash_of(key_or_hash: str) -> str:
    """The stored form of a key given either as the key itself or as its digest."""
    text = key_or_hash.strip()
    if DIGEST.match(text):
        return text
    if not text:
        raise ValueError("an empty string is not an API key")
    return hash_api_key(text)
