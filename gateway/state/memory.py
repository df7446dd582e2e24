"""`MemoryState`: shared state for one process (the default; no Redis, no I/O).

Limits hold per process, in-flight counts are this process's own, revocations last
until the process exits (the keys file stays the durable source of who may call).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from gateway.state.ledger import Ledger
from gateway.state.types import (
    Admission,
    PeersListener,
    StateStatus,
    TenantLimits,
    TenantUse,
)

__all__ = ["WORKERS_ENV", "MemoryState", "limit_copies"]

# Set by `serve --workers N`'s supervisor (gateway/workers.py) in each worker's
# environment: how many processes hold their own `MemoryState`.
WORKERS_ENV = "OWNGATE_WORKERS"
# What else the supervisor sets in a worker's environment (gateway/workers.py's
# INDEX_ENV and RUNTIME_ENV; not imported: the state does not load the supervisor).
_WORKER_ENVS = ("OWNGATE_WORKER_INDEX", "OWNGATE_WORKER_RUNTIME_DIR")
_MAX_WORKERS_DIGITS = 4  # more workers than 9999 is no supervisor's count


def limit_copies(environ: Mapping[str, str]) -> int:
    """How many processes each enforce every tenant limit on their own ledger: the
    workers of `serve --workers N` (each admits up to the whole limit), else 1.

    `OWNGATE_WORKERS` is also `serve`'s own default for `--workers`: set in the
    environment of a process the supervisor did not start (`serve --workers 1`, one
    left over), it is no count of this process's copies, which is then 1."""
    if not all(environ.get(name) for name in _WORKER_ENVS):
        return 1
    value = environ.get(WORKERS_ENV, "")
    if not (value.isascii() and value.isdigit() and len(value) <= _MAX_WORKERS_DIGITS):
        return 1
    return max(1, int(value))


class MemoryState:
    """Per-process limits, in-flight counters and revocations. `clock` is monotonic
    seconds, injected so tests drive time."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, copies: int = 1) -> None:
        self._ledger = Ledger(clock)
        self._copies = max(1, copies)  # processes with a ledger of their own (`limit_copies`)
        self._inflight: dict[str, int] = {}
        self._revoked: set[str] = set()

    @property
    def healthy(self) -> bool:
        return True

    @property
    def degraded_reason(self) -> str | None:
        return None

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def acquire(self, tenant: str, limits: TenantLimits) -> Admission:
        """Admit one request of `tenant` or raise `RateLimited`."""
        if limits.unlimited:
            return Admission(None, tenant, limits, held=False, shared=False)
        held = self._ledger.admit(tenant, limits)
        return Admission(self, tenant, limits, held=held, shared=False)

    async def _reserve(self, admission: Admission, tokens: int) -> None:
        admission.reserved = self._ledger.reserve(
            admission.tenant, admission.limits, tokens, check=True
        )

    async def _release(self, admission: Admission, tokens_used: int) -> None:
        if admission.held:
            self._ledger.unhold(admission.tenant)
        reserved, admission.reserved = admission.reserved, 0
        self._ledger.settle(admission.tenant, admission.limits, reserved, tokens_used)

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

    async def revoke_key(self, key_hash: str) -> bool:
        """Refuse this key from now on (in this process). Returns True: nothing to share."""
        if not key_hash:
            raise ValueError("revoke_key needs a key hash")
        self._revoked.add(key_hash)
        return True

    def is_revoked(self, key_hash: str) -> bool:
        return key_hash in self._revoked

    @property
    def revocations(self) -> int:
        return len(self._revoked)  # only ever added to

    def tenant_use(self, tenant: str, limits: TenantLimits) -> TenantUse:
        """`tenant`'s use of `limits` in this process."""
        return self._ledger.use(tenant, limits)

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
            limit_copies=self._copies,
        )
