"""`gateway.yaml`'s `admin:` section: who may read the admin surface, the admin API's own
listener, its role-bearing tokens (stored as digests) and its timelines' sampling."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from gateway.config.base import _KEY_HASH, _Strict

__all__ = ["AdminListenSettings", "AdminRole", "AdminSettings", "AdminTokenSettings"]


class AdminListenSettings(_Strict):
    """Where the admin API (gateway/admin/, FastAPI) listens: its own port, never the
    public one."""

    host: str = "127.0.0.1"
    port: int = Field(default=9090, ge=0, le=65535)


AdminRole = Literal["operator", "security", "auditor"]


class AdminTokenSettings(_Strict):
    """One admin token of the admin API, stored as its digest, with the role it acts in."""

    hash: str = Field(description="'sha256:<hex>' digest (`owngate keys new --admin`)")
    role: AdminRole = Field(
        description="operator (status, reload, drain), security (policies, keys) or "
        "auditor (log, receipts, proofs: read-only)"
    )

    @field_validator("hash")
    @classmethod
    def _hash_shape(cls, value: str) -> str:
        if not _KEY_HASH.match(value):
            raise ValueError(
                "admin.tokens[].hash holds a 'sha256:<64 hex>' digest made by "
                "`owngate keys new --admin`, never a raw token"
            )
        return value


class AdminSettings(_Strict):
    """Who may read the admin surface (`/admin/status`: backends, load, breakers, the
    policy digest, shared state) and the admin API on `listen`. Nobody, unless one of
    these is set."""

    listen: AdminListenSettings | None = Field(
        default=AdminListenSettings(),
        description="the admin API's own listener (`owngate serve` opens it when some admin "
        "access is configured); null turns it off",
    )
    tokens: tuple[AdminTokenSettings, ...] = Field(
        default=(),
        description="admin API tokens with a role each: [{hash: 'sha256:...', role: ...}]",
    )

    token_hashes: tuple[str, ...] = Field(
        default=(),
        description="'sha256:<hex>' digests of admin tokens (`owngate keys new --admin`), "
        "sent as 'Authorization: Bearer TOKEN'; several allow a rotation",
    )
    allow_loopback: bool = Field(
        default=False,
        description="also admit clients on a loopback address without a token: for a "
        "single-host demo only (a service-mesh sidecar forwards every client from "
        "127.0.0.6)",
    )
    sample_interval_s: float = Field(
        default=2.0,
        ge=0.1,
        le=60,
        description="the admin API's timelines (/admin/v1/timeline/...): seconds between samples",
    )
    history_s: float = Field(
        default=600,
        ge=10,
        le=86400,
        description="the admin API's timelines: seconds of samples kept in memory (at most "
        "history_s / sample_interval_s samples, capped at 3600)",
    )

    @field_validator("token_hashes")
    @classmethod
    def _hash_shape(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            if not _KEY_HASH.match(value):
                raise ValueError(
                    "admin.token_hashes hold 'sha256:<64 hex>' digests made by "
                    "`owngate keys new --admin`, never raw tokens"
                )
        return values

    @model_validator(mode="after")
    def _one_role_per_digest(self) -> AdminSettings:
        """Refuse a digest listed under two roles (`admin.tokens`, `admin.token_hashes`):
        the token would act in whichever the lookup met first, silently. The problem names
        both entries, never the digest (nor, of course, the token)."""
        seen: dict[str, tuple[str, str]] = {}  # digest: (its first entry, its role)
        entries = [
            (f"admin.token_hashes[{i}]", h, "full access") for i, h in enumerate(self.token_hashes)
        ]
        entries += [(f"admin.tokens[{i}]", t.hash, t.role) for i, t in enumerate(self.tokens)]
        for entry, digest, role in entries:
            first = seen.setdefault(digest, (entry, role))
            if first[1] != role:
                raise ValueError(
                    f"{first[0]} ({first[1]}) and {entry} ({role}) list the same token "
                    "digest: one token acts in one role; list it once"
                )
        return self
