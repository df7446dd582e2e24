"""The admin API's request and response bodies (pydantic): what /openapi.json describes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.config.base import Identifier

__all__ = [
    "ActionResult",
    "BackendStatus",
    "BreakerStatus",
    "ConfigCandidate",
    "ConfigStatus",
    "ConfigValidation",
    "CreatedKey",
    "ExplainRequest",
    "Explained",
    "KeyCreate",
    "KeyList",
    "KeyRow",
    "PolicyStatus",
    "PolicySummary",
    "QueueStatus",
    "Status",
    "TenantBreakerStatus",
    "TraceRow",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TenantBreakerStatus(_Model):
    """A backend's breaker scoped to one tenant, whose requests alone made it fail."""

    tenant: str
    state: str
    failures: int
    retry_in_s: float | None
    last_error: str | None


class BreakerStatus(_Model):
    state: str
    failures: int
    opens: int
    retry_in_s: float | None
    last_error: str | None
    tenants: list[TenantBreakerStatus] = Field(
        default=[], description="breakers scoped to one tenant, with failures on record"
    )


class BackendStatus(_Model):
    """One backend as routing sees it (`/admin/status` shows the same)."""

    id: str
    kind: str
    models: list[str]
    proxy: str | None = Field(
        default=None, description="hosted: the proxy its calls go through (config `proxy`)"
    )
    available: bool
    health: str
    health_error: str | None
    breaker: BreakerStatus
    inflight: int
    inflight_global: int
    prefilling_tokens: int = Field(description="prefill backlog: prompt tokens in prefill")
    slots: int | None
    slots_from: str | None
    running: int | None = Field(description="scraped: requests the backend runs")
    waiting: int | None = Field(description="scraped: requests queued at the backend")
    kv_usage: float | None = Field(description="scraped: KV-cache use, 0..1")
    metrics_age_s: float | None
    metrics_stale: bool
    metrics_error: str | None
    scores: dict[str, float] = Field(
        description="routing score per model (higher is better: the backend tried first)"
    )


class QueueStatus(_Model):
    waiting: int
    size: int
    max_wait_s: float
    threshold: float


class Status(_Model):
    status: Literal["ready", "not ready"]
    draining: bool
    backends: list[BackendStatus]
    queues: dict[str, QueueStatus]
    provenance: dict[str, Any] | str
    witnesses: dict[str, Any] | str
    state: dict[str, Any]


class PolicySummary(_Model):
    """One policy of the active set: whom it binds and the rules it declares."""

    id: str
    version: str
    tenants: list[str]
    data_classes: list[str]
    rules: list[str] = Field(description="the rule ids its decisions and refusals name")


class PolicyStatus(_Model):
    id: str
    version: str
    digest: str
    builtin: bool = Field(description="no policy files configured: private backends only")
    loaded_at: float = Field(description="Unix time the active set was loaded")
    last_reload_error: str | None
    policies: list[PolicySummary] = Field(description="the set's policies, by id")
    rules: list[str] = Field(
        description="every rule id the set declares (its policies' and the set's own: "
        "default-deny for a tenant no policy binds, unknown-model)"
    )


class ExplainRequest(_Model):
    tenant: str
    model: str
    data_class: str | None = Field(default=None, description="as the x-data-class header")


class TraceRow(_Model):
    backend: str
    verdict: str
    rule: str
    reason: str


class Explained(_Model):
    """A policy decision and its trace (the shape of `owngate policy explain --json`)."""

    tenant: str
    model: str
    data_class: str | None
    default_rule: str | None
    private: list[str]
    hosted: list[str]
    fallback: str
    saturation_threshold: float | None
    fallback_rule: str
    refusal: dict[str, str] | None
    trace: list[TraceRow]
    policy_id: str
    policy_version: str
    policy_digest: str


class ConfigStatus(_Model):
    digest: str = Field(description="SHA-256 of the running config (canonical JSON)")
    source: str | None = Field(description="the config file, when served from one")
    loaded_at: float | None
    last_reload_error: str | None
    reload_failures: int
    needs_restart: list[str] = Field(
        default_factory=list,
        description="settings the config file read last changes that only a restart "
        "applies (their running values are kept): state.revocations_file, listen, ...",
    )


MAX_CANDIDATE_BYTES = 256 * 1024  # a gateway.yaml; parsing one costs CPU in proportion


class ConfigCandidate(_Model):
    yaml: str = Field(
        max_length=MAX_CANDIDATE_BYTES,
        description="the candidate gateway.yaml's text (its relative paths, "
        "such as policy files and the keys file, are read from the running config's directory)",
    )


class ConfigValidation(_Model):
    valid: bool
    problems: list[str] = Field(description="every problem, as `owngate config validate` names it")


class ActionResult(_Model):
    """What an admin action did, and where the log recorded it (null: no log configured)."""

    action: str
    changed: bool
    change_digest: str
    log_index: int | None


class KeyRevoked(ActionResult):
    """A revocation: refused at once here and removed from the keys file; `propagated`
    says whether every replica refuses it too (false: the shared state, Redis, did not
    take it; queued, it is sent when Redis answers again)."""

    propagated: bool = Field(
        description="true: stored in the shared state, every replica refuses the key within "
        "a sync interval; false (202): this replica and the keys file refuse it, other "
        "replicas accept it until Redis is back (it is queued and sent then) or they reload"
    )
    listed: bool = Field(
        default=True,
        description="true: in this host's revoked keys list (state.revocations_file), so "
        "processes started here later refuse it, Redis up or down; false (202): the list "
        "could not take it (full, or not writable): one started while Redis is down "
        "accepts the key if gateway.yaml or a keys file still lists it",
    )
    detail: str | None = Field(default=None, description="what false means, in words")


class KeyRow(_Model):
    tenant: str
    hash_prefix: str = Field(description="the first 12 hex digits of the key's digest")
    revoked: bool = Field(
        description="revoked (refused on every request) though the config still lists it "
        "(inline in gateway.yaml, which a revocation does not edit: remove it there)"
    )


class KeyList(_Model):
    keys: list[KeyRow]


class KeyCreate(_Model):
    # A tenant id's own shape: a caller's other text is refused as a field, never echoed.
    tenant: Identifier


class CreatedKey(ActionResult):
    tenant: str
    key: str = Field(description="the new API key: shown once, only its digest is stored")
    hash: str
