"""`MemoryState`: shared state for one process (the default; no Redis, no network I/O).

Limits hold in this process alone; under `serve --workers N` each worker enforces its
part of every tenant limit (`TenantLimits.part`: the limit split exactly over the N
workers, so together they never admit more than the limit). In-flight counts are this
process's own; revocations last until the process exits, and with this host's revoked
keys list (`kept`, revocation_keeper.py) are written there and enforced by every process
started on the host later, and by those running (each watches the list: `owngate keys
revoke` reaches them so, whatever lists the key). The keys file stays the source of who
may call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

from gateway.state.ledger import Ledger
from gateway.state.revocation_keeper import KeptRevocations
from gateway.state.types import (
    Admission,
    PeersListener,
    RateLimited,
    StateStatus,
    TenantLimits,
    TenantUse,
)

__all__ = [
    "RESTARTED_ENV",
    "WORKERS_ENV",
    "MemoryState",
    "limit_copies",
    "limit_part",
    "restarted_worker",
    "unsplittable",
]

# Set by `serve --workers N`'s supervisor (gateway/workers.py) in each worker's
# environment: how many processes hold their own `MemoryState`.
WORKERS_ENV = "OWNGATE_WORKERS"
# Set by the supervisor in the environment of a worker it starts again after it died
# (not at a worker's first start): its part of every limit starts spent.
RESTARTED_ENV = "OWNGATE_WORKER_RESTARTED"
# What else the supervisor sets in a worker's environment (gateway/workers.py's
# INDEX_ENV, 1..N, and RUNTIME_ENV; not imported: the state does not load the supervisor).
_WORKER_ENVS = ("OWNGATE_WORKER_INDEX", "OWNGATE_WORKER_RUNTIME_DIR")
# No part of a limit is ever refused for longer: the worker never admits the tenant.
_NO_PART_RETRY_S = 60.0
_MAX_WORKERS_DIGITS = 4  # more workers than 9999 is no supervisor's count


def limit_copies(environ: Mapping[str, str]) -> int:
    """How many processes of `serve --workers N` hold a ledger of their own beside
    this one (itself included): N in a worker, else 1. With `state: memory` they split
    every tenant limit (`limit_part`); on Redis they count as replicas from the start.

    `OWNGATE_WORKERS` is also `serve`'s own default for `--workers`: set in the
    environment of a process the supervisor did not start (`serve --workers 1`, one
    left over), it is no count of this process's peers, which is then 1."""
    if not all(environ.get(name) for name in _WORKER_ENVS):
        return 1
    value = environ.get(WORKERS_ENV, "")
    if not (value.isascii() and value.isdigit() and len(value) <= _MAX_WORKERS_DIGITS):
        return 1
    return max(1, int(value))


def limit_part(environ: Mapping[str, str]) -> int:
    """Which part of each tenant limit this process enforces with `state: memory`: its
    worker index (1..`limit_copies`), 1 for a process that is no worker. An index the
    supervisor never sets counts as the last (the smallest part), never as the whole."""
    copies = limit_copies(environ)
    if copies == 1:
        return 1
    value = environ.get(_WORKER_ENVS[0], "")
    if value.isascii() and value.isdigit() and len(value) <= _MAX_WORKERS_DIGITS:
        index = int(value)
        if 1 <= index <= copies:
            return index
    return copies


def restarted_worker(environ: Mapping[str, str]) -> bool:
    """Whether this process is a worker of `serve --workers N` that the supervisor
    started again after it died: the worker it replaces may have admitted its whole part
    of each limit within the last minute, and that ledger died with it."""
    return limit_copies(environ) > 1 and environ.get(RESTARTED_ENV) == "1"


def unsplittable(tenants: Iterable[tuple[str, TenantLimits]], parts: int) -> list[str]:
    """What refuses a config whose tenant limits cannot be split over `parts` workers
    with `state: memory`, one line per tenant: a limit smaller than the workers would
    leave some worker no part of it (and no split could hold it across them)."""
    problems: list[str] = []
    if parts <= 1:
        return problems
    for tenant, limits in tenants:
        small = limits.too_small(parts)
        if small:
            named = ", ".join(f"{_SETTING[n]} {limits.value(n)}" for n in small)
            problems.append(
                f"tenant {tenant}: {named} is less than the {parts} workers of "
                f"serve --workers {parts}: with state: memory each worker enforces its own "
                "part of a tenant's limits (limit / workers, summing to the limit); set "
                "state: redis to share whole limits across workers, or run fewer workers"
            )
    return problems


_SETTING = {
    "requests_per_minute": "requests_per_minute",
    "tokens_per_minute": "tokens_per_minute",
    "concurrent": "concurrent_requests",
}


class MemoryState:
    """Per-process limits, in-flight counters and revocations. `clock` is monotonic
    seconds, injected so tests drive time. `parts`: the processes that split every
    tenant limit (`limit_copies`), `index` this one's (`limit_part`). `restarted`: a
    worker started again after it died (`restarted_worker`): each tenant's requests and
    tokens budgets start spent, as if the dead worker had used its whole part just now,
    and refill from there (a client that can kill a worker gets no fresh part for it).
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        parts: int = 1,
        index: int = 1,
        restarted: bool = False,
        kept: KeptRevocations | None = None,
    ) -> None:
        self._ledger = Ledger(clock, spent=restarted and parts > 1)
        self._parts = max(1, parts)
        self._index = min(max(index, 1), self._parts)
        self._inflight: dict[str, int] = {}
        self._kept = kept  # this host's revoked keys list, read already: enforced from start
        self._revoked: set[str] = set(kept.known) if kept is not None else set()
        if kept is not None:
            kept.listed = self._revoked.update  # what the list gained since, or holds now

    @property
    def healthy(self) -> bool:
        return True

    @property
    def degraded_reason(self) -> str | None:
        return None

    async def start(self) -> None:
        if self._kept is not None:
            self._kept.watch()

    async def close(self) -> None:
        if self._kept is not None:
            await self._kept.close()

    async def acquire(self, tenant: str, limits: TenantLimits) -> Admission:
        """Admit one request of `tenant` or raise `RateLimited`."""
        if limits.unlimited:
            return Admission(None, tenant, limits, held=False, shared=False)
        local = self._part(tenant, limits)
        held = self._ledger.admit(tenant, local)
        split = self._parts > 1  # a request larger than the part fits no worker's budget
        return Admission(self, tenant, limits, held=held, shared=False, local=local, split=split)

    def _part(self, tenant: str, limits: TenantLimits) -> TenantLimits:
        """This process's part of `limits`, or `RateLimited` when it has none (a limit
        smaller than the workers: refused at start and at a reload, `unsplittable`)."""
        part = limits.part(self._index, self._parts)
        if isinstance(part, TenantLimits):
            return part
        raise RateLimited(tenant, part, 0, _NO_PART_RETRY_S)

    async def _reserve(self, admission: Admission, tokens: int) -> None:
        admission.reserved = self._ledger.reserve(
            admission.tenant, admission.local, tokens, check=True
        )

    async def _release(self, admission: Admission, tokens_used: int) -> None:
        if admission.held:
            self._ledger.unhold(admission.tenant)
        reserved, admission.reserved = admission.reserved, 0
        # at the part it was admitted at (a reload may have changed the limits since)
        self._ledger.settle(admission.tenant, admission.local, reserved, tokens_used)

    def backend_started(self, backend_id: str) -> None:
        self._inflight[backend_id] = self._inflight.get(backend_id, 0) + 1

    def backend_finished(self, backend_id: str) -> None:
        self._inflight[backend_id] = max(0, self._inflight.get(backend_id, 0) - 1)

    def inflight(self, backend_id: str) -> int:
        return self._inflight.get(backend_id, 0)

    def local_inflight(self, backend_id: str) -> int:
        return self._inflight.get(backend_id, 0)

    def watch_peers(self, listener: PeersListener) -> None:
        """No peers, ever: the listener is never called."""

    async def revoke_key(self, key_hash: str, *, share: bool = True) -> bool:
        """Refuse this key from now on (in this process). Returns True: nothing to share."""
        if not key_hash:
            raise ValueError("revoke_key needs a key hash")
        self._revoked.add(key_hash)
        if self._kept is not None:  # processes started on this host later refuse it too
            self._kept.note([key_hash])
            await self._kept.flush()
        return True

    def is_revoked(self, key_hash: str) -> bool:
        return key_hash in self._revoked

    @property
    def revocations_unknown(self) -> str | None:
        """Why this host's revoked keys list could not be read while running, or None."""
        return self._kept.damaged if self._kept is not None else None

    @property
    def revocations(self) -> int:
        return len(self._revoked)  # only ever added to

    def tenant_use(self, tenant: str, limits: TenantLimits) -> TenantUse:
        """`tenant`'s use of `limits` in this process (of its part of them)."""
        part = limits.part(self._index, self._parts)
        return self._ledger.use(tenant, part if isinstance(part, TenantLimits) else limits)

    def status(self) -> StateStatus:
        return StateStatus(
            backend="memory",
            healthy=True,
            degraded_reason=None,
            replica=None,
            replicas=1,
            fallbacks=0,
            errors=0,
            pending_revocations=0,
            unlisted_revocations=self._kept.unwritten if self._kept is not None else 0,
            revocations_list_error=self.revocations_unknown,
            revocations_list_rollbacks=self._kept.rollbacks if self._kept is not None else 0,
            limit_parts=self._parts,
        )
