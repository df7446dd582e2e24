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
gateway/provenance/witness/lookup.py does for witnesses, both with
gateway/name_lookups.py. The threads are daemons: a name that never resolves does not
hold the process at exit.
"""

from __future__ import annotations

import threading
from typing import Final

from gateway.name_lookups import LookupsBusy, Pending, look_up_addresses

__all__ = ["MAX_LOOKUPS", "LookupsBusy", "backend_addresses"]

#: backend names looked up at once (one thread each), for the whole process
MAX_LOOKUPS: Final = 64
#: addresses of one name tried in turn, at most
MAX_ADDRESSES: Final = 8

_pending: Pending = {}
_running = threading.BoundedSemaphore(MAX_LOOKUPS)  # lookup threads alive


async def backend_addresses(host: str, port: int) -> list[tuple[int, str, int]]:
    """(family, address, port) of each address `host` resolves to (a literal: itself),
    `MAX_ADDRESSES` at most, looked up as the module says; a failed lookup's `OSError`."""
    return await look_up_addresses(
        host,
        port,
        pending=_pending,
        running=_running,
        busy=f"{MAX_LOOKUPS} backend name lookups still running",
        thread_name="owngate-backend-dns",
        max_addresses=MAX_ADDRESSES,
    )
