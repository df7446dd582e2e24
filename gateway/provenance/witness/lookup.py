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
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import socket
import ssl
import threading
from typing import Any, Final

__all__ = ["MAX_LOOKUPS", "open_witness_connection"]

#: witness names looked up at once (one thread each), for the whole process
MAX_LOOKUPS: Final = 64
#: addresses of one name tried in turn, at most
_MAX_ADDRESSES: Final = 8

_pending: dict[tuple[str, int], asyncio.Future[Any]] = {}
_running = threading.BoundedSemaphore(MAX_LOOKUPS)  # lookup threads alive


def _look_up(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], host: str, port: int
) -> None:
    try:
        try:
            result: Any = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting attempt
            result = exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(_settle, future, result)
    finally:
        _running.release()


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


async def _addresses(host: str, port: int) -> list[tuple[Any, ...]]:
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
        if not _running.acquire(blocking=False):
            raise OSError(f"{MAX_LOOKUPS} witness name lookups still running")
        lookup = loop.create_future()
        try:
            threading.Thread(
                target=_look_up,
                args=(loop, lookup, host, port),
                name="owngate-witness-dns",
                daemon=True,
            ).start()
        except BaseException:
            _running.release()
            raise
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
