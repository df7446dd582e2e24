"""Calls to hosted providers (OpenAI, Anthropic, ...) through LiteLLM, answered in OpenAI format.

One `HostedClient` per `hosted` backend. It turns the client's OpenAI request into a
`litellm.acompletion` / `atext_completion` / `aembedding` call with the backend's
`provider_model`, `base_url` (as `api_base`) and the key read from the environment variable
the config names, and returns a `HostedResponse`: OpenAI JSON bytes, or OpenAI SSE events
relayed chunk by chunk as the provider sends them. `prepare` checks the request without
sending it (before the attempt's dispatch record), `send_prepared` sends it; `send` both.

LiteLLM is imported by the first `prepare` (`gateway.upstream.litellm_runtime`), offline and
silent; if that import fails, `prepare` raises `HostedUnavailable` (nothing is sent, and the
next request tries the import again), so a request that cannot be sent fails before the
caller's dispatch record. Every other failure comes out as `HostedError` with one of five
kinds and a message that carries no URL, key or content (gateway/upstream/hosted_errors.py).
For streams the first chunk is awaited inside `send()`, so a provider that fails (or closes
the stream empty) before answering fails there, where the gateway can still try another
backend; a later failure (a stream closed unfinished too) is raised from `chunks()`. What
is read of an answer, or a stream's line, is bounded (`max_answer_bytes`, hosted_bound.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from functools import partial
from types import ModuleType
from typing import Any, Final

from gateway.config.schema import BackendSettings
from gateway.upstream import openai_wire
from gateway.upstream.hosted_errors import (
    HostedError,
    HostedErrorKind,
    HostedUnavailable,
    forget_frames,
    hosted_error,
    local_reason,
)
from gateway.upstream.hosted_finish import Unfinished, relabel, short_of, unfinished
from gateway.upstream.hosted_handoff import guarding_handoffs
from gateway.upstream.hosted_prepare import Prepared, prepare_request
from gateway.upstream.hosted_response import HostedResponse, provider_ids
from gateway.upstream.hosted_stream import ProviderStream, close_stream, encoded, made_up_end
from gateway.upstream.hosted_support import SupportTable
from gateway.upstream.hosted_transport import Outbound, deadline_mover, watching
from gateway.upstream.litellm_clients import no_redirect_http_client
from gateway.upstream.litellm_runtime import aclose_litellm_clients, check_base_url_environment
from gateway.upstream.media_urls import Resolver, tenant_resolver
from gateway.upstream.openai_wire import Endpoint
from gateway.upstream.provider_regions import pinned_regions
from gateway.upstream.text_client import lending

__all__ = [
    "HostedClient",
    "HostedError",
    "HostedErrorKind",
    "HostedResponse",
    "HostedUnavailable",
    "Prepared",
    "hosted_api_key",
    "hosted_error",
    "local_reason",
]

_CALLS: Final[dict[str, str]] = {
    "chat": "acompletion",
    "completions": "atext_completion",
    "embeddings": "aembedding",
}
# LiteLLM 1.108.7 sends `user` on OpenAI's wire only for a model in its OpenAI catalog
# (`OpenAIGPTConfig.get_supported_openai_params`): `openai/<any other name>`, a fine-tune or an
# OpenAI-compatible server's model, lost it on chat (never on completions). The gateway
# forwards it (the tenant's digest, tenant_ids.py), as docs/api.md says, on these routes.
_USER_ROUTES: Final = frozenset({"openai", "custom_openai", "openai_like"})
_JSON: Final = b"application/json"
_SSE: Final = b"text/event-stream"


def hosted_api_key(backend: BackendSettings, environ: Mapping[str, str]) -> str | None:
    """The key a hosted backend sends: the variable its `api_key_env` names (None when it
    names none: LiteLLM then reads the provider's own variable). Raises ValueError when
    that variable is unset or empty: the gateway does not start without it."""
    if backend.api_key_env is None:
        return None
    key = environ.get(backend.api_key_env) or None
    if key is None:
        raise ValueError(
            f"backend {backend.id!r}: environment variable {backend.api_key_env} "
            "(api_key_env) is not set or empty"
        )
    return key


class HostedClient:
    """Sends OpenAI requests for one `hosted` backend through LiteLLM."""

    def __init__(
        self,
        backend: BackendSettings,
        *,
        environ: Mapping[str, str],
        timeout_s: float,
        response_timeout_s: float | None = None,
        resolve: Callable[[str], Resolver] = tenant_resolver,
        max_answer_bytes: int | None = None,
        idle_timeout_s: float | None = None,
    ) -> None:
        """`timeout_s` bounds each wait on the provider (LiteLLM's `timeout`), a
        stream's head and first chunk together, and a whole answer's head (with
        `max_answer_bytes`, whose reads tell when it is in);
        `response_timeout_s` a whole (non-stream) answer, however steadily it arrives;
        `idle_timeout_s` each wait for a stream's next chunk after its first (None:
        unbounded): a provider sending only SSE comments or blank lines, which LiteLLM
        reads and drops, restarts LiteLLM's per-read timeout forever;
        `resolve(tenant)` looks up the hosts of URLs in a tenant's content parts
        (gateway/upstream/media_urls.py)."""
        if backend.kind != "hosted":
            raise ValueError(f"backend {backend.id!r} is {backend.kind}, not hosted")
        self.backend_id = backend.id
        self._models = {m.name: m.provider_model for m in backend.models if m.provider_model}
        first = next(iter(self._models.values()), "")
        self.provider = backend.provider or first.split("/", 1)[0] or "provider"
        self._api_base = backend.base_url
        self._proxy = backend.proxy  # None: straight to the provider
        check_base_url_environment(
            backend.id, self._models.values(), environ, has_base_url=backend.base_url is not None
        )
        self._pins = pinned_regions(  # each call's AWS Region / Vertex location: not the env's
            backend.id, backend.region, self._models.values(), environ, base_url=backend.base_url
        )
        self._api_key = hosted_api_key(backend, environ)
        self._timeout_s = timeout_s
        self._resolve = resolve
        self._response_timeout_s = response_timeout_s
        self._max_answer_bytes = max_answer_bytes
        self._idle_timeout_s = idle_timeout_s
        self._text_client: tuple[asyncio.AbstractEventLoop, Any] | None = None
        self._support = SupportTable(self.provider, backend.base_url)

    def __repr__(self) -> str:
        return f"HostedClient({self.backend_id!r}, provider={self.provider!r})"

    async def send(
        self, endpoint: Endpoint, doc: dict[str, Any], upstream_model: str, tenant: str = ""
    ) -> HostedResponse:
        """Check the request for this provider (`prepare`), then call the provider;
        returns once the answer (or a stream's first chunk) is in."""
        prepared = await self.prepare(endpoint, doc, upstream_model, tenant)
        return await self.send_prepared(prepared)

    async def prepare(
        self, endpoint: Endpoint, doc: dict[str, Any], upstream_model: str, tenant: str = ""
    ) -> Prepared:
        """The request as this provider gets it, checked without sending anything
        (gateway/upstream/hosted_prepare.py): a refused request raises `HostedError`
        ("status", 400, "not sent"), LiteLLM failing to load `HostedUnavailable`."""
        provider_model = self._models.get(upstream_model)
        if provider_model is None:
            raise ValueError(f"backend {self.backend_id!r} does not serve {upstream_model!r}")
        resolve = partial(self._resolve, tenant)
        prepared = await prepare_request(
            endpoint,
            doc,
            provider_model,
            provider=self.provider,
            resolve=resolve,
            support=self._support,
        )
        return prepared._replace(tenant=tenant)

    async def send_prepared(self, prepared: Prepared) -> HostedResponse:
        """Call the provider with a request `prepare` checked."""
        endpoint, doc, params, provider_model, litellm, addresses, tenant = prepared
        # Watched (hosted_transport.py): LiteLLM's failure to translate told from the provider's.
        # A stream's head and first chunk by the first-byte timeout, as a private
        # backend's (`limits.first_byte_timeout_s`): LiteLLM's own `timeout` is each read's,
        # and a provider that kept writing header lines, interim responses or SSE comments
        # held the attempt (and, without `limits.stream_timeout_s`, its client) for as long
        # as it liked, never failing over.
        is_stream = bool(params.get("stream"))
        by = asyncio.get_running_loop().time() + self._timeout_s if is_stream else None
        with watching(self._max_answer_bytes, self._proxy) as outbound:
            outbound.addresses = addresses  # a media download goes where the check looked
            outbound.tenant = tenant  # its redirects' lookups: the tenant's part (hosted_names)
            result = await self._call(litellm, endpoint, params, provider_model, outbound, by)
            first = await self._first_chunk(result, outbound, by) if is_stream else None
        if not params.get("stream"):
            route = provider_model.partition("/")[0]  # judges Cohere's format (hosted_finish)
            why = None if endpoint == "embeddings" else unfinished(outbound.answer, route)
            if why is not None:  # LiteLLM's "stop"
                raise Unfinished(self.provider, why)
            relabel(result, outbound.answer, route)
            in_base64 = params.get("encoding_format") == "base64"  # openai_wire's notes
            encode = partial(openai_wire.encode_response, endpoint, result, in_base64=in_base64)
            body, usage = encoded(self.provider, encode)
            short = short_of(endpoint, params, body, outbound.answer)
            if short is not None:  # fewer or other choices than asked
                raise Unfinished(self.provider, short)
            return HostedResponse(
                content_type=_JSON,
                body=body,
                usage=usage,
                provider_ids=provider_ids(result, result),
            )
        stream = ProviderStream(
            result,
            first,
            endpoint,
            openai_wire.include_usage(doc),
            self.provider,
            secrets=self._secrets(),
            idle_s=self._idle_timeout_s,
        )
        return HostedResponse(
            content_type=_SSE,
            stream=stream,
            provider_ids=provider_ids(first, result),
        )

    async def _call(
        self,
        litellm: ModuleType,
        endpoint: Endpoint,
        params: dict[str, Any],
        provider_model: str,
        outbound: Outbound,
        by: float | None = None,
    ) -> Any:
        """LiteLLM's call: its result, or `HostedError`; a stream's call returns by `by`
        (event-loop time), a whole answer's within `response_timeout_s`, its head within
        `timeout_s`."""
        call = getattr(litellm, _CALLS[endpoint])
        try:
            options = self._options(provider_model)
            if "user" in params and provider_model.partition("/")[0] in _USER_ROUTES:
                options["allowed_openai_params"] = ["user"]
            if endpoint == "completions":
                options.update(self._text_completion_client(litellm, provider_model))
            lent = options.get("client")  # a bridged call passes it on to no one (text_client.py)
            now = asyncio.get_running_loop().time()
            if by is None and not params.get("stream") and self._response_timeout_s:
                by = now + self._response_timeout_s
            # A whole answer's head by the first-byte timeout too, as a private backend's:
            # header lines or interim responses dripping in held it to `by` (600 s).
            head_by = by
            if not params.get("stream") and outbound.max_bytes is not None:
                head_by = now + self._timeout_s if by is None else min(by, now + self._timeout_s)
            # a TimeoutError is classified `timeout`
            async with asyncio.timeout_at(head_by) as deadline:
                if head_by != by:  # on this loop, or from LiteLLM's worker thread
                    outbound.on_head = deadline_mover(deadline, by)
                # a request LiteLLM built in its worker thread for a call that ended
                # meanwhile is closed, not left unawaited (hosted_handoff.py)
                with lending(lent), guarding_handoffs():
                    return await call(**params, **options)
        except Exception as exc:  # noqa: BLE001 - every LiteLLM failure becomes a HostedError
            failure = self._failure(exc, outbound)
        # Raised outside `except`, so LiteLLM's exception (provider text that may quote the
        # prompt, URLs) is neither its cause nor its context.
        try:
            raise failure
        finally:
            del failure  # not held by this frame, which its traceback holds (a cycle)

    def _failure(self, exc: BaseException, outbound: Outbound) -> HostedError:
        secrets, sent, cut = self._secrets(), outbound.reached, outbound.cut
        try:
            return hosted_error(exc, self.provider, secrets=secrets, sent=sent, cut=cut)
        finally:
            forget_frames(exc)  # LiteLLM's frames: the request's messages among their locals

    async def aclose(self) -> None:
        """Close this client's connections and LiteLLM's shared client cache: at shutdown.

        Call it on the event loop that made the calls. LiteLLM's cache serves every
        hosted backend, so this is for shutdown, not for retiring one backend.
        """
        if self._text_client is not None:
            loop, client = self._text_client
            self._text_client = None
            if loop is asyncio.get_running_loop():
                await client.close()
        await aclose_litellm_clients()

    def _secrets(self) -> tuple[str, ...]:
        """What a LiteLLM message must never carry to a client: the key, the base URL."""
        return tuple(v for v in (self._api_key, self._api_base) if v)

    def _options(self, provider_model: str) -> dict[str, Any]:
        options: dict[str, Any] = {
            "model": provider_model,
            "timeout": self._timeout_s,
            "num_retries": 0,  # retries and fallbacks are the gateway's decision
            "max_retries": 0,
            "drop_params": True,  # chat: what it drops is advisory (hosted_support.py)
        }
        if self._api_base is not None:
            options["api_base"] = self._api_base
        if self._api_key is not None:
            options["api_key"] = self._api_key
        options.update(self._pins.get(provider_model, {}))
        return options

    def _text_completion_client(self, litellm: ModuleType, provider_model: str) -> dict[str, Any]:
        """An OpenAI SDK client this object owns, for LiteLLM's text-completion handler.

        LiteLLM 1.108.7 builds a new `AsyncOpenAI` (and connection pool) for every
        `atext_completion` that goes to an OpenAI-style `/v1/completions` and never closes
        it: one leaked connection per request. Handing it a client avoids that; it is kept
        per event loop and closed by `aclose()`. Other providers get `{}`: LiteLLM turns
        their text completions into chat calls on its cached clients.
        """
        resolved = litellm.get_llm_provider(
            provider_model, api_base=self._api_base, api_key=self._api_key
        )
        _, provider, key, base = resolved
        text_providers = {"openai", "text-completion-openai"}
        text_providers.update(litellm.openai_text_completion_compatible_providers)
        if provider not in text_providers or not key:
            return {}
        loop = asyncio.get_running_loop()
        if self._text_client is None or self._text_client[0] is not loop:
            import openai  # loaded with LiteLLM already

            client = openai.AsyncOpenAI(
                api_key=key,
                base_url=base,
                max_retries=0,
                timeout=self._timeout_s,
                http_client=no_redirect_http_client(),  # the policy says where, not a 307
            )
            self._text_client = (loop, client)
        return {"client": self._text_client[1]}

    async def _first_chunk(self, stream: Any, outbound: Outbound, by: float | None) -> Any:
        """The stream's first chunk; `HostedError` when the provider failed, or closed the
        stream without a chunk of its own (LiteLLM's made-up end, `made_up_end`), before
        anything was relayed: another backend may serve."""
        try:
            async with asyncio.timeout_at(by):  # a TimeoutError is classified `timeout`
                first = await anext(stream)
            if not made_up_end(stream):
                return first
            failure = HostedError("protocol", f"{self.provider} closed the stream unanswered")
        except StopAsyncIteration:
            failure = HostedError("protocol", f"{self.provider} closed the stream unanswered")
        except Exception as exc:  # noqa: BLE001 - every LiteLLM failure becomes a HostedError
            failure = self._failure(exc, outbound)  # a stream may send on its first read
        except BaseException:
            await close_stream(stream)  # cancelled: the provider must stop too
            raise
        await close_stream(stream)
        try:
            raise failure
        finally:
            del failure  # not held by this frame, which its traceback holds (a cycle)
