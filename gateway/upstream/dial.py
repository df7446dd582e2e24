"""Dialing a backend: one new TCP connection, its TLS handshake and peer, for `HttpPool`.

`dial` opens it within the connect timeout and names each way it can fail as the
`UpstreamError` the pool raises (gateway/upstream/http.py): `connect` (timed out,
refused, unreachable), `tls` (a handshake refused, never a reason to retry in plain
HTTP) and `exhausted` (the gateway itself is out of sockets). `peer_of` then says who
the handshake authenticated, or refuses it as `tls`, before a request byte is written.
The pool holds a connection slot around both and gives it back when either fails.

A host name is looked up on a thread of its own, de-duplicated and bounded
(gateway/upstream/backend_names.py), never on the event loop's threads, which a backend
whose name's lookup hangs took one by one; its addresses are then tried in turn.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

from gateway.upstream.backend_names import LookupsBusy, backend_addresses
from gateway.upstream.connection import _Connection, ssl_reason
from gateway.upstream.failures import UpstreamError, out_of_resources
from gateway.upstream.tls import BackendTLS, Peer, TLSRejectedError

__all__ = ["dial", "peer_of"]


async def dial(
    loop: asyncio.AbstractEventLoop,
    protocol: Callable[[], _Connection],
    host: str,
    port: int,
    tls: BackendTLS | None,
    timeout: float,
) -> _Connection:
    """A connection to `host:port` made with `protocol`, TLS under `tls` (None: plain),
    within `timeout` seconds; a failure is an `UpstreamError`, a cancellation raised."""
    try:
        async with asyncio.timeout(timeout):
            conn = await _connect(loop, protocol, host, port, tls)
    except LookupsBusy as exc:  # other names' lookups hang: not this backend's doing
        raise UpstreamError("exhausted", f"the gateway cannot look {host} up now: {exc}") from exc
    except TimeoutError as exc:
        raise UpstreamError("connect", "connect timed out") from exc
    except ssl.SSLError as exc:  # before OSError, its base class
        raise UpstreamError("tls", ssl_reason(exc)) from exc
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        if out_of_resources(exc):  # EMFILE, or a host name's lookup at the limit
            detail = f"the gateway cannot open a socket: {reason}"
            raise UpstreamError("exhausted", detail) from exc
        raise UpstreamError("connect", reason) from exc
    except UnicodeDecodeError as exc:
        # The event loop's end of the handshake reads `getpeercert()`, whose dict
        # decodes the certificate's URIs (SAN, OCSP, CRL) as UTF-8: a trusted CA's
        # certificate with another byte in one is refused like one that cannot be read.
        raise UpstreamError("tls", f"the backend's certificate cannot be read ({exc})") from exc
    return conn


async def _connect(
    loop: asyncio.AbstractEventLoop,
    protocol: Callable[[], _Connection],
    host: str,
    port: int,
    tls: BackendTLS | None,
) -> _Connection:
    """A connection to the first of `host`'s addresses that takes one; the last
    address's failure where none does (a TLS failure at once: not the address's)."""
    failure: OSError | None = None
    for family, address, address_port in await backend_addresses(host, port):
        try:
            _, conn = await loop.create_connection(
                protocol,
                address,
                address_port,
                family=family,
                ssl=None if tls is None else tls.context,
                server_hostname=None if tls is None else tls.server_name,
            )
        except ssl.SSLError:
            raise
        except OSError as exc:
            if out_of_resources(exc):
                raise
            failure = exc
        else:
            return conn
    raise failure if failure is not None else OSError(0, f"{host} has no address")


def peer_of(conn: _Connection, tls: BackendTLS, built_with: BackendTLS | None) -> Peer:
    """Who the handshake on `conn` authenticated under `tls`, and under `built_with` too
    when a reload gave the pool other settings since (`HttpPool.retrust`: the pins and
    facts the running requests' records are about); a refusal is `UpstreamError("tls")`."""
    assert conn.transport is not None
    ssl_object = conn.transport.get_extra_info("ssl_object")
    try:
        peer = tls.check(ssl_object)
        if built_with is not None and built_with is not tls:
            peer = built_with.check(ssl_object)
    except TLSRejectedError as exc:
        raise UpstreamError("tls", str(exc)) from exc
    return peer
