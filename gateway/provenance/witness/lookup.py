"""Connecting to a witness by name without lending it the process's default executor.

`asyncio.open_connection(name, ...)` resolves `name` on the event loop's default executor
(`loop.getaddrinfo`), and a timeout cancels the wait but not the thread: a witness whose
name's lookup hangs (its operator runs the authoritative DNS server) kept one of those
threads per cosigning attempt, and once they were all taken every `asyncio.to_thread` of
the gateway (config reloads, cosignature files, admin reads) waited behind them. Here a
witness name is looked up on `MAX_LOOKUPS` threads of this module's own, and an attempt
that finds the lookup of the same name and port still running (an earlier attempt timed
out on it) waits on that one instead of starting another: at most one thread per witness.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
import ssl
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

__all__ = ["MAX_LOOKUPS", "open_witness_connection"]

#: threads looking witness names up, for the whole process
MAX_LOOKUPS: Final = 2
#: addresses of one name tried in turn, at most
_MAX_ADDRESSES: Final = 8

_lookups: ThreadPoolExecutor | None = None  # made on the first lookup (nothing at import)
_pending: dict[tuple[str, int], asyncio.Future[Any]] = {}


def _forget(key: tuple[str, int], future: asyncio.Future[Any]) -> None:
    if _pending.get(key) is future:
        del _pending[key]
    if not future.cancelled():
        future.exception()  # retrieved: an attempt may have stopped waiting on it


async def _addresses(host: str, port: int) -> list[tuple[Any, ...]]:
    global _lookups
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
        if _lookups is None:
            _lookups = ThreadPoolExecutor(MAX_LOOKUPS, thread_name_prefix="owngate-witness-dns")
        call = functools.partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
        lookup = loop.run_in_executor(_lookups, call)
        _pending[key] = lookup
        lookup.add_done_callback(functools.partial(_forget, key))
    infos = await asyncio.shield(lookup)  # a timeout leaves it to the next attempt
    return [(info[0], info[4][0], info[4][1]) for info in infos[:_MAX_ADDRESSES]]


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
