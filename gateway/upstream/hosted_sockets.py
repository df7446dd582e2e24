"""Hosted providers' connections counted in the process's share of descriptors.

LiteLLM 1.108.7 sends every hosted call through httpx over its aiohttp transport
(`AsyncHTTPHandler.create_aiohttp_transport`), one `aiohttp.TCPConnector` per client it
caches (per provider, settings and event loop). Each connector keeps every connection a
call gave back for 15 s (`AIOHTTP_KEEPALIVE_TIMEOUT`), up to 1,000 in use
(`AIOHTTP_CONNECTOR_LIMIT`; the idle ones are not within that limit at all), and nothing
of the gateway's counted them: a client with a key sending bursts to several hosted
backends in turn made the process reach its open-file limit (client connections reset,
the policy watcher failing with EMFILE), as idle private connections did before
gateway/upstream/sockets.py. `load_litellm` makes LiteLLM build `CountedConnector`s
instead: each joins the process's `BackendSockets` (the share the listener's cap leaves
backend connections), reports its open connections, in use and idle, and, about to open
one when the share is full, first has the idle connection that waited longest closed (a
private pool's first, then a hosted one's). Idle connections are still kept for reuse
within the share: a hosted call does not pay a new TLS handshake each time.

Every tenant's calls to a provider share its connector's idle connections, and aiohttp
parses whatever arrives on an idle one, queuing it as the answer to the next request sent
on it: a provider (or whoever answers at its URL) that wrote a second response after one
tenant's answer had ended had another tenant's next request answered with it. A pooled
connection is out of step when aiohttp holds anything of it unanswered (a response or part
of one, bytes after an answer: its `should_close`) or bytes (or the provider's close) wait
unread in its socket as a call takes it (`_out_of_step`): it is closed, never reused, as
the private pools do (gateway/upstream/connection.py, `unread`).

Hosted providers are HTTPS, and the event loop's TLS transport (asyncio's or uvloop's)
reads the socket into OpenSSL, which hands on only whole records: a response written after
an answer whose last TLS record had arrived but for its last bytes sat in OpenSSL's record
buffer, which no API tells (`SSLObject.pending()` counts decrypted bytes only), neither in
aiohttp nor in the socket, and the provider's next bytes, sent after the next tenant's
request, completed it as that request's answer. So each connection also notes, as it goes
idle, how many bytes its socket has received (`received_bytes`, Linux's `TCP_INFO`):
one that received any more while idle is out of step, whatever layer holds them. Where the
kernel does not tell (not Linux), only the checks above hold.

This reads aiohttp's connector state (`_conns`, `_acquired`: aiohttp 3.14.5, pinned);
nothing here runs unless LiteLLM is loaded (aiohttp is imported with this module).
"""

from __future__ import annotations

import asyncio
import select
from typing import Any

from aiohttp import TCPConnector

from gateway.upstream.hosted_names import HostedResolver
from gateway.upstream.sockets import (
    BackendSockets,
    hosted_connect_timeout,
    hosted_share,
    received_bytes,
)

__all__ = ["CountedConnector"]


class CountedConnector(TCPConnector):
    """An aiohttp connector whose connections count in the process's share."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("resolver") is None:  # not the loop's threads: hosted_names.py
            kwargs["resolver"] = HostedResolver()
        super().__init__(*args, **kwargs)
        self._share: BackendSockets | None = hosted_share()
        if self._share is not None:
            self._share.join(self)

    def open_count(self) -> int:
        """Connections in use (or being opened) and idle ones."""
        return len(self._acquired) + sum(len(idle) for idle in self._conns.values())

    def oldest_idle(self) -> float | None:
        """When the connection idle longest went idle (each host's are oldest first)."""
        times = [idle[0][1] for idle in self._conns.values() if idle]
        return min(times) if times else None

    def drop_oldest_idle(self) -> None:
        """Close the connection idle longest, as aiohttp closes an expired one."""
        oldest = min(
            (key for key, idle in self._conns.items() if idle),
            key=lambda key: self._conns[key][0][1],
            default=None,
        )
        if oldest is None:
            return
        idle = self._conns[oldest]
        proto, _ = idle.popleft()
        if not idle:
            del self._conns[oldest]
        self._close_idle(oldest, proto)

    def _close_idle(self, key: Any, proto: Any) -> None:
        """Close `proto`, taken out of the idle ones of `key`, as aiohttp closes one."""
        transport = proto.transport
        proto.close()
        if key.is_ssl and not self._cleanup_closed_disabled:
            self._cleanup_closed_transports.append(transport)

    async def _get(self, key: Any, traces: Any) -> Any:
        # Before aiohttp hands out an idle connection of `key`: those out of step closed.
        idle = self._conns.get(key)
        if idle:
            for entry in [entry for entry in idle if _out_of_step(entry[0])]:
                idle.remove(entry)
                self._close_idle(key, entry[0])
            if not idle:
                del self._conns[key]
        return await super()._get(key, traces)

    def _release(self, key: Any, protocol: Any, *, should_close: bool = False) -> None:
        # What its socket had received as the connection goes idle (`_out_of_step`).
        protocol.owngate_received = _received(protocol)
        super()._release(key, protocol, should_close=should_close)

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:
        # aiohttp counted this one in `_acquired` already (its placeholder): opening=1
        if self._share is not None:
            self._share.make_room(opening=1)
        # Opened (name lookup, TCP, a proxy's CONNECT, the TLS handshake) within
        # `limits.connect_timeout_s`, as a private pool's connections are: LiteLLM gives
        # aiohttp its `timeout` (the first-byte timeout) for connecting and the event loop
        # waits 60 s for a TLS handshake, so a provider (or whatever answers at its address)
        # that accepted and never finished the handshake held each attempt a minute before
        # it failed over. aiohttp turns the TimeoutError into its connection timeout.
        async with asyncio.timeout(hosted_connect_timeout()):
            return await super()._create_connection(req, traces, timeout)


def _out_of_step(proto: Any) -> bool:
    """Whether an idle connection's protocol holds anything unanswered (aiohttp's
    `should_close`: a queued response, part of one, bytes after an answer), its socket
    received anything since it went idle (held by a TLS layer, part of a record), or bytes
    or a close wait unread in its socket: what it would read next is no answer to the
    request about to be sent on it."""
    if proto.should_close:
        return True
    transport = proto.transport
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is None:
        return False  # no transport: aiohttp's own `is_connected` check drops it
    idle_from = getattr(proto, "owngate_received", None)
    if idle_from is not None and _received(proto) != idle_from:
        return True
    try:
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True  # cannot tell: not worth the risk


def _received(proto: Any) -> int | None:
    transport = proto.transport
    return received_bytes(None if transport is None else transport.get_extra_info("socket"))
