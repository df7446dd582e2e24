"""Connecting to a witness by name without lending it the process's default executor.

`asyncio.open_connection(name, ...)` resolves `name` on the event loop's default executor
(`loop.getaddrinfo`), and a timeout cancels the wait but not the thread: a witness whose
name's lookup hangs (its operator runs the authoritative DNS server) kept one of those
threads per cosigning attempt, and once they were all taken every `asyncio.to_thread` of
the gateway (config reloads, cosignature files, admin reads) waited behind them. Here a
witness name is looked up on a thread of its own, and an attempt that finds the lookup of
the same name and port still running (an earlier attempt timed out on it) waits on that
one instead of starting another: at most one thread per witness, `MAX_LOOKUPS` in all.
Not a fixed pool shared by the witnesses: two hostile names hanging took its two threads
and every other witness's lookup queued behind them. The threads are daemons: a name that
never resolves does not hold the process at exit (a ThreadPoolExecutor's are joined).
The lookups are gateway/name_lookups.py's, as a private backend's are.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from typing import Final

from gateway.name_lookups import Pending, look_up_addresses

__all__ = ["MAX_LOOKUPS", "open_witness_connection"]

#: witness names looked up at once (one thread each), for the whole process
MAX_LOOKUPS: Final = 64
#: addresses of one name tried in turn, at most
_MAX_ADDRESSES: Final = 8

_pending: Pending = {}
_running = threading.BoundedSemaphore(MAX_LOOKUPS)  # lookup threads alive


async def _addresses(host: str, port: int) -> list[tuple[int, str, int]]:
    return await look_up_addresses(
        host,
        port,
        pending=_pending,
        running=_running,
        busy=f"{MAX_LOOKUPS} witness name lookups still running",
        thread_name="owngate-witness-dns",
        max_addresses=_MAX_ADDRESSES,
    )


async def open_witness_connection(
    host: str, port: int, context: ssl.SSLContext | None, limit: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """`asyncio.open_connection` to `host` (TLS with `context` for its name), each of its
    addresses in turn, the name looked up as the module says."""
    failure: OSError | None = None
    for family, address, address_port in await _addresses(host, port):
        try:
            return await asyncio.open_connection(
                address,
                address_port,
                ssl=context,
                server_hostname=host if context is not None else None,
                family=family,
                limit=limit,
            )
        except ssl.SSLError:  # its certificate, or the handshake: not the address's
            raise
        except OSError as exc:
            failure = exc
    raise failure if failure is not None else OSError(f"{host} has no address")
