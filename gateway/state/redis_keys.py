"""Where shared state lives in Redis: every key under one `{prefix}` hash tag, the names
replicas go by, the connections `RedisState` (gateway/state/redis_state.py) opens, and
how their failures and the names Redis returns are read.

Imports redis-py: imported only when `state.backend` is `redis`. docs/state.md lists the
keys and what each holds.
"""

from __future__ import annotations

import os
import re
import socket
from typing import Any, Final

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = [
    "FAILURES",
    "MALFORMED",
    "RedisKeys",
    "default_replica_id",
    "describe_failure",
    "heartbeat_reply",
    "replied",
    "text",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
# What a call to Redis raises when Redis is away, slow or broken: never the caller's bug.
FAILURES = (RedisError, OSError, TimeoutError)
# A reply of the wrong shape (another program on the port, a proxy, a bug, another
# program's data under our keys): read as Redis failing, never as a decision.
MALFORMED = (ValueError, TypeError, IndexError, KeyError)


class RedisKeys:
    """Every key owngate writes, under one `{prefix}` hash tag (one Cluster slot)."""

    def __init__(self, prefix: str) -> None:
        if not _NAME.match(prefix):
            raise ValueError(f"key prefix {prefix!r} must match {_NAME.pattern}")
        tag = "{" + prefix + "}"
        self._tag = tag
        self.leases = f"{tag}:leases"
        self.inflight = f"{tag}:inflight"
        self.revoked = f"{tag}:revoked"
        self.revoked_version = f"{tag}:revoked:version"
        self.epoch = f"{tag}:epoch"
        self.restored = f"{tag}:restored"

    def slots(self, tenant: str) -> str:
        return f"{self._tag}:slots:{tenant}"

    def held(self, tenant: str) -> str:
        return f"{self._tag}:held:{tenant}"

    def requests(self, tenant: str) -> str:
        return f"{self._tag}:rpm:{tenant}"

    def tokens(self, tenant: str) -> str:
        return f"{self._tag}:tpm:{tenant}"


def default_replica_id() -> str:
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:64] or "host"
    return f"{host}-{os.getpid()}-{os.urandom(3).hex()}"


def _client(url: str, timeout_s: float, name: str) -> aioredis.Redis:
    pool = aioredis.ConnectionPool.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),  # a failed call falls back at once; the sync retries
        client_name=f"owngate:{name}",
    )
    return aioredis.Redis.from_pool(pool)


def _per_tenant(keys: RedisKeys, tenants: list[str]) -> list[str]:
    return [key for tenant in tenants for key in (keys.slots(tenant), keys.held(tenant))]


def text(value: Any) -> str:
    """A name Redis returned; bytes that are not UTF-8 (not ours) become U+FFFD, which
    matches no key digest or backend id, rather than an error."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def replied(what: str, reply: Any, *shapes: tuple[int | None, ...]) -> list[int]:
    """A script's reply as the integers it must be: a list matching one of `shapes`
    (each item the value required there, or None for any integer). Anything else (a
    string, an integer, a list of another length or with another code) raises
    ValueError without quoting it (Redis's bytes never reach a log)."""
    if isinstance(reply, list) and all(type(item) is int for item in reply):
        for shape in shapes:
            if len(reply) == len(shape) and all(
                want is None or item == want for item, want in zip(reply, shape, strict=True)
            ):
                return reply
    size = f"a list of {len(reply)}" if isinstance(reply, list) else type(reply).__name__
    raise ValueError(f"malformed {what} reply from redis ({size})")


def heartbeat_reply(reply: Any) -> list[Any]:
    """`lua.HEARTBEAT`'s reply as it must be: `[-1]` or `[-2]` (no lease renewed), or
    `[0|1, live replicas, revoked version, revoked count, (backend, count >= 0)...]`;
    anything else raises ValueError (as `replied`)."""
    if isinstance(reply, list) and reply in ([-1], [-2]):
        return reply
    if (
        isinstance(reply, list)
        and len(reply) >= 4
        and len(reply) % 2 == 0
        and all(type(item) is int for item in reply[:4])
        and reply[0] in (0, 1)
        and reply[1] >= 0
        and all(type(item) is int and item >= 0 for item in reply[5::2])
        and all(isinstance(item, bytes | str) for item in reply[4::2])
    ):
        return reply
    size = f"a list of {len(reply)}" if isinstance(reply, list) else type(reply).__name__
    raise ValueError(f"malformed heartbeat reply from redis ({size})")


# redis-py's failures whose message it writes itself (a socket's error, the host and port
# of the URL, a pool's limit). Every other RedisError carries what the far side sent: a
# `-ERR` reply (ResponseError and its kinds, AuthenticationError, BusyLoadingError) or the
# bytes of a reply it could not parse (InvalidResponse), and a server may quote the
# command it refused: a Redis before 6 answers `HELLO 3 AUTH default <password>` with
# "unknown command 'HELLO', with args beginning with: ... '<password>'".
_OWN_WORDS: Final = (RedisConnectionError, RedisTimeoutError, MaxConnectionsError)

# Redis's error codes that redis-py gives no class of their own (a plain `ResponseError`
# whose message begins with the code): named in the description, as a word of this list,
# never as the server sent it. They tell apart faults that the class alone does not: a
# key of the wrong type under the prefix (another program's), a script of another
# program holding Redis (`BUSY`), a Redis that cannot persist (`MISCONF`).
_CODES: Final = frozenset(
    {
        "BUSY",
        "BUSYKEY",
        "MISCONF",
        "NOGROUP",
        "NOPROTO",
        "NOREPLICAS",
        "NOTBUSY",
        "UNBLOCKED",
        "UNKILLABLE",
        "WRONGTYPE",
    }
)


def describe_failure(exc: BaseException, timeout_s: float) -> str:
    """What a failed call to Redis says in a log line and `/admin/status`: the class and
    redis-py's own message; a message the server wrote only by its length (and its
    error code, when it is one of `_CODES`)."""
    if isinstance(exc, TimeoutError) and not str(exc):
        return f"no answer within {timeout_s * 1000:.0f} ms"
    if isinstance(exc, RedisError) and type(exc) not in _OWN_WORDS:
        said = str(exc)
        code = said.split(" ", 1)[0]
        name = f"{type(exc).__name__} {code}" if code in _CODES else type(exc).__name__
        return f"{name}: [message withheld: {len(said)} characters]"
    return f"{type(exc).__name__}: {exc}"
