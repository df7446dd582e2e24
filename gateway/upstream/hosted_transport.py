"""Whether a hosted call reached an HTTP transport: a LiteLLM adapter's own failure, before
anything could be sent, told from a provider's.

LiteLLM translates an OpenAI request into the provider's format before it sends it. An
adapter that meets a shape it cannot translate raises `TypeError`, `KeyError`,
`AttributeError`, `ValueError` or a bare `Exception`, which LiteLLM 1.108.7 wraps as its
`APIConnectionError` (status 500): by its class, a provider that could not be reached.
gateway/upstream/openai_shapes.py checks the shapes it knows an adapter fails on; this is
the defence behind it. `watching()` gives a call an `Outbound`, and every HTTP request
begun while it is watched (by httpx's or httpx2's `send`, the OpenAI SDK's client, or
aiohttp's `ClientSession._request`, the funnels every LiteLLM provider call goes through)
marks it `reached` before anything is written. `hosted_error(..., sent=False)` then reads
such a failure as `untranslated` (gateway/upstream/hosted_errors.py): not the provider
failing, so no breaker verdict; the next backend is tried, and the client gets 400 if
none serves.

A request marks the call when it begins, whether or not a byte left. A call LiteLLM
makes through some other library than these (`requests` for google-auth's token
refresh, boto3) marks nothing: its failure reads as NOT sent, and if it ends in a data
error, as `untranslated`; so such a failure is never charged to the provider's breaker,
but it still fails over like the provider's. The wrappers are installed once,
when LiteLLM is loaded (gateway/upstream/litellm_runtime.py); outside a watched call they
only read a context variable.

What httpx reads of a watched call's answers is bounded by `limits.max_response_bytes`
(gateway/upstream/hosted_bound.py): LiteLLM and the OpenAI SDK read a whole answer into
memory, and a stream's lines whole, before the gateway sees any of it, so a hostile or
compromised provider answering 2 GB (or one endless SSE line) grew the gateway by about
five times that. Its sync `send` too: LiteLLM serves some providers (`maritalk/`,
`amazon_nova/`, `oobabooga/`, `nlp_cloud/`, `petals/`) only synchronously, in a worker
thread that inherits the call's context, and read their answers whole.

Where a watched call's requests go is the call's to say, not the environment's
(`install_call_routes`): an httpx client LiteLLM makes outside the factories
gateway/upstream/litellm_runtime.py wraps (the Azure SDK client it builds for a Cloudflare
AI Gateway URL, a text-completion handler's own) mounted `HTTP_PROXY` and the like from the
environment, and its sync clients (a provider it serves only synchronously, in a worker
thread) went straight to the provider past the backend's `proxy`. Within a watched call
every httpx client sends on its own transport, never a mount, and one on httpx's transport
goes through the backend's `proxy` (LiteLLM's aiohttp transport asks `call_proxy`).
Nor does a watched call's `send` follow a redirect, whichever client it is on (that Azure
client followed a 307 to any host, the prompt resent there).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final
from weakref import WeakKeyDictionary

from gateway.upstream.hosted_bound import (
    UNBOUNDED,
    AnswerTooLarge,
    bounded_send,
    bounded_send_sync,
    in_bounded_send,
)
from gateway.upstream.hosted_tunnel import bound_tunnel, cap_connect

__all__ = [
    "AnswerTooLarge",
    "Outbound",
    "call_proxy",
    "deadline_mover",
    "install_call_routes",
    "install_transport_marks",
    "watched",
    "watching",
]

# (module, class, method): where a request leaves for the network. httpx is LiteLLM's;
# httpx2 the OpenAI SDK's (which takes either); aiohttp LiteLLM's default transport under
# httpx and its own handler for some providers.
_FUNNELS: Final = (
    ("httpx", "AsyncClient", "send"),
    ("httpx", "Client", "send"),
    ("httpx2", "AsyncClient", "send"),
    ("httpx2", "Client", "send"),
    ("aiohttp", "ClientSession", "_request"),
)
_MARK: Final = "_owngate_marks_outbound"
# (module, client class, its transport class that can go through a proxy): the clients
# whose route a watched call decides (`install_call_routes`).
_ROUTED: Final = (
    ("httpx", "Client", "HTTPTransport"),
    ("httpx", "AsyncClient", "AsyncHTTPTransport"),
    ("httpx2", "Client", "HTTPTransport"),
    ("httpx2", "AsyncClient", "AsyncHTTPTransport"),
)
_ROUTES_MARK: Final = "_owngate_call_routes"
# client -> {proxy URL: a transport of the client's kind through it, same TLS trust}
_PROXY_ROUTES: WeakKeyDictionary[Any, dict[str, Any]] = WeakKeyDictionary()
_ROUTES_LOCK: Final = threading.Lock()  # sync clients send from LiteLLM's worker threads


class Outbound:
    """One watched hosted call: `reached` once any HTTP request of it began; `max_bytes`
    bounds what is read of each answer (None: unbounded); `proxy`, the backend's `proxy`
    its requests go through (None: straight to the provider); `cut` says why one was cut;
    `on_head`, when set, is called as a bounded answer's head has arrived (before its
    body is read); `ended` once the watched block is left (answered, failed, timed out or
    cancelled): a sync read in LiteLLM's worker thread, which no cancellation reaches,
    stops at its next read (gateway/upstream/hosted_bound.py); `answer`, the body of the
    last whole 2xx answer read within `max_bytes` (gateway/upstream/hosted_finish.py);
    `addresses`, the media hosts its check looked up, and `tenant`, whose call it is
    (gateway/upstream/hosted_names.py)."""

    __slots__ = (
        "addresses",
        "answer",
        "cut",
        "ended",
        "max_bytes",
        "on_head",
        "proxy",
        "reached",
        "tenant",
    )

    def __init__(self, max_bytes: int | None = None, proxy: str | None = None) -> None:
        self.reached = self.ended = False
        self.max_bytes = max_bytes
        self.proxy = proxy
        self.cut: str | None = None
        self.on_head: Callable[[], None] | None = None
        self.answer: bytes | None = None
        # the media hosts the request's check looked up, and what it found (hosted_names.py)
        self.addresses: dict[str, list[str]] = {}
        self.tenant = ""  # whose call: its part of the client lookups (hosted_names.py)


# The call being watched in this context (tasks LiteLLM starts inherit it).
_WATCHED: ContextVar[Outbound | None] = ContextVar("owngate_hosted_outbound", default=None)


@contextmanager
def watching(max_bytes: int | None = None, proxy: str | None = None) -> Iterator[Outbound]:
    """Watch the HTTP requests made in this block (and the tasks it starts); with
    `max_bytes`, bound what httpx reads of their answers (`_bounded_send`); with `proxy`,
    send them through it (`call_proxy`)."""
    outbound = Outbound(max_bytes, proxy)
    token = _WATCHED.set(outbound)
    try:
        yield outbound
    finally:
        outbound.ended = True
        _WATCHED.reset(token)


def watched() -> Outbound | None:
    """The hosted call being watched in this context, None outside one."""
    return _WATCHED.get()


def deadline_mover(deadline: asyncio.Timeout, by: float | None) -> Callable[[], None]:
    """An `Outbound.on_head` that moves `deadline` (of the running loop) to `by`, unless
    it has expired already (its cancel is on its way): at once when called on that loop
    (httpx's async read), else handed to it (the sync read in LiteLLM's worker thread)."""
    loop = asyncio.get_running_loop()

    def move() -> None:
        if not deadline.expired():
            deadline.reschedule(by)

    def on_head() -> None:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            move()
        else:
            loop.call_soon_threadsafe(move)

    return on_head


async def call_proxy(_transport: Any, _request: Any) -> str | None:
    """The proxy of the watched call a request belongs to, None outside one: what
    LiteLLM's aiohttp transport asks (`_get_proxy_settings`, in place of the
    environment's `HTTP_PROXY` and the like; gateway/upstream/litellm_runtime.py)."""
    outbound = _WATCHED.get()
    return None if outbound is None else outbound.proxy


def install_call_routes() -> None:
    """Make every httpx (and httpx2) client choose a watched call's transport by the call:
    its own transport, never a mount (an environment proxy), and through the backend's
    `proxy` where that transport is httpx's own; idempotent."""
    for module_name, class_name, transport_name in _ROUTED:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        owner = getattr(module, class_name)
        method = owner._transport_for_url
        if getattr(method, _ROUTES_MARK, False):
            continue
        routed = _routed(method, getattr(module, transport_name))
        setattr(routed, _ROUTES_MARK, True)
        owner._transport_for_url = routed


def _routed(method: Any, proxying: type) -> Any:
    """`method` (a client's `_transport_for_url`) deciding by the watched call, if any."""

    @functools.wraps(method)
    def transport_for_url(client: Any, url: Any) -> Any:
        outbound = _WATCHED.get()
        if outbound is None:
            return method(client, url)
        own = client._transport
        if outbound.proxy is None or not isinstance(own, proxying):
            return own  # LiteLLM's aiohttp transport takes the proxy itself (`call_proxy`)
        return _proxy_route(client, own, outbound.proxy, proxying)

    return transport_for_url


def _proxy_route(client: Any, own: Any, proxy: str, proxying: type) -> Any:
    """The transport through `proxy` kept for `client`, made on first use with the TLS
    context (trust, client certificate) of its own transport `own`."""
    with _ROUTES_LOCK:
        routes = _PROXY_ROUTES.setdefault(client, {})
        route = routes.get(proxy)
        if route is None:
            context = getattr(getattr(own, "_pool", None), "_ssl_context", None)
            route = bound_tunnel(proxying(proxy=proxy, verify=True if context is None else context))
            routes[proxy] = route
        return route


def _mark() -> None:
    outbound = _WATCHED.get()
    if outbound is not None:
        outbound.reached = True


def install_transport_marks() -> None:
    """Wrap each funnel so that it marks the watched call first; idempotent. A library
    that is not installed has nothing to wrap."""
    for module_name, class_name, method_name in _FUNNELS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        owner = getattr(module, class_name)
        method = getattr(owner, method_name)
        if getattr(method, _MARK, False):
            continue
        bounds = module_name if method_name == "send" else None
        setattr(owner, method_name, _marking(method, bounds, bounded_only=bounds is None))


def _marking(method: Any, bounds: str | None = None, *, bounded_only: bool = False) -> Any:
    """`method` marking the watched call; `bounds`, the module of a `send` (httpx, httpx2;
    async, or sync in LiteLLM's worker thread) whose answers are bounded
    (gateway/upstream/hosted_bound.py); `bounded_only`:
    an async request method (aiohttp's) that a bounded call may use only from within a
    bounded `send`, else it is refused unsent (`UNBOUNDED`)."""
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def marked_async(*args: Any, **kwargs: Any) -> Any:
            outbound = _WATCHED.get()
            bounded = outbound is not None and outbound.max_bytes is not None
            if bounded_only and bounded and not in_bounded_send():
                assert outbound is not None
                outbound.cut = UNBOUNDED  # refused before a byte is sent
                raise AnswerTooLarge(UNBOUNDED)
            _mark()
            if bounds and outbound is not None:  # never a 3xx followed, whoever made the client
                kwargs["follow_redirects"] = False
                cap_connect(
                    args[1] if len(args) > 1 else kwargs.get("request")
                )  # within limits.connect_timeout_s (hosted_tunnel.py)
            if bounds and outbound is not None and outbound.max_bytes is not None:
                return await bounded_send(bounds, method, outbound, *args, **kwargs)
            return await method(*args, **kwargs)

        wrapper: Any = marked_async
    else:

        @functools.wraps(method)
        def marked(*args: Any, **kwargs: Any) -> Any:
            _mark()
            outbound = _WATCHED.get()
            if outbound is not None:  # a sync `send`: never a 3xx followed
                kwargs["follow_redirects"] = False
                if bounds:  # within limits.connect_timeout_s (hosted_tunnel.py)
                    cap_connect(args[1] if len(args) > 1 else kwargs.get("request"))
            if bounds and outbound is not None and outbound.max_bytes is not None:
                return bounded_send_sync(bounds, method, outbound, *args, **kwargs)
            return method(*args, **kwargs)

        wrapper = marked
    setattr(wrapper, _MARK, True)
    return wrapper
