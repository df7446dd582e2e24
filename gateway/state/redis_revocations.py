"""Key revocations shared through Redis, for `RedisState` (redis_state.py).

`RevokedKeys` is this replica's cache of every revoked key digest (`is_revoked` never
calls Redis, and a revocation once seen stays; it starts with this host's list,
revocation_list.py), the ones made here that Redis has not
stored yet (made while it was away), and the version of the Redis set last read. The
background sync calls `sync` with the version and size each HEARTBEAT reads: a new
version is read in whole, and whatever Redis lacks is pushed back to it.

Only members shaped as a key digest (`sha256:` and 64 lowercase hex digits) are read:
`READ` filters them on Redis, so a member another program wrote there (of any size:
Redis allows 512 MB) never crosses the wire, never enters the cache (which keeps what it
holds for the process's life) and is never pushed back.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from typing import Any, Final

from redis.asyncio import Redis

from gateway.state import lua
from gateway.state.redis_keys import FAILURES, RedisKeys, text

__all__ = ["DIGEST", "READ", "RevokedKeys"]

# What owngate stores in the revoked set (`gateway.tenants.hash_api_key`).
DIGEST: Final = re.compile(r"^sha256:[0-9a-f]{64}$")

# KEYS: revoked set -> {members in the set, the members shaped as DIGEST...}
READ: Final = """
local out = {redis.call('SCARD', KEYS[1])}
for _, m in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if #m == 71 and string.match(m, '^sha256:[0-9a-f]+$') then out[#out + 1] = m end
end
return out
"""


class RevokedKeys:
    """Revoked key digests: cached here, stored in Redis, pushed back when it lacks some."""

    def __init__(
        self,
        keys: RedisKeys,
        client: Redis,
        timeout_s: float,
        known: Iterable[str] = (),
        *,
        hold: bool = False,
    ) -> None:
        self._keys = keys
        self._client = client
        self._script = client.register_script(lua.REVOKE)
        self._read = client.register_script(READ)
        self._timeout_s = timeout_s
        self._hold = hold
        self._revoked: set[str] = set(known)  # this host's list (revocation_list.py)
        self._held: set[str] = set()  # learned from Redis, enforced once listed (`hold`)
        self._pending: set[str] = set()  # revoked here, not yet stored in Redis
        self._version = 0
        self._foreign = 0  # members of the set as last read that are no digest (not ours)

    @property
    def pending(self) -> int:
        """Revocations made here that Redis has not stored yet."""
        return len(self._pending)

    def is_revoked(self, key_hash: str) -> bool:
        return key_hash in self._revoked

    @property
    def seen(self) -> int:
        """How many digests are cached here (only ever added to: `SharedState.revocations`)."""
        return len(self._revoked)

    @property
    def held(self) -> int:
        """Revocations learned from Redis and not enforced yet: this host's list does
        not hold them yet (its write is under way)."""
        return len(self._held)

    def holding(self) -> frozenset[str]:
        """The digests `held` counts: for the list's writer after each sync, whatever
        became of it (one that failed after its read learned them returned nothing)."""
        return frozenset(self._held)

    def listed(self, digests: Iterable[str]) -> None:
        """Refuse `digests` from now on: this host's list holds them (or a write of them
        failed and said so). Those held are enforced; those new here (another process
        wrote them: `owngate keys revoke` while Redis was away) are stored in Redis by
        the next sync that reaches it."""
        fresh = set(digests) - self._revoked
        self._pending |= fresh - self._held  # a held one came from Redis
        self._held -= fresh
        self._revoked |= fresh

    async def revoke(self, key_hash: str, *, healthy: bool) -> bool:
        """Refuse the key here at once; True when Redis stored it too. With Redis away
        (`healthy` false) it waits for the next sync that reaches Redis, as it does when
        the call fails, which raises that failure (one of `FAILURES`)."""
        if not DIGEST.match(key_hash):
            raise ValueError("revoke_key needs a key digest (sha256: and 64 hex digits)")
        self._revoked.add(key_hash)
        self._held.discard(key_hash)  # refused here now: no longer waits for the list
        if not healthy:
            self._pending.add(key_hash)
            return False
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._script(
                    keys=[self._keys.revoked, self._keys.revoked_version], args=[key_hash]
                )
        except FAILURES:
            self._pending.add(key_hash)
            raise
        return True

    async def sync(self, version: int, stored: int, *, reread: bool = False) -> set[str]:
        """Read Redis's set when its `version` moved, it holds digests not cached here,
        or `reread` (a resync: now and then whatever the counts say, as another program
        may have swapped a digest for a foreign member); push back the ones it lacks.
        `stored` is the set's size, foreign members (as the last read counted) included.
        Returns the digests learned (not cached here before), `held` with `hold`."""
        keys = self._keys
        learned: set[str] = set()
        cached = len(self._revoked) + len(self._held)
        if reread or version != self._version or stored - self._foreign > cached:
            size, members = _read_reply(await self._read(keys=[keys.revoked]))
            learned = set(members) - self._revoked - self._held
            (self._held if self._hold else self._revoked).update(learned)
            self._version = version
            self._foreign = size - len(members)
            stored = size
        # Ours that Redis lacks: made while it was away, or lost with its data.
        push = set(self._pending)
        if stored - self._foreign < len(self._revoked) + len(self._held):
            push |= self._revoked
        if push:
            await self._script(keys=[keys.revoked, keys.revoked_version], args=sorted(push))
            self._pending -= push
        return learned


def _read_reply(reply: Any) -> tuple[int, list[str]]:
    """`READ`'s reply as it must be: the set's size, then digests (at most that many);
    anything else raises ValueError without quoting it (a malformed sync reply)."""
    if isinstance(reply, list) and reply and type(reply[0]) is int:
        members = [text(m) for m in reply[1:] if isinstance(m, bytes | str)]
        if len(members) == len(reply) - 1 <= reply[0] and all(map(DIGEST.match, members)):
            return reply[0], members
    size = f"a list of {len(reply)}" if isinstance(reply, list) else type(reply).__name__
    raise ValueError(f"malformed revocations reply from redis ({size})")
