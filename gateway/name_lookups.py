"""Host names looked up without lending them the event loop's lookup threads, for a private
backend's connection (gateway/upstream/backend_names.py) and a witness's
(gateway/provenance/witness/lookup.py).

`loop.getaddrinfo` (what `loop.create_connection(name, ...)` and
`asyncio.open_connection(name, ...)` use) resolves a name on the loop's own threads:
uvloop's on libuv's threadpool (4 threads, which uvloop's file operations share),
asyncio's on its default executor (every `asyncio.to_thread`). A timeout cancels the wait,
not the thread: a name whose lookup hangs (its DNS server swallowing queries) kept one of
those threads per attempt, until every other lookup, and the loop's other work on them,
queued behind the hung ones. Here a name is looked up on a thread of its own, and an
attempt that finds the lookup of the same name and port still running (an earlier
attempt timed out on it) waits on that one instead of starting another: at most one
thread per (name, port), a caller's semaphore's worth in all (past that, `LookupsBusy`:
the gateway's own state, not the name's fault). Not a fixed pool shared by the names: two
hostile names hanging would take its threads and every other name queue behind them. The
threads are daemons: a name that never resolves does not hold the process at exit (a
ThreadPoolExecutor's are joined).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import socket
import threading
from typing import Any

__all__ = ["LookupsBusy", "Pending", "look_up_addresses"]

#: each caller's lookups still running, by (host, port)
Pending = dict[tuple[str, int], asyncio.Future[Any]]


class LookupsBusy(OSError):
    """The caller's cap of lookups of other names are still running: none started."""


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


def _forget(pending: Pending, key: tuple[str, int], future: asyncio.Future[Any]) -> None:
    if pending.get(key) is future:
        del pending[key]
    if not future.cancelled():
        future.exception()  # retrieved: an attempt may have stopped waiting on it


async def look_up_addresses(
    host: str,
    port: int,
    *,
    pending: Pending,
    running: threading.BoundedSemaphore,
    busy: str,
    thread_name: str,
    max_addresses: int,
) -> list[tuple[int, str, int]]:
    """(family, address, port) of each address `host` resolves to (a literal: itself),
    `max_addresses` at most, looked up as the module says: `pending` holds the caller's
    lookups still running, each takes one of `running` until its thread returns, and
    `busy` is the message of the `LookupsBusy` raised when `running` has none left; a
    failed lookup's `OSError`."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:  # a literal: nothing to look up
        return [(socket.AF_INET6 if ":" in host else socket.AF_INET, host, port)]
    loop = asyncio.get_running_loop()
    key = (host, port)
    lookup = pending.get(key)
    if lookup is None or lookup.get_loop() is not loop:
        if not running.acquire(blocking=False):
            raise LookupsBusy(busy)
        lookup = loop.create_future()
        try:
            threading.Thread(
                target=_look_up,
                args=(loop, lookup, host, port, running),
                name=thread_name,
                daemon=True,
            ).start()
        except BaseException:
            running.release()
            raise
        pending[key] = lookup
        lookup.add_done_callback(functools.partial(_forget, pending, key))
    infos = await asyncio.shield(lookup)  # a timeout leaves it to the next attempt
    return [(info[0], str(info[4][0]), int(info[4][1])) for info in infos[:max_addresses]]
