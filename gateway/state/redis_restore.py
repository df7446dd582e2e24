"""Putting a replica's budget use back into a Redis that lost it, for `RedisState`.

Before a resync renews this replica's lease, `BudgetRestore.restore` asks Redis
(`lua.RESTORE`) whether the lease is gone (Redis restarted, flushed or evicted it, or
this replica stalled past it); if so it puts back each tenant's budget use this
replica's ledger holds, so a Redis that lost its keys does not hand every tenant a whole
new minute's budget (docs/state.md). In calls of at most `batch` keys each; a run cut
off (the sync failed or timed out) goes on from where it was at the next sync, and
Redis's `restored` mark keeps a batch sent twice from being added twice.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from redis.asyncio import Redis

from gateway.logs import get_logger
from gateway.state import lua
from gateway.state.redis_keys import RedisKeys, text

__all__ = ["BudgetRestore"]


class BudgetRestore:
    """This replica's restores: the epoch it last restored into, the run under way, and
    how many restores put something back."""

    def __init__(
        self, keys: RedisKeys, client: Redis, replica_id: str, clock: Callable[[], float]
    ) -> None:
        self._keys = keys
        self._script = client.register_script(lua.RESTORE)
        self._replica_id = replica_id
        self._clock = clock
        self.epoch = ""  # the `epoch` key's value when this replica last restored
        self.restores = 0  # restores after a lost lease or lost data (`StateStatus`)
        self._token = os.urandom(8).hex()  # this process's, in `restored` (lua.RESTORE)
        self._pending: _RestoreRun | None = None  # a restore begun and not yet finished
        self._log = get_logger("owngate.state")

    async def restore(
        self, keys: list[str], backlogs: list[int], *, batch: int, leased: bool
    ) -> bool:
        """Put back `backlogs` (microseconds ahead, one per rate key in `keys`, as the
        ledger read them just now) if the lease is gone, `batch` keys a call. `leased`:
        a HEARTBEAT has given this replica a lease (a first restore is not counted).
        True when it added them (the lease was gone and Redis lost its data, or this
        replica never saw it); after a stall it only raised each budget to its own."""
        taken_at = self._clock()
        if self._pending is None:
            self._pending = _RestoreRun(self.epoch)
        run = self._pending
        run.extend(keys)
        now_ahead = dict(zip(keys, backlogs, strict=True))
        while True:
            elapsed_us = round((self._clock() - taken_at) * 1_000_000)
            keys = run.keys[run.next : run.next + batch]
            backlogs = [max(0, now_ahead.get(key, 0) - elapsed_us) for key in keys]
            reply = await self._script(
                keys=[self._keys.leases, self._keys.epoch, self._keys.restored, *keys],
                args=[
                    self._replica_id,
                    run.seen,
                    os.urandom(8).hex(),
                    self._token,
                    run.epoch,
                    run.next,
                    *backlogs,
                ],
            )
            # [0|1|2|3, epoch] (lua.RESTORE); anything else is Redis failing
            if not (
                isinstance(reply, list)
                and len(reply) == 2
                and type(reply[0]) is int
                and 0 <= reply[0] <= 3
                and isinstance(reply[1], bytes | str)
            ):
                size = f"a list of {len(reply)}" if isinstance(reply, list) else "not a list"
                raise ValueError(f"malformed restore reply from redis ({size})")
            code, epoch = reply[0], text(reply[1])
            if code == 0:  # the lease is live: nothing to put back
                self._pending, self.epoch = None, epoch
                return False
            if code == 3:  # Redis lost its data again meanwhile: all of it goes back
                run.epoch, run.next = "", 0
                continue
            run.epoch, run.lost = epoch, run.lost or code == 2
            run.next += len(keys)
            if run.next >= len(run.keys):
                break
        self._pending, self.epoch = None, run.epoch
        self._put_back(run, leased)
        return run.seen != run.epoch  # as lua.RESTORE decides whether it adds

    def _put_back(self, run: _RestoreRun, leased: bool) -> None:
        if run.lost or leased:
            self.restores += 1
        if run.lost:
            self._log.warning(
                "redis lost its data, budgets restored from local use",
                replica=self._replica_id,
                budgets=len(run.keys),
            )
        elif leased:  # not before a first lease
            self._log.warning(
                "shared state lease was gone, budgets restored from local use",
                replica=self._replica_id,
                budgets=len(run.keys),
            )


@dataclass
class _RestoreRun:
    """A restore under way: the rate keys in the order they are sent (a key first seen
    at a later sync of the run goes at the end: the order never changes, so Redis's
    count of the keys added stays true), how many were sent, the epoch this replica
    knew before the run (`seen`) and the one it restores into."""

    seen: str
    keys: list[str] = field(default_factory=list)
    known: set[str] = field(default_factory=set)
    epoch: str = ""
    next: int = 0
    lost: bool = False

    def extend(self, keys: list[str]) -> None:
        for key in keys:
            if key not in self.known:
                self.known.add(key)
                self.keys.append(key)
