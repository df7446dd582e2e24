"""A hosted media download's redirect hop is held to the gateway's own address check, and
its connection goes where that check looked (gateway/upstream/hosted_names.py).

The gateway checks a content part's URL (gateway/upstream/media_urls.py) and the download
goes to the addresses it found; a redirect's new host is checked by LiteLLM alone
(`url_utils.validate_url`, on each hop of `safe_get`), whose idea of a public address is
Python's `is_global`: an IPv6 address that carries an IPv4 one (NAT64 `64:ff9b::/96`,
local-use NAT64, 6to4, SIIT) or a site-local one passed, though the gateway's check
refuses each (gateway/media_hosts.py `is_public_address`): a public image URL answering
`302 Location: http://[64:ff9b::a9fe:a9fe]/` (or a name resolving there) had the gateway
fetch cloud metadata through the network's NAT64 translator. And the hop's https
connection looked the name up again (aiohttp's resolver, on the provider's lookup
threads), a second answer the check never saw. (No socket is opened: names resolve
through a patched `getaddrinfo`, literals as themselves.)
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import socket
import threading
from typing import Any

import pytest

from gateway.upstream import sockets
from gateway.upstream.hosted_transport import Outbound, watching
from gateway.upstream.litellm_runtime import load_litellm
from tests.helpers.gateways import LITELLM_WARNINGS

pytestmark = LITELLM_WARNINGS

WAIT_S = 60.0  # bounds a hang only
CONNECT_S = 0.5  # `limits.connect_timeout_s`: each lookup's wait
PUBLIC = "93.184.216.34"
# What each name a redirect names resolves to (the client's DNS server says so).
ANSWERS = {
    "nat64.owngate-test.invalid": "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "sixtofour.owngate-test.invalid": "2002:a00:5::1",  # 6to4 of 10.0.0.5
    "public.owngate-test.invalid": PUBLIC,
}
HANGING = ".hangs.owngate-test.invalid"  # one tenant's names: its DNS server never answers
# Literal hosts a redirect may name: non-public to the gateway, public to `is_global`.
LITERALS = ["[64:ff9b::a9fe:a9fe]", "[::ffff:0:a9fe:a9fe]", "[2002:a9fe:a9fe::1]", "[fec0::1]"]


class _Resolver:
    """`getaddrinfo` answering `ANSWERS`' names (counted), hanging on names under
    `HANGING` until `release` (then failing, as a resolver's timeout does), every other
    name as usual."""

    def __init__(self) -> None:
        self._real = socket.getaddrinfo
        self.asked: list[str] = []
        self.release = threading.Event()

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(HANGING):
            self.asked.append(host)
            self.release.wait(WAIT_S * 2)  # bounded: a failed test's lookups end too
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        if host not in ANSWERS:
            return self._real(host, port, *args, **kwargs)
        self.asked.append(host)
        address = ANSWERS[host]
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        number = int(port or 0)
        peer = (address, number, 0, 0) if family == socket.AF_INET6 else (address, number)
        return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", peer)]


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> _Resolver:
    load_litellm()  # as before a hosted call: the rules installed
    answering = _Resolver()
    monkeypatch.setattr(socket, "getaddrinfo", answering)
    monkeypatch.setattr(sockets, "_HOSTED_CONNECT_S", [CONNECT_S])  # as `install` sets it
    return answering


def _validated(url: str, outbound: list[Outbound], tenant: str = "") -> Any:
    """LiteLLM's check of one hop's `url` in a watched hosted call (on a thread, as its
    `asyncio.to_thread` runs it): the rewritten URL, or the exception it raised."""
    url_utils = importlib.import_module("litellm.litellm_core_utils.url_utils")
    done: list[Any] = []

    def run() -> None:
        with watching(1 << 20) as watched:
            with contextlib.suppress(AttributeError):  # (before: no tenant, parts shared)
                watched.tenant = tenant
            outbound.append(watched)
            try:
                done.append(url_utils.validate_url(url))
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                done.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    return done[0]


@pytest.mark.parametrize(
    "host", [*LITERALS, "nat64.owngate-test.invalid", "sixtofour.owngate-test.invalid"]
)
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_redirect_hop_to_an_address_the_gateway_refuses_is_not_fetched(
    resolver: _Resolver, host: str, scheme: str
) -> None:
    url_utils = importlib.import_module("litellm.litellm_core_utils.url_utils")
    found = _validated(f"{scheme}://{host}/latest/meta-data/", [])
    assert isinstance(found, url_utils.SSRFError), found  # before: the rewritten URL


def test_a_redirect_hop_s_connection_goes_where_its_check_looked(resolver: _Resolver) -> None:
    outbound: list[Outbound] = []
    host = "public.owngate-test.invalid"
    assert _validated(f"https://{host}/a.png", outbound) == (f"https://{host}/a.png", host)
    assert resolver.asked == [host]
    resolve = importlib.import_module("gateway.upstream.hosted_names").HostedResolver().resolve

    async def connect() -> list[Any]:
        with watching(1 << 20) as watched:
            watched.addresses = outbound[0].addresses  # the same call's download
            return list(await resolve(host, 443, socket.AF_UNSPEC))

    found = asyncio.run(connect())
    assert [(r["host"], r["hostname"]) for r in found] == [(PUBLIC, host)]
    assert resolver.asked == [host]  # not looked up again


def test_one_tenant_s_hanging_redirect_names_leave_others_their_lookups(
    resolver: _Resolver,
) -> None:
    """Before, `MAX_CLIENT_LOOKUPS` threads for every tenant together: one tenant whose
    redirects named hosts that never resolve held all of them (each until the resolver
    gave up, after its call had), and every other tenant's redirect failed its lookup."""
    names = importlib.import_module("gateway.upstream.hosted_names")
    url_utils = importlib.import_module("litellm.litellm_core_utils.url_utils")
    try:
        hops = [
            threading.Thread(target=_validated, args=(f"https://n{i}{HANGING}/a.png", [], "greedy"))
            for i in range(names.MAX_CLIENT_LOOKUPS)
        ]
        for hop in hops:
            hop.start()
        for hop in hops:
            hop.join(WAIT_S)  # each given up at the connect bound, its lookup still hangs
        host = "public.owngate-test.invalid"
        assert _validated(f"https://{host}/a.png", [], "other") == (f"https://{host}/a.png", host)
        busy = _validated(f"https://late{HANGING}/a.png", [], "greedy")
        assert isinstance(busy, url_utils.SSRFError), busy  # still at its part
    finally:
        resolver.release.set()
        for thread in threading.enumerate():  # their places given back before the next test
            if thread.name == "owngate-hosted-dns":
                thread.join(WAIT_S)
