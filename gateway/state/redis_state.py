"""`RedisState`: limits, in-flight counters and revocations shared by every replica.

Imported only when `state.backend` is `redis` (this module imports redis-py). Each
admission is one EVALSHA (`lua.ACQUIRE`: concurrency, requests and tokens checked and
charged atomically), each completion at most one (`lua.RELEASE`): redis_limits.py, with
the slots it holds in redis_slots.py; revocations: redis_revocations.py; budgets put
back into a Redis that lost them: redis_restore.py. In-flight counters never touch Redis
on the request path: a background sync (`lua.HEARTBEAT`, every `sync_interval_s`, on its
own connection) refreshes this replica's lease, writes its
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

from gateway.logs import get_logger
from gateway.state import lua
from gateway.state.ledger import Ledger
from gateway.state.redis_health import RedisHealth
from gateway.state.redis_keys import (
    _NAME,
    FAILURES,
    MALFORMED,
    RedisKeys,
    _client,
    _per_tenant,
    default_replica_id,
    heartbeat_reply,
    text,
)
from gateway.state.redis_limits import RedisLimits
from gateway.state.redis_replay import UnsharedCharges
from gateway.state.redis_restore import BudgetRestore
from gateway.state.redis_revocations import RevokedKeys
from gateway.state.redis_slots import HeldSlots
from gateway.state.redis_turns import SPARED_S, TURN_WAIT_S
from gateway.state.revocation_keeper import KeptRevocations
from gateway.state.types import Admission, PeersListener, StateStatus, TenantLimits, TenantUse

__all__ = ["RedisKeys", "RedisState", "default_replica_id"]


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
        workers: int = 1,
        kept: KeptRevocations | None = None,
        turn_wait_s: float = TURN_WAIT_S,
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
        self._interval_s = sync_interval_s
        self._ttl_ms = round(lease_ttl_s * 1000)
        self._sync_timeout_s = max(timeout_s, min(1.0, lease_ttl_s / 3))
        self._client = _client(url, self._sync_timeout_s + 2 * SPARED_S, replica)
        self._sync_client = _client(url, self._sync_timeout_s, replica + ":sync")
        self._heartbeat_script = self._sync_client.register_script(lua.HEARTBEAT)
        self._leave_script = self._sync_client.register_script(lua.LEAVE)
        self._clock = clock
        self._ledger = Ledger(clock)
        self._slots = HeldSlots(replica, self._ledger)
        self._health = RedisHealth(replica, timeout_s, on_failure=lambda: self._set_others({}))
        # The workers of `serve --workers N` are N replicas from the start: one that never
        # reached Redis (down at start) splits each limit over them, not only itself.
        self._workers = max(1, workers)
        self._health.replicas = self._workers
        self._unshared = UnsharedCharges(self._sync_client, clock)  # sent by the sync
        self._limits = RedisLimits(
            self._client,
            self._keys,
            self._health,
            self._ledger,
            self._slots,
            self._unshared,
            replica_id=replica,
            timeout_s=timeout_s,
            ttl_ms=self._ttl_ms,
            max_connections=max_connections,
            turn_wait_s=turn_wait_s,
        )
        self._inflight: dict[str, int] = {}  # this replica's, exact
        self._others: dict[str, int] = {}  # the other live replicas', as of the last sync
        self._peer_listeners: list[PeersListener] = []
        # This host's revoked keys list (`kept`, read already): enforced from the start,
        # Redis up or down, and given each revocation made or learned here.
        # What a sync learns is enforced once the list holds it (redis_revocations.py).
        self._kept = kept
        known = kept.known if kept is not None else ()
        self._revocations = RevokedKeys(
            self._keys, self._sync_client, self._sync_timeout_s, known, hold=kept is not None
        )
        if kept is not None:
            kept.listed = self._revocations.listed
        self._beats = 0
        self._resync_every = max(1, round(lease_ttl_s / sync_interval_s))
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._leased = False  # a HEARTBEAT has given this replica a lease
        self._restore_run = BudgetRestore(self._keys, self._sync_client, replica, clock)
        self.restore_batch = lua.RESTORE_BATCH  # the most rate keys one RESTORE call sends
        self._log = get_logger("owngate.state")

    # lifecycle

    async def start(self) -> None:
        """Sync once (bounded; Redis down only leaves the state degraded), then keep
        syncing in the background."""
        if self._task is not None:
            return
        await self._sync()
        if self._kept is not None:
            await self._kept.flush()  # what the first sync learned
            self._kept.watch()  # what other processes here write to the list
        self._task = asyncio.create_task(self._run(), name=f"owngate-state-{self.replica_id}")
        self._task.add_done_callback(self._sync_stopped)

    def _sync_stopped(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not self._closing:  # a bug: say so, stop trusting Redis
            self._log.error("shared state sync loop crashed", exc_info=exc)
            self._health.failed("sync loop", exc)

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
            if deregister and self._health.healthy:
                await self._leave()
            if self._kept is not None:
                await self._kept.close()  # what was learned last outlives the process
        finally:
            try:
                await self._client.aclose()
            finally:
                await self._sync_client.aclose()

    async def _leave(self) -> None:
        keys = self._keys
        tenants = self._slots.tenants()
        try:
            async with asyncio.timeout(self._sync_timeout_s):
                await self._unshared.send()  # decided here since the last sync (a release cut)
                await self._leave_script(
                    keys=[keys.leases, keys.inflight, *_per_tenant(keys, tenants)],
                    args=[self.replica_id],
                )
        except (*FAILURES, *MALFORMED) as exc:
            self._health.failed("deregistration", exc, self._sync_timeout_s)

    async def _run(self) -> None:
        while not self._closing:
            await asyncio.sleep(self._interval_s)
            await self._sync()
            if self._kept is not None:
                self._kept.flush_soon()

    # health

    @property
    def healthy(self) -> bool:
        return self._health.healthy

    @property
    def degraded_reason(self) -> str | None:
        return self._health.reason

    def tenant_use(self, tenant: str, limits: TenantLimits) -> TenantUse:
        """`tenant`'s use as this replica's ledger holds it: the requests and tokens it
        admitted against its share of the limits, and the slots it holds (the totals
        across replicas are in Redis)."""
        return self._ledger.use(tenant, limits.share(self._health.replicas))

    def status(self) -> StateStatus:
        return StateStatus(
            backend="redis",
            healthy=self._health.healthy,
            degraded_reason=self._health.reason,
            replica=self.replica_id,
            replicas=self._health.replicas,
            fallbacks=self._health.fallbacks,
            errors=self._health.errors,
            pending_revocations=self._revocations.pending,
            unlisted_revocations=self._kept.unwritten if self._kept is not None else 0,
            revocations_list_error=self.revocations_unknown,
            revocations_list_rollbacks=self._kept.rollbacks if self._kept is not None else 0,
            restores=self._restore_run.restores,
        )

    async def acquire(self, tenant: str, limits: TenantLimits) -> Admission:
        """Admit one request of `tenant` across all replicas or raise `RateLimited`."""
        return await self._limits.acquire(tenant, limits)

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

    async def revoke_key(self, key_hash: str, *, share: bool = True) -> bool:
        """Refuse this key on every replica. Applied here at once; True when Redis
        stored it (the others see it within a sync interval), False when Redis is away
        (stored by the first sync that reaches it). `share=False` leaves it to that sync
        without trying Redis now (what the admin record, written first, said)."""
        try:
            healthy = share and self._health.healthy
            shared = await self._revocations.revoke(key_hash, healthy=healthy)
        except FAILURES as exc:
            self._health.failed("revocation", exc, self._sync_timeout_s)
            shared = False
        if self._kept is not None:  # this host's list, Redis or not
            self._kept.note([key_hash])
            await self._kept.flush()
        return shared

    @property
    def revocations_unknown(self) -> str | None:
        """Why this host's revoked keys list could not be read while running (None: it
        was): what it holds may be unknown here (gateway/api/tenant_auth.py refuses)."""
        return self._kept.damaged if self._kept is not None else None

    def is_revoked(self, key_hash: str) -> bool:
        """From the local cache: never a Redis call, and a revocation once seen stays."""
        return self._revocations.is_revoked(key_hash)

    @property
    def revocations(self) -> int:
        return self._revocations.seen

    # the background sync

    async def _sync(self) -> None:
        try:
            await self._sync_once()
        finally:  # what a sync read is written (then enforced), even if it failed after
            if self._kept is not None and self._revocations.held:
                self._kept.note(self._revocations.holding())

    async def _sync_once(self) -> None:
        try:
            async with asyncio.timeout(self._sync_timeout_s):
                await self._heartbeat()
                if not self._health.healthy:
                    # Idle request connections may predate the outage (a restarted
                    # Redis closed them): drop them rather than fail on each once.
                    await self._client.connection_pool.disconnect(inuse_connections=False)
        except FAILURES as exc:
            self._health.failed("sync", exc, self._sync_timeout_s)
            return
        except MALFORMED as exc:  # never end the loop: revocations would stop arriving
            self._log.error("malformed reply from redis", exc_info=exc)
            self._health.failed("sync reply", exc, self._sync_timeout_s)
            return
        self._health.recovered()

    async def _heartbeat(self) -> None:
        self._beats += 1
        if self._beats % self._resync_every == 0:
            # now and then, whatever happened: cheap, and self-healing
            self._health.resync = True
        if self._health.resync:  # the lease may be gone: a resync would renew it
            await self._restore()
        reply = await self._beat(resync=self._health.resync)
        # -1: our lease had run out: rewrite everything at once; -2: Redis lost its data
        # again after the restore (before the lease was renewed): restore into it again
        if int(reply[0]) < 0:
            await self._restore()
            reply = await self._beat(resync=True)
            if int(reply[0]) < 0:  # and yet again: no lease, the next sync tries again
                self._health.resync = True
                return
        self._health.replicas = max(self._workers, int(reply[1]))
        self._set_others({text(reply[i]): int(reply[i + 1]) for i in range(4, len(reply), 2)})
        # What it learns is noted for this host's list by `_sync`, the sync failing or not.
        await self._revocations.sync(int(reply[2]), int(reply[3]), reread=reply[0] == 1)
        await self._unshared.send()  # before it turns healthy: what it decided locally

    async def _restore(self) -> None:
        """Before a resync renews the lease: put back the budget use this replica's
        ledger holds if the lease is gone (redis_restore.py)."""
        unshared = self._unshared.backlogs()  # a restore that adds puts them back too
        keys, backlogs = self._limits.backlogs()
        if await self._restore_run.restore(
            keys, backlogs, batch=self.restore_batch, leased=self._leased
        ):
            self._unshared.given(unshared)

    async def _beat(self, *, resync: bool) -> list[Any]:
        """One HEARTBEAT: the lease, this replica's in-flight counts, and with `resync`
        its concurrency slots exactly as held here."""
        keys = self._keys
        tenants, touched, slot_args = self._slots.heartbeat(resync=resync)
        backends = list(self._inflight.items())
        args: list[str | int] = [
            self.replica_id,
            self._ttl_ms,
            int(resync),
            self._restore_run.epoch,  # a resync's RESTORE answered it just before
            len(backends),
        ]
        args += _flat(backends)
        args += slot_args
        if resync:
            self._health.resync = False
        try:
            reply: list[Any] = await self._heartbeat_script(
                keys=[
                    keys.leases,
                    keys.inflight,
                    keys.revoked,
                    keys.revoked_version,
                    keys.epoch,
                    *_per_tenant(keys, tenants),
                ],
                args=args,
            )
            reply = heartbeat_reply(reply)
        except BaseException:
            self._health.resync = self._health.resync or resync
            raise
        if int(reply[0]) < 0:  # no lease renewed (lua.HEARTBEAT)
            return reply
        self._leased = True
        if int(reply[0]) == 1:
            self._slots.settled(touched)
        for backend, sent in backends:
            if sent == 0 and self._inflight.get(backend) == 0:
                del self._inflight[backend]
        return reply


def _flat(pairs: Sequence[tuple[str, int]]) -> list[str | int]:
    return [item for pair in pairs for item in pair]
