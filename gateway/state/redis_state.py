"""`RedisState`: limits, in-flight counters and revocations shared by every replica.

Imported only when `state.backend` is `redis` (this module imports redis-py). Each
admission is one EVALSHA (`lua.ACQUIRE`: concurrency, requests and tokens checked and
charged atomically), each completion at most one (`lua.RELEASE`). In-flight counters
never touch Redis on the request path: a background sync (`lua.HEARTBEAT`, every
`sync_interval_s`, on its own connection) refreshes this replica's lease, writes its
in-flight counts, reads the other live replicas' sums (handed to `watch_peers`
listeners: routing counts them) and the revocations. A replica that stops syncing loses
its lease after `lease_ttl_s`, and its in-flight counts and concurrency slots stop
counting.

Redis unreachable or slower than `timeout_s`: every call is decided on the local
`Ledger` instead (limits split evenly over the replicas last seen), `healthy` turns
false with a reason, and the sync loop keeps probing; the first sync that succeeds
rewrites this replica's slots in Redis from what it holds, and switches back. Nothing
here raises for Redis trouble; `acquire` raises only `RateLimited`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from gateway.logs import get_logger
from gateway.state import lua
from gateway.state.ledger import CONCURRENCY_RETRY_S, MAX_DEBT_US, Ledger
from gateway.state.redis_keys import _NAME, RedisKeys, _client, _per_tenant, default_replica_id
from gateway.state.types import (
    Admission,
    LimitName,
    PeersListener,
    RateLimited,
    StateStatus,
    TenantLimits,
    TenantUse,
)

__all__ = ["RedisKeys", "RedisState", "default_replica_id"]

_FAILURES = (RedisError, OSError, TimeoutError)
# A reply of the wrong shape (another program's data under our keys, a proxy, a bug):
# the sync treats it as Redis failing, so the loop keeps probing and says why.
_MALFORMED = (ValueError, TypeError, IndexError, KeyError)
_REFUSED: dict[int, LimitName] = {
    1: "concurrent",
    2: "requests_per_minute",
    3: "tokens_per_minute",
}


class RedisState:
    """Shared state on Redis, with the local ledger as the fallback while it is away.

    `start()` before use (one bounded sync, then the background loop), `close()` after."""

    def __init__(
        self,
        url: str,
        *,
        replica_id: str | None = None,
        key_prefix: str = "owngate",
        timeout_s: float = 0.05,
        sync_interval_s: float = 0.1,
        lease_ttl_s: float = 5.0,
        max_connections: int = 16,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        replica = replica_id or default_replica_id()
        if not _NAME.match(replica) or "|" in replica:
            raise ValueError(f"replica id {replica!r} must match {_NAME.pattern}")
        if timeout_s <= 0 or sync_interval_s <= 0 or max_connections < 2:
            raise ValueError("timeouts and intervals must be positive, max_connections >= 2")
        if lease_ttl_s < 3 * sync_interval_s:
            raise ValueError("lease_ttl_s must cover at least three sync intervals")
        self.replica_id = replica
        self._keys = RedisKeys(key_prefix)
        self._timeout_s = timeout_s
        self._interval_s = sync_interval_s
        self._ttl_ms = round(lease_ttl_s * 1000)
        self._sync_timeout_s = max(timeout_s, min(1.0, lease_ttl_s / 3))
        # At most `max_connections` request calls at once, first come first served (an
        # asyncio.Semaphore is fair; redis-py's blocking pool lets late callers barge):
        # a burst queues for a few warm connections rather than opening one each. The
        # sync has connections of its own, so request traffic never starves the lease.
        self._gate = asyncio.Semaphore(max_connections)
        self._client = _client(url, self._sync_timeout_s, replica)
        self._sync_client = _client(url, self._sync_timeout_s, replica + ":sync")
        self._acquire_script = self._client.register_script(lua.ACQUIRE)
        self._release_script = self._client.register_script(lua.RELEASE)
        self._heartbeat_script = self._sync_client.register_script(lua.HEARTBEAT)
        self._revoke_script = self._sync_client.register_script(lua.REVOKE)
        self._leave_script = self._sync_client.register_script(lua.LEAVE)
        self._ledger = Ledger(clock)
        self._inflight: dict[str, int] = {}  # this replica's, exact
        self._others: dict[str, int] = {}  # the other live replicas', as of the last sync
        self._peer_listeners: list[PeersListener] = []
        self._revoked: set[str] = set()
        self._pending: set[str] = set()  # revoked here, not yet stored in Redis
        self._revoked_version = 0
        self._replicas = 1
        self._healthy = False
        self._reason: str | None = "not started"
        self._resync = True  # the next sync rewrites this replica's fields in Redis
        self._beats = 0
        self._resync_every = max(1, round(lease_ttl_s / sync_interval_s))
        self._seq = 0
        self._slots: dict[str, set[str]] = {}  # tenant -> slot fields held here
        self._calls: dict[str, str] = {}  # slot field -> tenant, in a call not yet answered
        self._touched: set[str] = set()  # tenants with slot changes since the last resync
        self._fallbacks = 0
        self._errors = 0
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._log = get_logger("owngate.state")

    # lifecycle

    async def start(self) -> None:
        """Sync once (bounded; Redis down only leaves the state degraded), then keep
        syncing in the background."""
        if self._task is not None:
            return
        await self._sync()
        self._task = asyncio.create_task(self._run(), name=f"owngate-state-{self.replica_id}")
        self._task.add_done_callback(self._sync_stopped)

    def _sync_stopped(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not self._closing:  # a bug: say so, stop trusting Redis
            self._log.error("shared state sync loop crashed", exc_info=exc)
            self._failed("sync loop", exc)

    async def close(self, *, deregister: bool = True) -> None:
        """Stop syncing and close the connections. `deregister` removes this replica's
        lease and counts at once; without it they stay until the lease runs out, as
        after a crash."""
        self._closing = True
        task, self._task = self._task, None
        try:
            if task is not None:
                task.cancel()
                # Bounded: the loop also ends by itself once `_closing` is set.
                await asyncio.wait({task}, timeout=self._sync_timeout_s + self._interval_s)
            if deregister and self._healthy:
                await self._leave()
        finally:
            try:
                await self._client.aclose()
            finally:
                await self._sync_client.aclose()

    async def _leave(self) -> None:
        keys = self._keys
        tenants = sorted(self._slots.keys() | self._touched)
        try:
            async with asyncio.timeout(self._sync_timeout_s):
                await self._leave_script(
                    keys=[keys.leases, keys.inflight, *_per_tenant(keys, tenants)],
                    args=[self.replica_id],
                )
        except _FAILURES as exc:
            self._failed("deregistration", exc, self._sync_timeout_s)

    async def _run(self) -> None:
        while not self._closing:
            await asyncio.sleep(self._interval_s)
            await self._sync()

    # health

    @property
    def healthy(self) -> bool:
        return self._healthy

    @property
    def degraded_reason(self) -> str | None:
        return self._reason

    def tenant_use(self, tenant: str, limits: TenantLimits) -> TenantUse:
        """`tenant`'s use as this replica's ledger holds it: the requests and tokens it
        admitted against its share of the limits, and the slots it holds (the totals
        across replicas are in Redis)."""
        return self._ledger.use(tenant, limits.share(self._replicas))

    def status(self) -> StateStatus:
        return StateStatus(
            backend="redis",
            healthy=self._healthy,
            degraded_reason=self._reason,
            replica=self.replica_id,
            replicas=self._replicas,
            fallbacks=self._fallbacks,
            errors=self._errors,
            pending_revocations=len(self._pending),
        )

    def _failed(self, what: str, exc: BaseException, timeout_s: float | None = None) -> None:
        self._errors += 1
        self._resync = True
        self._set_others({})
        reason = f"redis {what} failed: {_describe(exc, timeout_s or self._timeout_s)}"
        if self._healthy:
            self._log.warning("shared state degraded, using local state", reason=reason)
        self._healthy = False
        self._reason = reason

    def _recovered(self) -> None:
        if not self._healthy:
            self._log.info("shared state on redis", replica=self.replica_id)
        self._healthy = True
        self._reason = None

    # tenant limits

    async def acquire(self, tenant: str, limits: TenantLimits) -> Admission:
        """Admit one request of `tenant` across all replicas or raise `RateLimited`."""
        if limits.unlimited:
            return Admission(None, tenant, limits, held=False, shared=False)
        if not self._healthy:
            return self._admit_locally(tenant, limits)
        # A slot is held (and counted by a resync) from before Redis answers.
        slot = self._take_slot(tenant, calling=True) if limits.concurrent is not None else None
        keys = self._keys
        try:
            reply = await self._call(
                self._acquire_script,
                [
                    keys.leases,
                    keys.slots(tenant),
                    keys.held(tenant),
                    keys.requests(tenant),
                    keys.tokens(tenant),
                ],
                [
                    self.replica_id,
                    self._ttl_ms,
                    limits.concurrent or 0,
                    limits.requests_per_minute or 0,
                    limits.tokens_per_minute or 0,
                    round(CONCURRENCY_RETRY_S * 1_000_000),
                    slot or "",
                ],
            )
        except _FAILURES as exc:
            self._drop_slot(tenant, slot)
            self._failed("admission", exc)
            return self._admit_locally(tenant, limits)
        except asyncio.CancelledError:
            self._drop_slot(tenant, slot)
            self._resync = True  # Redis may have added the slot
            raise
        finally:
            self._end_call(slot)
        code = int(reply[0])
        if code == 1:
            self._ledger.count_request(tenant, limits.share(self._replicas))
            return Admission(self, tenant, limits, held=slot is not None, shared=True, slot=slot)
        self._drop_slot(tenant, slot)
        if code == -1:  # our lease ran out (Redis restarted, or this loop stalled)
            self._resync = True
            return self._admit_locally(tenant, limits)
        which = _REFUSED[int(reply[1])]
        raise RateLimited(tenant, which, limits.value(which) or 0, int(reply[2]) / 1_000_000)

    async def _call(self, script: AsyncScript, keys: list[str], args: list[str | int]) -> Any:
        """One request-path EVALSHA: waiting for a turn and Redis's answer together
        take at most `timeout_s`."""
        async with asyncio.timeout(self._timeout_s), self._gate:
            return await script(keys=keys, args=args)

    def _take_slot(self, tenant: str, *, calling: bool) -> str:
        self._seq += 1
        slot = f"{self.replica_id}|{self._seq}"
        self._slots.setdefault(tenant, set()).add(slot)
        self._touched.add(tenant)
        self._ledger.hold(tenant)
        if calling:
            self._calls[slot] = tenant
        return slot

    def _drop_slot(self, tenant: str, slot: str | None) -> None:
        if slot is None:
            return
        held = self._slots.get(tenant)
        if held is not None:
            held.discard(slot)
            if not held:
                del self._slots[tenant]
        self._touched.add(tenant)
        self._ledger.unhold(tenant)

    def _end_call(self, slot: str | None) -> None:
        if slot is not None:
            self._calls.pop(slot, None)

    def _admit_locally(self, tenant: str, limits: TenantLimits) -> Admission:
        self._fallbacks += 1
        local = limits.share(self._replicas)
        refusal = self._ledger.check(tenant, local)
        if refusal is not None:
            raise refusal
        self._ledger.count_request(tenant, local)
        slot = self._take_slot(tenant, calling=False) if limits.concurrent is not None else None
        return Admission(self, tenant, limits, held=slot is not None, shared=False, slot=slot)

    async def _release(self, admission: Admission, tokens_used: int) -> None:
        tenant, limits, slot = admission.tenant, admission.limits, admission.slot
        self._ledger.charge_tokens(tenant, limits.share(self._replicas), tokens_used)
        self._drop_slot(tenant, slot)  # first: a resync from now on leaves it out
        charge = limits.tokens_per_minute is not None and tokens_used > 0
        if not self._healthy or not (slot or charge):
            if slot is not None:
                self._resync = True  # Redis may hold the slot until the next resync
            return
        keys = self._keys
        if slot is not None:
            self._calls[slot] = tenant
        try:
            await self._call(
                self._release_script,
                [keys.slots(tenant), keys.held(tenant), keys.tokens(tenant)],
                [
                    self.replica_id,
                    slot or "",
                    limits.tokens_per_minute or 0,
                    tokens_used,
                    MAX_DEBT_US,
                ],
            )
        except _FAILURES as exc:
            self._failed("release", exc)
        except asyncio.CancelledError:
            self._resync = True
            raise
        finally:
            self._end_call(slot)

    # in-flight counters

    def backend_started(self, backend_id: str) -> None:
        self._inflight[backend_id] = self._inflight.get(backend_id, 0) + 1

    def backend_finished(self, backend_id: str) -> None:
        self._inflight[backend_id] = max(0, self._inflight.get(backend_id, 0) - 1)

    def inflight(self, backend_id: str) -> int:
        """Requests in flight to the backend from every live replica: this one's now,
        the others' as of the last sync (only this one's while Redis is away)."""
        return self._inflight.get(backend_id, 0) + self._others.get(backend_id, 0)

    def local_inflight(self, backend_id: str) -> int:
        return self._inflight.get(backend_id, 0)

    def watch_peers(self, listener: PeersListener) -> None:
        """Call `listener(others)` whenever the other replicas' in-flight counts per
        backend change: after a sync that read new ones, and with `{}` when Redis goes
        away (routing then counts only this replica's requests)."""
        self._peer_listeners.append(listener)

    def _set_others(self, others: dict[str, int]) -> None:
        if others == self._others:
            return
        self._others = others
        for listener in self._peer_listeners:
            listener(others)

    # revocations

    async def revoke_key(self, key_hash: str) -> bool:
        """Refuse this key on every replica. Applied here at once; True when Redis
        stored it (the others see it within a sync interval), False when Redis is away
        (stored by the first sync that reaches it)."""
        if not key_hash:
            raise ValueError("revoke_key needs a key hash")
        self._revoked.add(key_hash)
        if not self._healthy:
            self._pending.add(key_hash)
            return False
        try:
            async with asyncio.timeout(self._sync_timeout_s):
                await self._revoke_script(
                    keys=[self._keys.revoked, self._keys.revoked_version], args=[key_hash]
                )
        except _FAILURES as exc:
            self._pending.add(key_hash)
            self._failed("revocation", exc, self._sync_timeout_s)
            return False
        return True

    def is_revoked(self, key_hash: str) -> bool:
        """From the local cache: never a Redis call, and a revocation once seen stays."""
        return key_hash in self._revoked

    # the background sync

    async def _sync(self) -> None:
        try:
            async with asyncio.timeout(self._sync_timeout_s):
                await self._heartbeat()
                if not self._healthy:
                    # Idle request connections may predate the outage (a restarted
                    # Redis closed them): drop them rather than fail on each once.
                    await self._client.connection_pool.disconnect(inuse_connections=False)
        except _FAILURES as exc:
            self._failed("sync", exc, self._sync_timeout_s)
            return
        except _MALFORMED as exc:  # never end the loop: revocations would stop arriving
            self._log.error("malformed reply from redis", exc_info=exc)
            self._failed("sync reply", exc, self._sync_timeout_s)
            return
        self._recovered()

    async def _heartbeat(self) -> None:
        self._beats += 1
        if self._beats % self._resync_every == 0:
            self._resync = True  # now and then, whatever happened: cheap, and self-healing
        reply = await self._beat(resync=self._resync)
        if int(reply[0]) == -1:  # our lease had run out: rewrite everything at once
            reply = await self._beat(resync=True)
        self._replicas = max(1, int(reply[1]))
        self._set_others({_text(reply[i]): int(reply[i + 1]) for i in range(4, len(reply), 2)})
        await self._sync_revocations(int(reply[2]), int(reply[3]))

    async def _beat(self, *, resync: bool) -> list[Any]:
        """One HEARTBEAT: the lease, this replica's in-flight counts, and with `resync`
        its concurrency slots exactly as held here."""
        keys = self._keys
        touched = set(self._touched) if resync else set()
        tenants = sorted(self._slots.keys() | touched)
        backends = list(self._inflight.items())
        args: list[str | int] = [self.replica_id, self._ttl_ms, int(resync), len(backends)]
        args += _flat(backends)
        for tenant in tenants:
            held = self._slots.get(tenant, set())
            calls = {slot for slot, owner in self._calls.items() if owner == tenant}
            keep = sorted(held - calls) if resync else []
            skip = sorted(calls) if resync else []  # the call's outcome decides
            args += [len(held), len(keep), *keep, len(skip), *skip]
        if resync:
            self._resync = False
        try:
            reply: list[Any] = await self._heartbeat_script(
                keys=[
                    keys.leases,
                    keys.inflight,
                    keys.revoked,
                    keys.revoked_version,
                    *_per_tenant(keys, tenants),
                ],
                args=args,
            )
        except BaseException:
            self._resync = self._resync or resync
            raise
        if int(reply[0]) == 1:
            self._touched -= touched
        for backend, sent in backends:
            if sent == 0 and self._inflight.get(backend) == 0:
                del self._inflight[backend]
        return reply

    async def _sync_revocations(self, version: int, stored: int) -> None:
        keys = self._keys
        if version != self._revoked_version or stored > len(self._revoked):
            members = await self._sync_client.smembers(keys.revoked)
            self._revoked.update(_text(m) for m in members)
            self._revoked_version = version
            stored = len(members)
        # Ours that Redis lacks: made while it was away, or lost with its data.
        push = set(self._pending)
        if stored < len(self._revoked):
            push |= self._revoked
        if push:
            await self._revoke_script(keys=[keys.revoked, keys.revoked_version], args=sorted(push))
            self._pending -= push


def _flat(pairs: Sequence[tuple[str, int]]) -> list[str | int]:
    return [item for pair in pairs for item in pair]


def _text(value: Any) -> str:
    """A name Redis returned; bytes that are not UTF-8 (not ours) become U+FFFD, which
    matches no key digest or backend id, rather than an error."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _describe(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, TimeoutError) and not str(exc):
        return f"no answer within {timeout_s * 1000:.0f} ms"
    return f"{type(exc).__name__}: {exc}"
