"""Whether Redis is answering, for `RedisState` and `RedisLimits` (redis_state.py,
redis_limits.py), and what its absence has cost so far.

While `healthy` is false every decision is made on the local `Ledger`; `resync` asks the
next sync to rewrite this replica's fields in Redis from what it holds (after a failure,
a cancelled call, or a lost lease); `replicas` is the live count the last sync read,
over which limits are split while Redis is away.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.logs import get_logger
from gateway.state.redis_keys import describe_failure

__all__ = ["RedisHealth"]


class RedisHealth:
    """Redis's health as this replica sees it; `on_failure` runs at each failure."""

    def __init__(self, replica_id: str, timeout_s: float, on_failure: Callable[[], None]) -> None:
        self._replica_id = replica_id
        self._timeout_s = timeout_s
        self._on_failure = on_failure
        self.healthy = False
        self.reason: str | None = "not started"
        self.resync = True  # the next sync rewrites this replica's fields in Redis
        self.replicas = 1
        self.fallbacks = 0
        self.errors = 0
        self._reported = False  # whether Redis was up or down has been logged yet
        self._log = get_logger("owngate.state")

    def failed(self, what: str, exc: BaseException, timeout_s: float | None = None) -> None:
        """A call to Redis failed (`timeout_s`: its bound, if not the request path's)."""
        self.errors += 1
        self.resync = True
        self._on_failure()
        reason = f"redis {what} failed: {describe_failure(exc, timeout_s or self._timeout_s)}"
        # once per outage, the first one included: a replica that never reached Redis
        # (a wrong password, an ACL, Redis down at start) says so too
        if self.healthy or not self._reported:
            self._reported = True
            self._log.warning("shared state degraded, using local state", reason=reason)
        self.healthy = False
        self.reason = reason

    def recovered(self) -> None:
        self._reported = True
        if not self.healthy:
            self._log.info("shared state on redis", replica=self._replica_id)
        self.healthy = True
        self.reason = None
