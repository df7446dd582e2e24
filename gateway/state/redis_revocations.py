"""Key revocations shared through Redis, for `RedisState` (redis_state.py).

`RevokedKeys` is this replica's cache of every revoked key digest (`is_revoked` never
calls Redis, and a revocation once seen stays), the ones made here that Redis has not
stored yet (made while it was away), and the version of the Redis set last read. The
background sync calls `sync` with the version and size each HEARTBEAT reads: a new
version is read in whole, and whatever Redis lacks is pushed back to it.
"""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from gateway.state import lua
from gateway.state.redis_keys import FAILURES, RedisKeys, text

__all__ = ["RevokedKeys"]


class RevokedKeys:
    """Revoked key digests: cached here, stored in Redis, pushed back when it lacks some."""

    def __init__(self, keys: RedisKeys, client: Redis, timeout_s: float) -> None:
        self._keys = keys
        self._client = client
        self._script = client.register_script(lua.REVOKE)
        self._timeout_s = timeout_s
        self._revoked: set[str] = set()
        self._pending: set[str] = set()  # revoked here, not yet stored in Redis
        self._version = 0

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

    async def revoke(self, key_hash: str, *, healthy: bool) -> bool:
        """Refuse the key here at once; True when Redis stored it too. With Redis away
        (`healthy` false) it waits for the next sync that reaches Redis, as it does when
        the call fails, which raises that failure (one of `FAILURES`)."""
        if not key_hash:
            raise ValueError("revoke_key needs a key hash")
        self._revoked.add(key_hash)
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

    async def sync(self, version: int, stored: int) -> None:
        """Read Redis's set when its `version` moved or it holds keys not cached here;
        push back the ones it lacks."""
        keys = self._keys
        if version != self._version or stored > len(self._revoked):
            members = await self._client.smembers(keys.revoked)
            self._revoked.update(text(m) for m in members)
            self._version = version
            stored = len(members)
        # Ours that Redis lacks: made while it was away, or lost with its data.
        push = set(self._pending)
        if stored < len(self._revoked):
            push |= self._revoked
        if push:
            await self._script(keys=[keys.revoked, keys.revoked_version], args=sorted(push))
            self._pending -= push
