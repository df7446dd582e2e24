"""A private backend's host name looked up without lending it the event loop's lookup
threads, for `dial` (gateway/upstream/dial.py).

`loop.create_connection(host, ...)` resolves a name on the loop's own threads: uvloop's
on libuv's threadpool (4 threads, which uvloop's file operations share), asyncio's on its
default executor (every `asyncio.to_thread` of the gateway: config reloads, key files,
the log's cosignatures). The connect timeout cancels the wait, not the thread: a backend
whose name's lookup hangs (its DNS server swallowing queries) kept one of those threads
per connection attempt, a new one each attempt, so a few attempts took them all and every
other backend's lookup, and the loop's other work on them, queued behind the hung ones.
Here a name is looked up on a thread of its own, and an attempt that finds the lookup of
the same name and port still running (an earlier attempt timed out on it) waits on that
one instead of starting another: at most one thread per backend name, `MAX_LOOKUPS` in
all (past that, `LookupsBusy`: the gateway's own state, not the backend's fault), as
gateway/provenance/witness/lookup.py does for witnesses. The threads are daemons: a name
that never resolves does not hold the process at exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import socket
import threading
from typing import Any, Final

__all__ = ["MAX_LOOKUPS", "LookupsBusy", "backend_addresses"]

#: backend names looked up at once (one thread each), for the whole process
MAX_LOOKUPS: Final = 64
#: addresses of one name tried in turn, at most
MAX_ADDRESSES: Final = 8

_pending: dict[tuple[str, int], asyncio.Future[Any]] = {}
_running = threading.BoundedSemaphore(MAX_LOOKUPS)  # lookup threads alive


class LookupsBusy(OSError):
    """`MAX_LOOKUPS` lookups of other names are still running: none started."""


def _look_up(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    host: str,
    port: int,
    running: threading.BoundedSemaphore,
) -> None:
    try:
        try:
            result: Any = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting attempt
            result = exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(_settle, future, result)
    finally:
        running.release()


def _settle(future: asyncio.Future[Any], result: Any) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


def _forget(key: tuple[str, int], future: asyncio.Future[Any]) -> None:
    if _pending.get(key) is future:
        del _pending[key]
    if not future.cancelled():
        future.exception()  # retrieved: an attempt may have stopped waiting on it


async def backend_addresses(host: str, port: int) -> list[tuple[int, str, int]]:
    """(family, address, port) of each address `host` resolves to (a literal: itself),
    `MAX_ADDRESSES` at most, looked up as the module says; a failed lookup's `OSError`."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:  # a literal: nothing to look up
        return [(socket.AF_INET6 if ":" in host else socket.AF_INET, host, port)]
    loop = asyncio.get_running_loop()
    key = (host, port)
    lookup = _pending.get(key)
    if lookup is None or lookup.get_loop() is not loop:
        running = _running
        if not running.acquire(blocking=False):
            raise LookupsBusy(f"{MAX_LOOKUPS} backend name lookups still running")
        lookup = loop.create_future()
        try:
            threading.Thread(
                target=_look_up,
                args=(loop, lookup, host, port, running),
                name="owngate-backend-dns",
                daemon=True,
            ).start()
        except BaseException:
            running.release()
            raise
        _pending[key] = lookup
        lookup.add_done_callback(functools.partial(_forget, key))
    infos = await asyncio.shield(lookup)  # a timeout leaves it to the next attempt
    return [(info[0], str(info[4][0]), int(info[4][1])) for info in infos[:MAX_ADDRESSES]]
