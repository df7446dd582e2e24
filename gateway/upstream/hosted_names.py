"""Host names a hosted call looks up, off the event loop's lookup threads and within the
gateway's bounds, and the media hosts a client's URLs name answered as the gateway's check
found them (gateway/upstream/media_urls.py).

A hosted call's lookups went to threads shared with the rest of the process, each waited
for as long as the resolver took: aiohttp's default resolver (LiteLLM's transport, the
provider's host and a media URL's host an adapter downloads) and LiteLLM's own check of a
media URL before it downloads it (`url_utils.validate_url`, run by `asyncio.to_thread`)
on the loop's default executor, and botocore's credential fetches (the container or
instance metadata endpoint, STS: urllib3's `create_connection`) in LiteLLM's signing
thread, past every timeout botocore sets (a timeout bounds a socket, and there is no
socket yet). A client naming image hosts whose DNS server answers the gateway's check and
then hangs (its names its own) held a default-executor thread per URL for the resolver's
timeouts, after its request had ended: a few such requests took them all, and every
`asyncio.to_thread` of the gateway (config reloads, key files, the log's cosignatures)
queued behind them.

Within a watched hosted call (gateway/upstream/hosted_transport.py `watched`):
- a host the request's media check looked up is answered with the addresses it found then
  (`Outbound.addresses`): no second lookup, nothing a DNS server can change in between;
- any other name is looked up on a thread of its own, at most one per (name, port) at a
  time and `MAX_LOOKUPS` in all (gateway/name_lookups.py, as private backends' names are;
  the names a client's redirects name, for LiteLLM's URL check, `MAX_CLIENT_LOOKUPS` of
  their own, so that they never take the provider's and the credentials' lookups, one
  tenant's at most `MAX_CLIENT_LOOKUPS_PER_TENANT` of those: names that hang held by one
  tenant leave the others' redirects theirs),
  and waited for at most `limits.connect_timeout_s` (`hosted_connect_timeout`, else
  `FALLBACK_S`): past it, a failed lookup (`EAI_AGAIN`), the thread left to the resolver;
- a redirect's host, as LiteLLM's URL check of the hop looks it up, is held to the
  gateway's address check (`is_public_address`: LiteLLM's own passed NAT64, 6to4, SIIT
  and site-local IPv6 addresses, literal or resolved) and, when it passes, answered from
  then on with what it resolved to: the hop's connection goes where the check looked.
Outside a watched call nothing changes. `HostedResolver` is the aiohttp transport's
resolver (gateway/upstream/hosted_sockets.py); `install_name_rules` gives LiteLLM's URL
check and urllib3 (botocore) `bounded_getaddrinfo` in place of `socket.getaddrinfo`.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import ipaddress
import socket
import threading
from typing import Any, Final

from aiohttp.abc import AbstractResolver, ResolveResult

from gateway.media_hosts import is_public_address
from gateway.name_lookups import LookupsBusy, Pending, look_up_addresses
from gateway.upstream.hosted_transport import watched
from gateway.upstream.sockets import hosted_connect_timeout

__all__ = [
    "FALLBACK_S",
    "MAX_CLIENT_LOOKUPS",
    "MAX_CLIENT_LOOKUPS_PER_TENANT",
    "MAX_LOOKUPS",
    "HostedResolver",
    "bounded_getaddrinfo",
    "install_name_rules",
]

#: hosted calls' names looked up at once (one thread each), for the whole process
MAX_LOOKUPS: Final = 64
#: of them, names a client's media URLs redirect to (LiteLLM's URL check), on threads apart
MAX_CLIENT_LOOKUPS: Final = 16
#: of those, the most one tenant's calls hold at once (each until its thread returns)
MAX_CLIENT_LOOKUPS_PER_TENANT: Final = 8
#: the wait for a lookup where no `limits.connect_timeout_s` was set in this process
FALLBACK_S: Final = 10.0
_MAX_ADDRESSES: Final = 8
_BUSY: Final = f"{MAX_LOOKUPS} hosted name lookups still running"
_NOT_PUBLIC: Final = "a media host with a non-public address"

_pending: Pending = {}  # the resolver's, on the event loop
_running = threading.BoundedSemaphore(MAX_LOOKUPS)  # lookup threads alive: operator names
_clients = threading.BoundedSemaphore(MAX_CLIENT_LOOKUPS)  # ... and a client's redirects
_tenants: dict[str, threading.BoundedSemaphore] = {}  # each tenant's part of `_clients`
_lock = threading.Lock()
_waiting: dict[tuple[str, int], concurrent.futures.Future[Any]] = {}  # the sync lookups'


def _pinned(host: str) -> list[str] | None:
    """The addresses the watched call's media check found for `host`, None if none."""
    outbound = watched()
    addresses = None if outbound is None else outbound.addresses
    return None if not addresses else addresses.get(host.rstrip(".").lower())


def _literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _family(address: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def _bound_s() -> float:
    bound = hosted_connect_timeout()
    return FALLBACK_S if bound is None else bound


class HostedResolver(AbstractResolver):
    """aiohttp's resolver for hosted calls: see the module's notes."""

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        pinned = _pinned(host)
        if pinned is not None:
            found = [(int(_family(a)), a, port) for a in pinned]
        else:
            try:
                found = await look_up_addresses(
                    host,
                    port,
                    pending=_pending,
                    running=_running,
                    busy=_BUSY,
                    thread_name="owngate-hosted-dns",
                    max_addresses=_MAX_ADDRESSES,
                )
            except LookupsBusy as exc:
                raise OSError(str(exc)) from None
        wanted = [f for f in found if family in (socket.AF_UNSPEC, f[0])]
        if not wanted:
            raise OSError(f"{host}: no address of the family asked for")
        flags = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV
        return [
            {"hostname": host, "host": a, "port": p, "family": f, "proto": 0, "flags": flags}
            for f, a, p in wanted
        ]

    async def close(self) -> None:
        return None


def bounded_getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
    """`socket.getaddrinfo`, but within a watched hosted call as the module says."""
    return _bounded((_running,), host, port, *args, **kwargs)


def _client_getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
    """`bounded_getaddrinfo` for the names a client's URLs lead to (`MAX_CLIENT_LOOKUPS`),
    held to the gateway's check: in a watched call, a name or literal (a redirect's: the
    check looked at the URL's own host) with a non-public address is refused
    (`EAI_NONAME`; LiteLLM's `is_global` check passes NAT64, 6to4 and site-local ones),
    and what a name resolved to is where the hop's connection goes (`Outbound.addresses`)."""
    outbound = watched()
    tenant = "" if outbound is None else outbound.tenant
    with _lock:
        place = _tenants.get(tenant)
        if place is None:
            place = _tenants[tenant] = threading.BoundedSemaphore(MAX_CLIENT_LOOKUPS_PER_TENANT)
    found = _bounded((place, _clients), host, port, *args, **kwargs)
    if outbound is None or not isinstance(host, str):
        return found
    addresses = [str(info[4][0]) for info in found]
    if not all(map(is_public_address, addresses)):
        raise socket.gaierror(socket.EAI_NONAME, f"{_NOT_PUBLIC} (a redirect's host)")
    key = host.rstrip(".").lower()
    if key not in outbound.addresses and addresses:
        # a new dict, not an update: the one it replaces may be shared (`Prepared`'s default)
        outbound.addresses = {**outbound.addresses, key: addresses}
    return found


def _bounded(
    places: tuple[threading.BoundedSemaphore, ...], host: Any, port: Any, *args: Any, **kwargs: Any
) -> Any:
    """The lookup of `host`, holding one of each of `places` until its thread returns."""
    if watched() is None or not isinstance(host, str) or _literal(host):
        return socket.getaddrinfo(host, port, *args, **kwargs)  # a literal: no DNS, no thread
    number = int(port) if isinstance(port, (int, str)) and str(port).isdigit() else 0
    pinned = _pinned(host)
    if pinned is not None:
        stream, tcp = socket.SOCK_STREAM, socket.IPPROTO_TCP
        return [(_family(a), stream, tcp, "", (a, number)) for a in pinned]
    key = (host, number)
    with _lock:
        lookup = _waiting.get(key)
        if lookup is None:
            held = [place for place in places if place.acquire(blocking=False)]
            if len(held) < len(places):
                for place in held:
                    place.release()
                raise socket.gaierror(socket.EAI_AGAIN, _BUSY)
            lookup = _waiting[key] = concurrent.futures.Future()
            started = threading.Thread(
                target=_look_up,
                args=(lookup, key, (host, port, *args), kwargs, places),
                name="owngate-hosted-dns",
                daemon=True,
            )
            try:
                started.start()
            except BaseException:
                del _waiting[key]
                for place in places:
                    place.release()
                raise
    try:
        return lookup.result(timeout=_bound_s())
    except concurrent.futures.TimeoutError:
        raise socket.gaierror(
            socket.EAI_AGAIN, f"{host}: not looked up within {_bound_s():g} s"
        ) from None


def _look_up(
    lookup: concurrent.futures.Future[Any],
    key: tuple[str, int],
    call: tuple[Any, ...],
    kwargs: dict[str, Any],
    places: tuple[threading.BoundedSemaphore, ...],
) -> None:
    try:
        try:
            lookup.set_result(socket.getaddrinfo(*call, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
            lookup.set_exception(exc)
    finally:
        with _lock:
            if _waiting.get(key) is lookup:
                del _waiting[key]
        for place in places:
            place.release()


class _Socket:
    """The `socket` module as a library's module sees it, but `getaddrinfo`."""

    def __init__(self, lookup: Any) -> None:
        self.getaddrinfo = lookup

    def __getattr__(self, name: str) -> Any:
        return getattr(socket, name)


def install_name_rules() -> None:
    """Give LiteLLM's URL check (`url_utils`) and urllib3's connections (botocore's
    credential fetches) `bounded_getaddrinfo`; idempotent."""
    for name, lookup in (
        ("litellm.litellm_core_utils.url_utils", _client_getaddrinfo),
        ("urllib3.util.connection", bounded_getaddrinfo),
    ):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if not isinstance(getattr(module, "socket", None), _Socket):
            setattr(module, "socket", _Socket(lookup))  # noqa: B010 - the module global it reads
