"""Tenant limits across replicas on Redis, for `RedisState` (redis_state.py).

Each admission is one EVALSHA (`lua.ACQUIRE`: concurrency, requests and tokens checked
and charged atomically), its token reservation one (`lua.RESERVE`, for a tenant with a
tokens limit; a refused reservation charges nothing more and gives nothing back), each
completion at most one (`lua.RELEASE`: the slot freed, the reservation replaced by the
tokens used), each answered within `timeout_s` once sent. Waiting for one of the
request connections is not Redis failing: a tenant's calls take turns (redis_turns.py),
and an admission or reservation that gets none in time is refused (429) without
degrading anything or being decided elsewhere. Every
admission, reservation and settlement is mirrored on the local ledger, so a fallback
starts from this replica's recent use. With Redis away or failing the call, the local
`Ledger` decides instead, over this replica's share of each limit
(`RedisHealth.replicas`), the share the admission was given (`Admission.local`) from
admission to release, and each such charge is put into Redis by the first sync that
reaches it (redis_replay.py). Only `RateLimited` is raised.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from gateway.state import lua
from gateway.state.ledger import (
    CONCURRENCY_RETRY_S,
    MAX_DEBT_US,
    Ledger,
    request_interval_us,
    tokens_cost_us,
)
from gateway.state.redis_health import RedisHealth
from gateway.state.redis_keys import FAILURES, MALFORMED, RedisKeys, replied
from gateway.state.redis_replay import UnsharedCharges
from gateway.state.redis_slots import HeldSlots
from gateway.state.redis_turns import (
    TURN_WAIT_S,
    NoTurn,
    TooManyWaiting,
    Turns,
    answered_within,
)
from gateway.state.types import Admission, LimitName, RateLimited, TenantLimits

__all__ = ["RedisLimits"]

_REFUSED: dict[int, LimitName] = {
    1: "concurrent",
    2: "requests_per_minute",
    3: "tokens_per_minute",
}


class RedisLimits:
    """Admits requests against tenant limits shared by every replica (the `Admission`'s
    releaser: its `release` comes back here)."""

    def __init__(
        self,
        client: Redis,
        keys: RedisKeys,
        health: RedisHealth,
        ledger: Ledger,
        slots: HeldSlots,
        unshared: UnsharedCharges,
        *,
        replica_id: str,
        timeout_s: float,
        ttl_ms: int,
        max_connections: int,
        turn_wait_s: float = TURN_WAIT_S,
    ) -> None:
        self._keys = keys
        self._health = health
        self._ledger = ledger
        self._slots = slots
        self._unshared = unshared  # what it decides locally, for Redis later
        self._replica_id = replica_id
        self._timeout_s = timeout_s
        self._ttl_ms = ttl_ms
        # At most `max_connections` request calls at once, half of them one tenant's: a
        # burst queues for a few warm connections rather than opening one each, behind
        # its own tenant's calls. The sync has connections of its own, so request
        # traffic never starves the lease.
        self._turns = Turns(max_connections)
        self._turn_wait_s = turn_wait_s
        self._acquire_script = client.register_script(lua.ACQUIRE)
        self._reserve_script = client.register_script(lua.RESERVE)
        self._release_script = client.register_script(lua.RELEASE)
        # Each rate-limited tenant's limits, as of its last admission: whose budgets
        # `backlogs` reads (tenants come from the config only).
        self._rated: dict[str, TenantLimits] = {}
        # Per tenant, the admissions and the tokens in Redis calls sent and not answered
        # yet: a decision made here meanwhile (Redis failed another call) counts them as
        # charged, as Redis may have charged them (the ledger mirrors only answers).
        # Calls still waiting for a turn were sent nowhere: they do not count.
        self._pending: dict[str, list[int]] = {}

    async def acquire(self, tenant: str, limits: TenantLimits) -> Admission:
        """Admit one request of `tenant` across all replicas or raise `RateLimited`."""
        if limits.unlimited:
            return Admission(None, tenant, limits, held=False, shared=False)
        if limits.requests_per_minute is not None or limits.tokens_per_minute is not None:
            self._rated[tenant] = limits
        if not self._health.healthy:
            return self._admit_locally(tenant, limits)
        # A slot is held (and counted by a resync) from before Redis answers.
        slot = self._slots.take(tenant, calling=True) if limits.concurrent is not None else None
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
                    self._replica_id,
                    self._ttl_ms,
                    limits.concurrent or 0,
                    limits.requests_per_minute or 0,
                    limits.tokens_per_minute or 0,
                    round(CONCURRENCY_RETRY_S * 1_000_000),
                    slot or "",
                ],
                tenant=tenant,
                pending=(1, 0),
            )
            # [1] admitted, [-1] no lease, [0, limit, wait µs] refused (lua.ACQUIRE)
            reply = replied("admission", reply, (1,), (-1,), (0, None, None))
            if reply[0] == 0 and (reply[1] not in _REFUSED or reply[2] < 0):
                raise ValueError("malformed admission reply from redis (a refusal)")
        except _Away:  # Redis failed another call while this one waited for its turn
            self._slots.drop(tenant, slot)  # never sent
            return self._admit_locally(tenant, limits)
        except NoTurn:  # never sent: nothing to undo in Redis, nothing failed there
            self._slots.drop(tenant, slot)
            raise TooManyWaiting(tenant, self._turns.per_tenant) from None
        except (*FAILURES, *MALFORMED) as exc:
            # Redis may have added the slot (a garbage reply may come from a script
            # that ran): the resync this failure asks for rewrites it as held here.
            self._slots.drop(tenant, slot)
            self._health.failed("admission", exc)
            return self._admit_locally(tenant, limits)
        except BaseException:  # cancelled, or an error of no class above (a fault)
            self._slots.drop(tenant, slot)  # never held for good
            self._health.resync = True  # Redis may have added the slot
            raise
        finally:
            self._slots.end_call(slot)
        code = reply[0]
        if code == 1:
            local = limits.share(self._health.replicas)
            self._ledger.count_request(tenant, local, limits)
            held = slot is not None
            return Admission(self, tenant, limits, held=held, shared=True, slot=slot, local=local)
        self._slots.drop(tenant, slot)
        if code == -1:  # our lease ran out (Redis restarted, or this loop stalled)
            self._health.resync = True
            return self._admit_locally(tenant, limits)
        which = _REFUSED[reply[1]]
        raise RateLimited(tenant, which, limits.value(which) or 0, reply[2] / 1_000_000)

    def backlogs(self) -> tuple[list[str], list[int]]:
        """The rate keys of the tenants this replica admitted, and how far each budget
        runs ahead of now on this replica's ledger, counted at the global limits (for
        `lua.RESTORE`: Redis lost the keys, or might have). Tenants whose budgets are
        whole are forgotten until their next admission."""
        keys: list[str] = []
        backlogs: list[int] = []
        for tenant, limits in list(self._rated.items()):
            requests_us, tokens_us = self._ledger.backlog_us(tenant)
            if requests_us == 0 and tokens_us == 0:
                del self._rated[tenant]
                continue
            if limits.requests_per_minute is not None and requests_us > 0:
                keys.append(self._keys.requests(tenant))
                backlogs.append(requests_us)  # counted at the global limit's interval
            if limits.tokens_per_minute is not None and tokens_us > 0:
                keys.append(self._keys.tokens(tenant))
                backlogs.append(tokens_us)
        return keys, backlogs

    async def _call(
        self,
        script: AsyncScript,
        keys: list[str],
        args: list[str | int],
        *,
        tenant: str,
        pending: tuple[int, int] = (0, 0),
        bounded: bool = True,
    ) -> Any:
        """One request-path EVALSHA of `tenant`'s, counted as `pending` (requests,
        tokens) from when it is sent until it ended, however it ends. It waits for a turn
        at most `turn_wait_s` (not `bounded`: as long as it takes), then
        Redis answers within `timeout_s` (or it failed). Raises `NoTurn` when no turn came
        in time, `_Away` when Redis failed meanwhile (the state is degraded now:
        decide locally, as a call made then would have)."""
        async with self._turns.turn(tenant, self._turn_wait_s if bounded else None):
            if not self._health.healthy:
                raise _Away
            self._pend(tenant, *pending)
            try:
                async with answered_within(self._timeout_s):
                    return await script(keys=keys, args=args)
            finally:  # however the call ended: a local decision must not count it
                self._pend(tenant, -pending[0], -pending[1])

    def _pend(self, tenant: str, requests: int, tokens: int) -> None:
        pending = self._pending.setdefault(tenant, [0, 0])
        pending[0] += requests
        pending[1] += tokens
        if pending == [0, 0]:
            del self._pending[tenant]

    def _pending_of(self, tenant: str) -> tuple[int, int]:
        pending = self._pending.get(tenant)
        return (0, 0) if pending is None else (pending[0], pending[1])

    def _admit_locally(self, tenant: str, limits: TenantLimits) -> Admission:
        self._health.fallbacks += 1
        local = limits.share(self._health.replicas)
        refusal = self._ledger.check(tenant, local, self._pending_of(tenant))
        if refusal is not None:
            raise refusal
        self._ledger.count_request(tenant, local, limits)
        if limits.requests_per_minute is not None:
            cost = request_interval_us(limits.requests_per_minute)
            self._unshared.add(self._keys.requests(tenant), cost)
        slot = self._slots.take(tenant, calling=False) if limits.concurrent is not None else None
        held = slot is not None
        return Admission(self, tenant, limits, held=held, shared=False, slot=slot, local=local)

    async def _reserve(self, admission: Admission, tokens: int) -> None:
        """Reserve `tokens` of the tenant's tokens budget on Redis (or locally, over this
        replica's share, while it is away) or raise `RateLimited`."""
        tenant, limits, local = admission.tenant, admission.limits, admission.local
        tpm = limits.tokens_per_minute or 0
        tokens = min(tokens, tpm)
        if self._health.healthy:
            try:
                reply = await self._call(
                    self._reserve_script,
                    [self._keys.tokens(tenant)],
                    [tpm, tokens, MAX_DEBT_US],
                    tenant=tenant,
                    pending=(0, tokens),
                )
                # [1] reserved, [0, over µs] refused (lua.RESERVE)
                reply = replied("reservation", reply, (1,), (0, None))
                if reply[0] == 0 and reply[1] < 0:
                    raise ValueError("malformed reservation reply from redis (a refusal)")
            except _Away:
                pass  # decided locally, below
            except NoTurn:  # never sent: the request's admission stays charged
                raise TooManyWaiting(tenant, self._turns.per_tenant) from None
            except (*FAILURES, *MALFORMED) as exc:
                # Redis may have taken it: it ages out there, it is never refunded.
                self._health.failed("reservation", exc)
            else:
                if reply[0] != 1:
                    raise RateLimited(tenant, "tokens_per_minute", tpm, reply[1] / 1e6)
                admission.reserved_shared = tokens
                admission.reserved = self._ledger.reserve(
                    tenant, local, tokens, check=False, whole=limits
                )
                return
        self._health.fallbacks += 1
        # Over the share: a reservation of the whole share waits for a full local budget.
        admission.reserved = self._ledger.reserve(
            tenant, local, tokens, check=True, whole=limits, pending=self._pending_of(tenant)[1]
        )
        self._unshared.add(self._keys.tokens(tenant), tokens_cost_us(admission.reserved, tpm))

    async def _release(self, admission: Admission, tokens_used: int) -> None:
        tenant, limits, slot = admission.tenant, admission.limits, admission.slot
        reserved, admission.reserved = admission.reserved, 0
        shared, admission.reserved_shared = admission.reserved_shared, 0
        # A reservation made locally reaches Redis too (redis_replay.py): settled alike.
        shared = shared or reserved
        # at the share it was reserved at: the replicas may have changed since
        self._ledger.settle(tenant, admission.local, reserved, tokens_used, limits)
        self._slots.drop(tenant, slot)  # first: a resync from now on leaves it out
        charge = limits.tokens_per_minute is not None and (tokens_used > 0 or shared > 0)
        if not self._health.healthy or not (slot or charge):
            if slot is not None:
                self._health.resync = True  # Redis may hold the slot until the next resync
            # A reservation Redis holds stays there until it ages out (within a minute);
            # what was used past it is charged there once Redis answers.
            self._unreached(admission, shared, tokens_used)
            return
        keys = self._keys
        if slot is not None:
            self._slots.calling(slot, tenant)
        try:
            await self._call(
                self._release_script,
                [keys.slots(tenant), keys.held(tenant), keys.tokens(tenant)],
                [
                    self._replica_id,
                    slot or "",
                    limits.tokens_per_minute or 0,
                    shared,
                    tokens_used,
                    MAX_DEBT_US,
                ],
                tenant=tenant,
                bounded=False,  # a charge is never given up for a turn
            )
        except _Away:  # as a release made while degraded (above)
            if slot is not None:
                self._health.resync = True
            self._unreached(admission, shared, tokens_used)
        except FAILURES as exc:
            self._health.failed("release", exc)
            self._unreached(admission, shared, tokens_used)  # charged twice if it did
        except BaseException:  # cut (a shutdown), or a fault: sent or not, charged
            self._health.resync = True
            self._unreached(admission, shared, tokens_used)  # twice if Redis took it
            raise
        finally:
            self._slots.end_call(slot)

    def _unreached(self, admission: Admission, shared: int, tokens_used: int) -> None:
        """A release Redis did not take: the tokens used past the reservation it holds
        are charged there once it answers (a refund is not given)."""
        tpm = admission.limits.tokens_per_minute
        if tpm is not None:
            extra = tokens_cost_us(tokens_used, tpm) - tokens_cost_us(shared, tpm)
            self._unshared.add(self._keys.tokens(admission.tenant), extra)


class _Away(Exception):
    """Redis failed another call while this one waited for its turn: not sent."""
