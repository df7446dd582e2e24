"""Charges decided on this replica's ledger, put into Redis once it answers again, for
`RedisState` and `RedisLimits` (redis_state.py, redis_limits.py).

While Redis is away or failed a call, `RedisLimits` decides on the local ledger, over
this replica's share: the other replicas never saw those admissions, and spent the
whole budget in Redis beside them (measured before: 287 admitted here beside 591 on
Redis, `requests_per_minute: 600`). So each local charge (an admission's request, a
reservation's tokens, the tokens of a release that did not reach Redis) is also kept
here per rate key, at the whole limit, as a GCRA time ahead of now (so what an outage's
elapsed time already paid back ages out, as in Redis), and the first sync that renews
the lease adds what is still ahead to the key in Redis (`CHARGE`, on the sync's
connection, before the state turns healthy): the other replicas see it from then on. A
restore (redis_restore.py) that added this replica's whole ledger back covers them
instead (one that only raised each budget to the ledger's, after a stall, does not). A
`CHARGE` whose reply was lost is sent again: charged twice (errs on charging).
"""

from __future__ import annotations

from collections.abc import Callable

from redis.asyncio import Redis

from gateway.state.ledger import MAX_DEBT_US

__all__ = ["CHARGE", "UnsharedCharges"]

# KEYS: rate keys (rpm or tpm TAT); ARGV: cap us (the furthest a TAT may run ahead of
# now), then one backlog us per key: each key's TAT moves on by its backlog (from now
# at the earliest), as a RESTORE into a Redis that lost its data adds.
# -> {number of keys}
CHARGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cap = tonumber(ARGV[1])
for i = 1, #KEYS do
  local backlog = tonumber(ARGV[i + 1])
  if backlog > 0 then
    local tat = math.max(tonumber(redis.call('GET', KEYS[i])) or now, now) + backlog
    tat = math.min(tat, now + cap)
    redis.call('SET', KEYS[i], string.format('%.0f', tat), 'PX', math.floor((tat - now) / 1000) + 1)
  end
end
return {#KEYS}
"""

BATCH = 256  # rate keys a call, as a restore's


class UnsharedCharges:
    """Per rate key, the charges decided here that Redis has not been given yet."""

    def __init__(self, client: Redis, clock: Callable[[], float]) -> None:
        self._script = client.register_script(CHARGE)
        self._clock = clock
        self._tats: dict[str, int] = {}

    def _now(self) -> int:
        return round(self._clock() * 1_000_000)

    def add(self, key: str, cost_us: int) -> None:
        """Charge `cost_us` (at the whole limit) to `key`, decided here."""
        if cost_us <= 0:
            return
        now = self._now()
        tat = max(self._tats.get(key, 0), now) + cost_us
        self._tats[key] = min(tat, now + MAX_DEBT_US)

    def backlogs(self) -> dict[str, int]:
        """What each key's charges still run ahead of now (us); aged-out keys dropped."""
        now = self._now()
        for key in [key for key, tat in self._tats.items() if tat <= now]:
            del self._tats[key]
        return {key: tat - now for key, tat in self._tats.items()}

    def given(self, sent: dict[str, int]) -> None:
        """Redis took `sent` (from `backlogs`), or a restore covered it: what was
        charged here since stays."""
        now = self._now()
        for key, backlog in sent.items():
            tat = self._tats.get(key)
            if tat is None:
                continue
            if tat - backlog <= now:
                del self._tats[key]
            else:
                self._tats[key] = tat - backlog

    async def send(self) -> int:
        """Add every backlog to Redis (in calls of at most `BATCH` keys); returns how
        many keys. Raises what the call raises (the sync fails, the rest stays)."""
        backlogs = self.backlogs()
        items = list(backlogs.items())
        for start in range(0, len(items), BATCH):
            batch = dict(items[start : start + BATCH])
            reply = await self._script(keys=list(batch), args=[MAX_DEBT_US, *batch.values()])
            if not (isinstance(reply, list) and reply == [len(batch)]):
                raise ValueError("malformed charge reply from redis")
            self.given(batch)
        return len(items)
