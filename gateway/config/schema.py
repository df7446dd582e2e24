"""The schema of `gateway.yaml`: frozen pydantic models that forbid unknown keys.

Only the loader and the startup path touch these models; the request path reads the
plain, precomputed tables that `gateway.routing.registry` builds from them.
"""

from __future__ import annotations

import base64
import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.provenance.errors import KeyFormatError
from gateway.provenance.formats.cosignature import CosignatureVerifier
from gateway.provenance.formats.note import Verifier

__all__ = [
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
    "WitnessSettings",
]

BackendKind = Literal["vllm", "llamacpp", "sglang", "openai", "hosted"]
PRIVATE_KINDS: frozenset[str] = frozenset({"vllm", "llamacpp", "sglang", "openai"})

_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
_KEY_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")

Identifier = Annotated[str, Field(pattern=_ID)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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


class LoggingSettings(_Strict):
    format: Literal["json", "console"] = "json"
    level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = True


class LimitSettings(_Strict):
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    connect_timeout_s: float = Field(default=3.0, gt=0)
    first_byte_timeout_s: float = Field(default=120.0, gt=0)
    read_timeout_s: float = Field(default=120.0, gt=0)
    max_response_bytes: int = Field(
        default=16 * 1024 * 1024, gt=0, description="a backend's whole (non-stream) answer"
    )
    response_timeout_s: float = Field(
        default=600.0, gt=0, description="a whole answer, from sending the request to its end"
    )
    stream_timeout_s: float | None = Field(
        default=None, gt=0, description="a stream, from sending the request to its end"
    )
    max_connections_per_backend: int = Field(default=256, gt=0)
    drain_timeout_s: float = Field(
        default=540.0, gt=0, description="on SIGTERM, how long open streams may finish"
    )


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


class WitnessSettings(_Strict):
    """A witness that cosigns the log's checkpoints (`owngate witness serve`, or any
    C2SP tlog-witness): its submission URL prefix and its cosignature verifier key."""

    url: str = Field(min_length=1, description="prefix; add-checkpoint is POSTed under it")
    vkey: str = Field(min_length=1, description="printed by `owngate witness vkey`")
    timeout_s: float = Field(default=5.0, gt=0)

    @field_validator("url")
    @classmethod
    def _witness_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("a witness url must be an absolute http(s) URL")
        return value

    @field_validator("vkey")
    @classmethod
    def _witness_vkey(cls, value: str) -> str:
        try:
            CosignatureVerifier(value)
        except KeyFormatError as exc:
            raise ValueError(str(exc)) from exc
        return value


class ProvenanceSettings(_Strict):
    """The signed provenance log of this gateway (one log per replica, its own origin)."""

    dir: str = Field(min_length=1, description="log directory, relative to gateway.yaml")
    origin: str = Field(min_length=1, description="the log's origin line, e.g. host/log/1")
    signing_key_file: str = Field(min_length=1, description="written by keys new --signing")
    group_commit_ms: float = Field(default=2.0, ge=0)
    checkpoint_every: int = Field(default=10_000, gt=0)
    checkpoint_interval_ms: float = Field(default=1000.0, gt=0)
    receipts: Literal["batch", "single"] = Field(
        default="batch",
        description="batch: one signature per committed batch, each receipt with its "
        "inclusion path (v2); single: one signature per receipt (v1)",
    )
    receipts_kept: int = Field(default=100_000, gt=0)
    receipts_memory_bytes: int = Field(
        default=64 * 1024 * 1024,
        gt=0,
        description="memory the receipts kept for lookup may take (about 1.8 KB each)",
    )
    previous_signing_key_files: tuple[str, ...] = Field(
        default=(),
        description="old keys that also sign every checkpoint during a key rotation",
    )
    witnesses: tuple[WitnessSettings, ...] = Field(
        default=(), description="C2SP tlog-witnesses asked to cosign each new checkpoint"
    )
    witness_retry_max_s: float = Field(
        default=60.0, gt=0, description="longest wait between retries to a failing witness"
    )


class WeightSettings(_Strict):
    """Scorer weights of the `score` strategy (see gateway/routing/picker.py)."""

    queue: float = Field(default=1.0, ge=0)
    kv: float = Field(default=0.3, ge=0)
    affinity: float = Field(default=0.5, ge=0)
    prefill: float = Field(default=1.0, ge=0)


class QueueSettings(_Strict):
    """The gateway's bounded wait queue of one pool when every private backend is saturated
    (waiting requests per slot above `threshold`) and the policy allows no fallback."""

    threshold: float = Field(default=1.0, gt=0, description="waiting requests per slot")
    size: int = Field(default=256, ge=0, description="waiters at most; 0 turns the queue off")
    max_wait_s: float = Field(default=30.0, gt=0)


class PoolSettings(_Strict):
    strategy: Literal["score", "least_inflight", "round_robin"] = "score"
    weights: WeightSettings = WeightSettings()
    queue: QueueSettings = QueueSettings()


class BreakerSettings(_Strict):
    """The circuit breaker of a backend (gateway/routing/breaker.py)."""

    failure_threshold: int = Field(default=3, gt=0, description="consecutive failures to open")
    cooldown_s: float = Field(default=1.0, gt=0, description="first open period")
    max_cooldown_s: float = Field(default=30.0, gt=0, description="cap of the doubling")

    @model_validator(mode="after")
    def _cap_covers_cooldown(self) -> BreakerSettings:
        if self.max_cooldown_s < self.cooldown_s:
            raise ValueError("max_cooldown_s must be at least cooldown_s")
        return self


class FailoverSettings(_Strict):
    """Retries on the next eligible backend, before the client has seen a byte."""

    max_attempts: int = Field(default=3, gt=0, description="private attempts per request")
    deadline_s: float = Field(
        default=300.0, gt=0, description="from arrival to the first byte, all attempts together"
    )


class RoutingSettings(_Strict):
    """How the eligible backends of a request are ordered: a default and per-model pools."""

    default: PoolSettings = PoolSettings()
    pools: dict[str, PoolSettings] = Field(default_factory=dict)
    affinity_prefix_bytes: int = Field(default=4096, ge=64)
    breaker: BreakerSettings = BreakerSettings()
    failover: FailoverSettings = FailoverSettings()


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

    @model_validator(mode="after")
    def _redis_needs_url(self) -> StateSettings:
        if self.backend == "redis" and not self.url:
            raise ValueError("state.backend 'redis' needs a url (redis://host:port/db)")
        if self.lease_ttl_s < 3 * self.sync_interval_s:
            raise ValueError("state.lease_ttl_s must cover at least three sync intervals")
        return self


class RetentionSettings(_Strict):
    """What the operator declares about how a backend keeps request data."""

    days: int = Field(default=0, ge=0)
    training: bool = False
    zero_data_retention: bool = False
    evidence: str = ""


class CapacitySettings(_Strict):
    """Hints for routing; measured load corrects them."""

    max_concurrency: int | None = Field(default=None, gt=0)
    context_tokens: int | None = Field(default=None, gt=0)


class ModelSettings(_Strict):
    name: str = Field(min_length=1, description="The model name the backend itself serves")
    aliases: tuple[str, ...] = ()
    provider_model: str | None = Field(
        default=None, description="LiteLLM model string for hosted backends, e.g. openai/gpt-4o"
    )


_PIN = re.compile(r"^sha256//[A-Za-z0-9+/]{43}=$")


class BackendTLSSettings(_Strict):
    """How the gateway authenticates a private backend over TLS (and itself to it).

    Paths are relative to gateway.yaml's directory; `gateway.upstream.tls` reads them when
    the gateway is assembled (so `config validate` names a missing or unreadable file).
    A pin is `sha256//` + the standard base64 of SHA-256 over the DER SubjectPublicKeyInfo
    of the backend's certificate, as `curl --pinnedpubkey` writes it."""

    ca_file: str | None = Field(default=None, min_length=1, description="the only trusted roots")
    client_cert_file: str | None = Field(default=None, min_length=1, description="mutual TLS")
    client_key_file: str | None = Field(default=None, min_length=1, description="mutual TLS")
    server_name: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$",
        description="SNI and the name checked; default: base_url's host",
    )
    pin_spki_sha256: tuple[str, ...] = ()

    @field_validator("pin_spki_sha256")
    @classmethod
    def _pin_shape(cls, pins: tuple[str, ...]) -> tuple[str, ...]:
        for pin in pins:
            if (
                not _PIN.match(pin)
                or base64.b64encode(base64.b64decode(pin[8:])).decode() != pin[8:]
            ):
                raise ValueError(
                    f"pin {pin!r} is not sha256// followed by the base64 of 32 bytes "
                    "(owngate backend cert prints it; see docs/backend-tls.md)"
                )
        return pins

    @model_validator(mode="after")
    def _key_pair(self) -> BackendTLSSettings:
        if (self.client_cert_file is None) != (self.client_key_file is None):
            raise ValueError("client_cert_file and client_key_file go together (mutual TLS)")
        return self


class AttestSettings(_Strict):
    """A backend behind `owngate attest`: every answer must carry that sidecar's
    countersignature (docs/provenance.md, layer 3)."""

    key: str = Field(
        min_length=1, description="the sidecar's verifier key (name+hexid+base64, signed-note)"
    )

    @field_validator("key")
    @classmethod
    def _verifier_key(cls, value: str) -> str:
        try:
            Verifier(value)
        except KeyFormatError as exc:
            raise ValueError(f"attest.key is not a verifier key: {exc}") from exc
        return value.strip()


class BackendSettings(_Strict):
    id: Identifier
    kind: BackendKind
    base_url: str | None = None
    models: tuple[ModelSettings, ...] = Field(min_length=1)
    region: str = Field(min_length=1)
    owner: str = Field(min_length=1)
    retention: RetentionSettings = RetentionSettings()
    capacity: CapacitySettings = CapacitySettings()
    api_key: str | None = Field(default=None, repr=False)
    api_key_env: str | None = None
    provider: str | None = None
    breaker: BreakerSettings | None = Field(
        default=None, description="this backend's circuit breaker; default routing.breaker"
    )
    first_byte_timeout_s: float | None = Field(
        default=None, gt=0, description="before failover; default limits.first_byte_timeout_s"
    )
    tls: BackendTLSSettings | None = Field(
        default=None, description="CA, mutual TLS, server name and key pins of an https backend"
    )
    identity: Literal["declared", "certificate"] = Field(
        default="declared",
        description="certificate: region, owner and retention must match the certificate's",
    )
    attest: AttestSettings | None = Field(
        default=None, description="private backends behind `owngate attest`: its key"
    )

    @field_validator("base_url")
    @classmethod
    def _url_shape(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.isascii() or not value.isprintable() or " " in value:
            raise ValueError("base_url must be plain ASCII without spaces or control characters")
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("base_url must be an absolute http(s) URL")
        try:
            parts.port  # noqa: B018 - raises on a port out of range
        except ValueError as exc:
            raise ValueError(f"base_url has an invalid port: {exc}") from exc
        if parts.query or parts.fragment:
            raise ValueError("base_url must not carry a query or fragment")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _kind_rules(self) -> BackendSettings:
        if self.kind in PRIVATE_KINDS and self.base_url is None:
            raise ValueError(f"a {self.kind} backend needs base_url (the server root)")
        if self.tls is not None or self.identity == "certificate":
            if self.kind not in PRIVATE_KINDS:
                raise ValueError("tls and identity apply to private backends only")
            if urlsplit(self.base_url or "").scheme != "https":
                raise ValueError(
                    "a backend with tls or identity: certificate needs an https base_url"
                )
        if self.identity == "certificate" and (self.tls is None or self.tls.ca_file is None):
            raise ValueError(
                "identity: certificate needs tls.ca_file: facts count only from a certificate "
                "issued by the organisation's own CA"
            )
        if self.kind == "hosted":
            if self.api_key is not None:
                raise ValueError(
                    "hosted backends take credentials from the environment (api_key_env), "
                    "never from the config file"
                )
            missing = [m.name for m in self.models if not m.provider_model]
            if missing:
                raise ValueError(f"hosted models need provider_model: {', '.join(missing)}")
        if self.attest is not None:
            if self.kind not in PRIVATE_KINDS:
                raise ValueError("attest is for private backends (hosted ones cannot countersign)")
            # The countersigned request must be the client's bytes: no model renaming.
            if any(m.aliases for m in self.models):
                raise ValueError(
                    "an attested backend serves its models under their own names (no "
                    "aliases): the body it countersigns must be the one the client sent"
                )
        return self

    @property
    def is_private(self) -> bool:
        return self.kind in PRIVATE_KINDS


class RateLimitSettings(_Strict):
    """Per-tenant limits (per process, or across replicas with `state: redis`)."""

    requests_per_minute: int | None = Field(default=None, gt=0)
    tokens_per_minute: int | None = Field(default=None, gt=0)
    concurrent_requests: int | None = Field(default=None, gt=0)


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
        served = {name for b in self.backends for m in b.models for name in (m.name, *m.aliases)}
        for tenant in self.tenants:
            for name in tenant.models:
                if name != "*" and name not in served:
                    raise ValueError(
                        f"tenant {tenant.id!r} allows model {name!r}, which no backend serves"
                    )
        return self


def _unique(what: str, ids: list[str]) -> None:
    seen: set[str] = set()
    for item in ids:
        if item in seen:
            raise ValueError(f"duplicate {what} id {item!r}")
        seen.add(item)
