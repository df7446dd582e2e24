"""The HTTP clients LiteLLM makes for hosted calls: none follows a redirect (the policy
says where a call goes, not a provider's 307), and none keeps the proxy routes httpx
mounted from the environment (gateway/upstream/litellm_runtime.py's notes say why).
`refuse_redirects()` runs once, when LiteLLM loads."""

from __future__ import annotations

import functools
import importlib
from typing import Any

__all__ = ["no_redirect_http_client", "refuse_redirects"]


def refuse_redirects() -> None:
    """Make the HTTP clients LiteLLM creates stop at a redirect (the module's notes)."""
    handlers = importlib.import_module("litellm.llms.custom_httpx.http_handler")
    for handler in (handlers.AsyncHTTPHandler, handlers.HTTPHandler):
        create = handler.create_client
        if getattr(create, "_owngate_no_redirects", False):
            continue

        @functools.wraps(create)
        def create_client(self: Any, *args: Any, _create: Any = create, **kwargs: Any) -> Any:
            self.follow_redirects = False
            return _direct(_no_redirects(_create(self, *args, **kwargs)))

        create_client._owngate_no_redirects = True  # type: ignore[attr-defined]
        handler.create_client = create_client
    openai_llm = importlib.import_module("litellm.llms.openai.common_utils").BaseOpenAILLM
    for name in ("_get_async_http_client", "_get_sync_http_client"):
        make = getattr(openai_llm, name)
        if getattr(make, "_owngate_no_redirects", False):
            continue

        @functools.wraps(make)
        def make_client(*args: Any, _make: Any = make, **kwargs: Any) -> Any:
            return _direct(_no_redirects(_make(*args, **kwargs)))

        make_client._owngate_no_redirects = True  # type: ignore[attr-defined]
        setattr(openai_llm, name, staticmethod(make_client))


def _no_redirects(client: Any) -> Any:
    """`client` (an httpx client, or None: the SDK's default, made by it), set to stop at a
    redirect."""
    if client is not None:
        client.follow_redirects = False
    return client


def _direct(client: Any) -> Any:
    """`client` (an httpx client, or None) without the proxies httpx mounted from the
    environment when it was made (a client without its own transport, or LiteLLM's
    `create_httpx_proxy_mounts`): every request on its own transport, to the URL's host."""
    if client is not None and getattr(client, "_mounts", None):
        client._mounts = {}  # httpx 0.28: the env's proxy (and NO_PROXY) routes, by pattern
    return client


def no_redirect_http_client() -> Any:
    """An httpx client for an OpenAI SDK client that does not follow redirects, over
    LiteLLM's aiohttp transport: its connections are counted as LiteLLM's own are
    (httpx's pool would keep up to 100 idle ones uncounted)."""
    import httpx  # loaded with LiteLLM already (the SDK takes its clients as httpx2's)

    handlers = importlib.import_module("litellm.llms.custom_httpx.http_handler")
    transport = handlers.AsyncHTTPHandler.create_aiohttp_transport()
    return httpx.AsyncClient(transport=transport, follow_redirects=False)
