"""The schema of `gateway.yaml`: frozen pydantic models that forbid unknown keys.

`GatewaySettings` is the whole file; this module holds it and the small top-level sections
(listen, logging, limits, scrape, health, policy, state, tenants). The larger sections have
modules of their own, re-exported here: `backends`, `routing`, `admin`, `provenance` (and
`base`, the strict base model). Only the loader and the startup path touch these models;
the request path reads the plain, precomputed tables that `gateway.routing.registry` builds
from them.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field, field_validator, model_validator

from gateway.body_budget import held_for_characters
from gateway.config.admin import (
    AdminListenSettings,
    AdminRole,
    AdminSettings,
    AdminTokenSettings,
)
from gateway.config.backend_trust import AttestSettings, BackendTLSSettings
from gateway.config.backends import (
    PRIVATE_KINDS,
    BackendKind,
    BackendSettings,
    CapacitySettings,
    ModelSettings,
    RetentionSettings,
)
from gateway.config.base import _KEY_HASH, Identifier, _Strict
from gateway.config.provenance import ProvenanceSettings, WitnessSettings
from gateway.config.routing import (
    BreakerSettings,
    FailoverSettings,
    PoolSettings,
    QueueSettings,
    RoutingSettings,
    WeightSettings,
)
from gateway.provenance.formats.note import Verifier

__all__ = [
    "PRIVATE_KINDS",
    "AdminListenSettings",
    "AdminRole",
    "AdminSettings",
    "AdminTokenSettings",
    "AttestSettings",
    "BackendKind",
    "BackendSettings",
    "BackendTLSSettings",
    "BreakerSettings",
    "CapacitySettings",
    "FailoverSettings",
    "GatewaySettings",
    "HealthSettings",
    "LimitSettings",
    "ListenSettings",
    "LoggingSettings",
    "ModelSettings",
    "PolicySettings",
    "PoolSettings",
    "ProvenanceSettings",
    "QueueSettings",
    "RateLimitSettings",
    "RetentionSettings",
    "RoutingSettings",
    "ScrapeSettings",
    "StateSettings",
    "TenantSettings",
    "WeightSettings",
    "WitnessSettings",
]


class ListenSettings(_Strict):
    """Where the gateway listens, and what one client connection may hold
    (`gateway.listener`)."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_header_bytes: int = Field(
        default=32 * 1024, ge=1024, description="request line and header lines; past it 431"
    )
    max_headers: int = Field(default=100, gt=0, description="header fields; past it 431")
    header_timeout_s: float = Field(
        default=10.0, gt=0, description="a request head must be complete within this"
    )
    body_timeout_s: float = Field(
        default=60.0, gt=0, description="a request body must be complete this long after its head"
    )
    keepalive_timeout_s: float = Field(
        default=30.0, gt=0, description="an idle keep-alive connection is closed after this"
    )
    write_timeout_s: float = Field(
        default=120.0,
        gt=0,
        allow_inf_nan=False,
        description="a client that reads nothing of its answer this long is cut off",
    )
    max_connections: int | None = Field(
        default=None, gt=0, description="open client connections per process; none: derived"
    )
    metrics: Literal["open", "admin"] = Field(
        default="admin", description="who reads /metrics here: an admin token, or anyone"
    )


class LoggingSettings(_Strict):
    format: Literal["json", "console"] = "json"
    level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = True


# `limits.max_media_walk_values`: 65,536 image parts of 3 values, 32,768 text parts of 2
MAX_MEDIA_WALK_VALUES: Final = 262_144


class LimitSettings(_Strict):
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    max_media_walk_values: int = Field(default=MAX_MEDIA_WALK_VALUES, gt=0)  # media_walk.py
    max_held_body_bytes: int = Field(
        default=1024 * 1024 * 1024,
        gt=0,
        description="request bodies and what is parsed from them, held at once by one "
        "process (an upper bound; gateway/body_budget.py)",
    )
    max_held_body_bytes_per_tenant: int | None = Field(
        default=None,
        gt=0,
        description="the part of max_held_body_bytes one tenant's requests may hold at once; "
        "default half of it (at least max_body_bytes); when set, at least 6 x max_body_bytes "
        "(a body's reservation before its values)",
    )
    connect_timeout_s: float = Field(default=3.0, gt=0)
    first_byte_timeout_s: float = Field(default=120.0, gt=0)
    read_timeout_s: float = Field(default=120.0, gt=0)
    max_response_bytes: int = Field(
        default=16 * 1024 * 1024, gt=0, description="a backend's whole (non-stream) answer"
    )
    max_held_answer_bytes: int = Field(
        default=1024 * 1024 * 1024,
        gt=0,
        description="whole answers (and backend error bodies) held at once by one process, "
        "until their clients have taken them (gateway/api/answer_reads.py)",
    )
    max_held_answer_bytes_per_tenant: int | None = Field(
        default=None,
        gt=0,
        description="the part of max_held_answer_bytes one tenant's requests may hold at "
        "once; default half of it (at least max_response_bytes); when set, at least "
        "max_response_bytes",
    )
    response_timeout_s: float = Field(
        default=600.0, gt=0, description="a whole answer, from sending the request to its end"
    )
    stream_timeout_s: float | None = Field(
        default=None, gt=0, description="a stream, from sending the request to its end"
    )
    max_connections_per_backend: int = Field(default=256, gt=0)
    tenant_share_of_backend: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="the part of a backend's connections (a hosted one's calls) one tenant "
        "may hold at once (at least one) when more than one tenant is configured; 1: no share",
    )
    drain_timeout_s: float = Field(
        default=540.0, gt=0, description="on SIGTERM, how long open streams may finish"
    )

    @model_validator(mode="after")
    def _one_body_and_answer_fit_their_budgets(self) -> LimitSettings:
        if self.max_held_body_bytes < self.max_body_bytes:
            raise ValueError(
                "limits.max_held_body_bytes must be at least limits.max_body_bytes "
                "(else a body within the limit could never be taken)"
            )
        if self.max_held_answer_bytes < self.max_response_bytes:
            raise ValueError(
                "limits.max_held_answer_bytes must be at least limits.max_response_bytes "
                "(else an answer within the limit could never be taken)"
            )
        answers = self.max_held_answer_bytes_per_tenant
        if answers is not None and not (
            self.max_response_bytes <= answers <= self.max_held_answer_bytes
        ):
            raise ValueError(
                "limits.max_held_answer_bytes_per_tenant must be at least "
                "limits.max_response_bytes (else an answer within the limit could never be "
                "taken) and at most limits.max_held_answer_bytes"
            )
        per_tenant = self.max_held_body_bytes_per_tenant
        # A body's reservation (gateway/body_budget.py): six times its size, before its
        # values; a part below that of a max_body_bytes body refuses such bodies for good.
        one_body = held_for_characters(self.max_body_bytes)
        if per_tenant is not None and not (one_body <= per_tenant <= self.max_held_body_bytes):
            raise ValueError(
                "limits.max_held_body_bytes_per_tenant must be at least 6 x "
                f"limits.max_body_bytes ({one_body}: a body is reserved up to six times its "
                "size, plus 320 bytes per JSON value) and at most limits.max_held_body_bytes"
            )
        return self

    @property
    def tenant_held_body_bytes(self) -> int:
        """What one tenant's requests may hold of `max_held_body_bytes` at once: the
        setting, else half the budget (at least one body's bytes), so that one tenant's
        bodies (held open, or of tiny values held through a long answer) leave the other
        tenants room."""
        if self.max_held_body_bytes_per_tenant is not None:
            return self.max_held_body_bytes_per_tenant
        return max(self.max_held_body_bytes // 2, self.max_body_bytes)

    @property
    def tenant_held_answer_bytes(self) -> int:
        """What one tenant's requests may hold of `max_held_answer_bytes` at once: the
        setting, else half the budget (at least one answer's bytes), so that one tenant's
        clients reading nothing of large answers leave the other tenants room."""
        if self.max_held_answer_bytes_per_tenant is not None:
            return self.max_held_answer_bytes_per_tenant
        return max(self.max_held_answer_bytes // 2, self.max_response_bytes)


class ScrapeSettings(_Strict):
    """How often backends' /metrics are read, and when a reading is too old to trust."""

    interval_s: float = Field(default=0.5, gt=0)
    timeout_s: float = Field(default=1.0, gt=0)
    staleness_s: float = Field(default=3.0, gt=0)

    @model_validator(mode="after")
    def _staleness_covers_interval(self) -> ScrapeSettings:
        if self.staleness_s <= self.interval_s:
            raise ValueError("scrape.staleness_s must be longer than scrape.interval_s")
        return self


class HealthSettings(_Strict):
    """When failed `/health` probes take a backend out of routing
    (gateway/routing/health.py); the probes run every `scrape.interval_s`."""

    failures_to_down: int = Field(
        default=3, ge=1, le=1000, description="failed probes in a row that mark a backend down"
    )


class PolicySettings(_Strict):
    """Where the trust policies live (files or directories, relative to gateway.yaml)."""

    paths: tuple[str, ...] = Field(min_length=1)
    reload_interval_s: float = Field(default=1.0, gt=0)


class StateSettings(_Strict):
    """Shared state (docs/state.md): per process, or on Redis shared by every replica."""

    backend: Literal["memory", "redis"] = "memory"
    url: str | None = None
    key_prefix: str = Field(default="owngate", pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
    replica_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
    timeout_ms: float = Field(default=50, gt=0)
    sync_interval_s: float = Field(default=0.1, gt=0)
    lease_ttl_s: float = Field(default=5.0, gt=0)
    max_connections: int = Field(default=16, ge=2)
    # This host's revoked keys list, relative to the config's directory (docs/state.md)
    revocations_file: str = Field(default="revoked-keys", min_length=1)

    @model_validator(mode="after")
    def _redis_needs_url(self) -> StateSettings:
        if self.backend == "redis" and not self.url:
            raise ValueError("state.backend 'redis' needs a url (redis://host:port/db)")
        if self.lease_ttl_s < 3 * self.sync_interval_s:
            raise ValueError("state.lease_ttl_s must cover at least three sync intervals")
        return self


class RateLimitSettings(_Strict):
    """Per-tenant limits (per process, or across replicas with `state: redis`)."""

    requests_per_minute: int | None = Field(default=None, gt=0)
    tokens_per_minute: int | None = Field(default=None, gt=0)
    concurrent_requests: int | None = Field(default=None, gt=0)
    reserved_tokens_per_answer: int | None = Field(
        default=None,
        gt=0,
        description="Tokens a request reserves of tokens_per_minute for each answer when it "
        "sets no max_tokens (docs/configuration.md); default: tokens_per_minute / 8",
    )
    reserved_tokens_per_media: int | None = Field(
        default=None,
        gt=0,
        le=65536,  # usage_bound.MEDIA_ALLOWANCE: no part is ever charged more
        description="Tokens a request reserves of tokens_per_minute for each image, audio, "
        "video or file part (docs/configuration.md); default: 4096",
    )

    @model_validator(mode="after")
    def _reservation_within_budget(self) -> RateLimitSettings:
        reserved, budget = self.reserved_tokens_per_answer, self.tokens_per_minute
        if reserved is not None and (budget is None or reserved > budget):
            raise ValueError(
                "reserved_tokens_per_answer needs tokens_per_minute, and at most that many"
            )
        if self.reserved_tokens_per_media is not None and budget is None:
            raise ValueError("reserved_tokens_per_media needs tokens_per_minute")
        return self


class TenantSettings(_Strict):
    id: Identifier
    limits: RateLimitSettings = RateLimitSettings()
    api_key_hashes: tuple[str, ...] = ()
    models: tuple[str, ...] = Field(
        default=(), description="Model names or aliases the tenant may use; '*' for all"
    )

    @field_validator("api_key_hashes")
    @classmethod
    def _hash_shape(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            if not _KEY_HASH.match(value):
                raise ValueError(
                    "api_key_hashes hold 'sha256:<64 hex>' digests made by "
                    "`owngate keys new`, never raw keys"
                )
        return values


class GatewaySettings(_Strict):
    listen: ListenSettings = ListenSettings()
    logging: LoggingSettings = LoggingSettings()
    limits: LimitSettings = LimitSettings()
    state: StateSettings = StateSettings()
    scrape: ScrapeSettings = ScrapeSettings()
    health: HealthSettings = HealthSettings()
    routing: RoutingSettings = RoutingSettings()
    policy: PolicySettings | None = Field(
        default=None,
        description="Trust policies; without them every tenant is private-only (no fallback)",
    )
    provenance: ProvenanceSettings | None = None
    keys_file: str | None = Field(
        default=None, description="YAML file of tenant key hashes written by `owngate keys new`"
    )
    backends: tuple[BackendSettings, ...] = Field(min_length=1)
    tenants: tuple[TenantSettings, ...] = ()
    admin: AdminSettings = AdminSettings()

    @model_validator(mode="after")
    def _cross_checks(self) -> GatewaySettings:
        admin = self.admin.listen
        if admin is not None and admin.port != 0 and admin.port == self.listen.port:
            raise ValueError(
                f"admin.listen.port {admin.port} is the public listen.port: the admin API "
                "needs a port of its own"
            )
        _unique("backends", [b.id for b in self.backends])
        _unique("tenants", [t.id for t in self.tenants])
        _one_key_each(self.backends)
        # A tenant's `models` naming what no backend serves is a warning (loader.py):
        # refused, a reload taking a model off its backends failed, and it kept being served.
        return self


def _one_key_each(backends: tuple[BackendSettings, ...]) -> None:
    """A countersignature names its key, not its backend: two attested backends with one
    key would each accept the other's answers (docs/provenance.md, layer 3)."""
    seen: dict[str, tuple[str, bytes]] = {}
    for b in backends:
        if b.attest is None:
            continue
        verifier = Verifier(b.attest.key)
        key = str(verifier)  # name+id: the statement's `key`
        earlier, public = seen.setdefault(key, (b.id, verifier.public_key))
        if earlier == b.id:
            continue
        if public == verifier.public_key:
            raise ValueError(
                f"backends {earlier!r} and {b.id!r} have one attest.key ({key}): each "
                "sidecar needs its own key, or one backend's answers pass for the other's"
            )
        raise ValueError(
            f"backends {earlier!r} and {b.id!r} have different keys with one key id ({key}): "
            "a countersignature names its key by that id, so one backend's answers would "
            "pass for the other's; give one of the sidecars a new key"
        )


def _unique(what: str, ids: list[str]) -> None:
    seen: set[str] = set()
    for item in ids:
        if item in seen:
            raise ValueError(f"duplicate {what} id {item!r}")
        seen.add(item)
