"""The vocabulary of shared state: tenant limits, the 429 it raises, admissions, status.

Both implementations (`MemoryState`, `RedisState`) speak it; the request path only
ever sees these types, never Redis.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = [
    "Admission",
    "LimitName",
    "PeersListener",
    "RateLimited",
    "SharedState",
    "StateStatus",
    "TenantLimits",
    "TenantUse",
]

LimitName = Literal["requests_per_minute", "tokens_per_minute", "concurrent"]

_DESCRIBED: dict[LimitName, str] = {
    "requests_per_minute": "requests per min (RPM)",
    "tokens_per_minute": "tokens per min (TPM)",
    "concurrent": "concurrent requests",
}


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """A tenant's limits; None means unlimited. Enforced by one process with
    `MemoryState` (each worker of `serve --workers N` its `part`), across every replica
    with `RedisState`."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    concurrent: int | None = None

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute", "concurrent"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be a positive integer or None, not {value}")

    @property
    def unlimited(self) -> bool:
        return (
            self.requests_per_minute is None
            and self.tokens_per_minute is None
            and self.concurrent is None
        )

    def value(self, name: LimitName) -> int | None:
        limit: int | None = getattr(self, name)
        return limit

    def share(self, replicas: int) -> TenantLimits:
        """This replica's part of a global limit split over `replicas` (rounded up):
        what it enforces alone while Redis is unreachable."""
        if replicas <= 1:
            return self
        return TenantLimits(
            _split(self.requests_per_minute, replicas),
            _split(self.tokens_per_minute, replicas),
            _split(self.concurrent, replicas),
        )

    def part(self, index: int, parts: int) -> TenantLimits | LimitName:
        """Process `index`'s (1..`parts`) part of each limit split exactly over `parts`
        processes that share nothing (`serve --workers N` with `state: memory`): the
        limit divided by `parts`, rounded down, one more for the first `limit % parts`,
        so the parts sum to the limit, never past it. Returns the name of a limit smaller
        than `parts` instead (this process's part of it would be nothing: `too_small`)."""
        if parts <= 1:
            return self
        small = self.too_small(parts)
        if small:
            return small[0]
        index = min(max(index, 1), parts)
        return TenantLimits(
            _part(self.requests_per_minute, index, parts),
            _part(self.tokens_per_minute, index, parts),
            _part(self.concurrent, index, parts),
        )

    def too_small(self, parts: int) -> list[LimitName]:
        """The limits smaller than `parts`: split over that many processes, some would
        get no part of them."""
        names: tuple[LimitName, ...] = ("requests_per_minute", "tokens_per_minute", "concurrent")
        return [n for n in names if (v := self.value(n)) is not None and v < parts]


def _split(limit: int | None, parts: int) -> int | None:
    return None if limit is None else max(1, math.ceil(limit / parts))


def _part(limit: int | None, index: int, parts: int) -> int | None:
    if limit is None:
        return None
    return limit // parts + (1 if index <= limit % parts else 0)


class RateLimited(Exception):
    """A tenant is over one of its limits: answer 429 with `retry-after`.

    `limit` names the limit that keeps the request out longest; `retry_after_s` is when
    it would fit (for `concurrent`, a hint: a slot frees when some request ends)."""

    def __init__(self, tenant: str, limit: LimitName, value: int, retry_after_s: float) -> None:
        self.tenant = tenant
        self.limit: LimitName = limit
        self.value = value
        self.retry_after_s = max(retry_after_s, 0.001)
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return (
            f"Rate limit reached for tenant {self.tenant} on {_DESCRIBED[self.limit]}: "
            f"Limit {self.value}. Please try again in {_human_seconds(self.retry_after_s)}."
        )

    @property
    def retry_after_header(self) -> bytes:
        """The `retry-after` value: whole seconds, rounded up, at least 1."""
        return str(max(1, math.ceil(self.retry_after_s))).encode()

    @property
    def error_type(self) -> str:
        """OpenAI's error `type` for this limit: `tokens` for TPM, else `requests`."""
        return "tokens" if self.limit == "tokens_per_minute" else "requests"

    def __repr__(self) -> str:
        return f"RateLimited({self.tenant!r}, {self.limit}, retry_after_s={self.retry_after_s:.3f})"


def _human_seconds(seconds: float) -> str:
    return f"{seconds * 1000:.0f}ms" if seconds < 1 else f"{seconds:.3g}s"


class _Releaser(Protocol):
    async def _reserve(self, admission: Admission, tokens: int) -> None: ...

    async def _release(self, admission: Admission, tokens_used: int) -> None: ...


class Admission:
    """One admitted request. Once its body is read, `reserve(tokens)` what it may use of
    the tenant's tokens-per-minute budget (raises `RateLimited` when that does not fit;
    the request its admission charged of `requests_per_minute` stays charged). Call
    `release(tokens_used)` exactly when it ends (any outcome): it frees the concurrency
    slot and replaces the reservation by the tokens charged (0: a refund). Releasing
    twice is a no-op."""

    __slots__ = (
        "_released",
        "_releaser",
        "held",
        "limits",
        "local",
        "reserved",
        "reserved_shared",
        "shared",
        "slot",
        "split",
        "tenant",
    )

    def __init__(
        self,
        releaser: _Releaser | None,
        tenant: str,
        limits: TenantLimits,
        *,
        held: bool,
        shared: bool,
        slot: str | None = None,
        local: TenantLimits | None = None,
        split: bool = False,
    ) -> None:
        self._releaser = releaser
        self._released = False
        self.tenant = tenant
        self.limits = limits
        # What this process's ledger holds the request to, from admission to release:
        # on Redis, this replica's share of `limits` when it was admitted (a share taken
        # again later, once the replicas changed, would settle at another rate).
        self.local = limits if local is None else local
        # `local` is this process's part of `limits`, enforced with nothing shared
        # (`serve --workers N`, `state: memory`): no other process takes what it cannot.
        self.split = split
        self.held = held  # counted against the concurrency limit
        self.shared = shared  # admitted by Redis, not decided on local state
        self.slot = slot  # the implementation's name for the held slot, if any
        self.reserved = 0  # tokens reserved on the local ledger (decided or mirrored)
        self.reserved_shared = 0  # tokens reserved on Redis, for every replica

    @property
    def released(self) -> bool:
        return self._released

    @property
    def request_budget(self) -> int | None:
        """The tokens per minute a request's own answer limit must fit (else it never
        fits): the tenant's `tokens_per_minute`, or this process's part of it when the
        part is all it may use (`split`)."""
        return self.local.tokens_per_minute if self.split else self.limits.tokens_per_minute

    async def reserve(self, tokens: int) -> None:
        """Reserve `tokens` of the tenant's tokens-per-minute budget until `release`
        (once; at most the whole budget is reserved). Raises `RateLimited` when they do
        not fit now (the admission's request stays charged: the body was read and parsed);
        does nothing without a tokens limit or once released."""
        if self._released or self._releaser is None or self.reserved or self.reserved_shared:
            return
        if self.limits.tokens_per_minute is not None and tokens > 0:
            await self._releaser._reserve(self, tokens)

    async def release(self, tokens_used: int = 0) -> None:
        if self._released:
            return
        self._released = True
        if self._releaser is not None:
            await self._releaser._release(self, max(0, tokens_used))


@dataclass(frozen=True, slots=True)
class TenantUse:
    """A tenant's current use of its limits (None: that limit is not set, so no use is
    kept): requests and tokens within the last minute's window (reservations included),
    slots held, tokens reserved by requests in flight."""

    inflight: int | None
    requests: int | None
    tokens: int | None
    reserved: int | None = None


@dataclass(frozen=True, slots=True)
class StateStatus:
    """What the readiness detail and the metrics report about shared state."""

    backend: Literal["memory", "redis"]
    healthy: bool
    degraded_reason: str | None
    replica: str | None
    replicas: int  # live replicas seen at the last sync (this one included)
    fallbacks: int  # calls decided on local state because Redis was unavailable
    errors: int  # Redis calls that failed or timed out
    pending_revocations: int  # revocations made here that Redis has not stored yet
    # revocations made or learned here that this host's revoked keys list does not hold
    # (its write failed: full, unwritable): a process started here without Redis misses them
    unlisted_revocations: int = 0
    # why this host's list could not be read while running (tenant requests refused)
    revocations_list_error: str | None = None
    # looks that found this host's list lacking revocations it held (written back)
    revocations_list_rollbacks: int = 0
    restores: int = 0  # times this replica put its budget use back (its lease was gone)
    # processes each enforcing every tenant limit in full on their own ledger (a tenant
    # may get up to this many times its limits): always 1 (workers split them: below)
    limit_copies: int = 1
    # processes each enforcing its own part of every tenant limit (the parts sum to the
    # limit): N for memory under `serve --workers N`, else 1
    limit_parts: int = 1

    def detail(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "healthy": self.healthy,
            "degraded_reason": self.degraded_reason,
            "replica": self.replica,
            "replicas": self.replicas,
            "fallbacks": self.fallbacks,
            "errors": self.errors,
            "pending_revocations": self.pending_revocations,
            "unlisted_revocations": self.unlisted_revocations,
            "revocations_list_error": self.revocations_list_error,
            "revocations_list_rollbacks": self.revocations_list_rollbacks,
            "restores": self.restores,
            "limit_copies": self.limit_copies,
            "limit_parts": self.limit_parts,
        }


# Called after every sync with the other live replicas' in-flight requests per backend
# (empty while the store is unreachable: routing then counts this replica's alone).
PeersListener = Callable[[Mapping[str, int]], None]


class SharedState(Protocol):
    """Limits, in-flight counters and revocations, per process or across replicas.

    No method raises for an unreachable store: `RedisState` falls back to local state
    and reports itself degraded. `acquire` raises only `RateLimited`."""

    @property
    def healthy(self) -> bool: ...

    @property
    def degraded_reason(self) -> str | None: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def acquire(self, tenant: str, limits: TenantLimits) -> Admission: ...

    def backend_started(self, backend_id: str) -> None: ...

    def backend_finished(self, backend_id: str) -> None: ...

    def inflight(self, backend_id: str) -> int: ...

    def local_inflight(self, backend_id: str) -> int: ...

    def watch_peers(self, listener: PeersListener) -> None: ...

    async def revoke_key(self, key_hash: str, *, share: bool = True) -> bool:
        """Refuse the key here at once; True when every replica will (stored in the
        shared store, or none to tell). `share=False`: not sent now, but queued for the
        next sync that reaches the store (the caller already said it would not be)."""
        ...

    def is_revoked(self, key_hash: str) -> bool: ...

    @property
    def revocations_unknown(self) -> str | None:
        """Why this host's revoked keys list, read again as it changes, could not be
        read while running (damaged, unreadable): the revocations it holds may be unknown
        here, so tenant requests are refused (503) until it is read. None: it was."""
        ...

    @property
    def revocations(self) -> int:
        """How many key digests this process refuses: it grows with each revocation seen
        here and never shrinks (one seen stays), so a request that found its key standing
        asks `is_revoked` again only when it moved (gateway/api/standing.py)."""
        ...

    def status(self) -> StateStatus: ...

    def tenant_use(self, tenant: str, limits: TenantLimits) -> TenantUse: ...
