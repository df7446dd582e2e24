"""Calls to hosted providers (OpenAI, Anthropic, ...) through LiteLLM, answered in OpenAI format.

One `HostedClient` per `hosted` backend. It turns the client's OpenAI request into a
`litellm.acompletion` / `atext_completion` / `aembedding` call with the backend's
`provider_model`, `base_url` (as `api_base`) and the key read from the environment
variable the config names, and returns a `HostedResponse`: OpenAI JSON bytes, or OpenAI
SSE events relayed chunk by chunk as the provider sends them.

LiteLLM is imported on the first call (`gateway.upstream.litellm_runtime`), offline and
silent. Every failure comes out as `HostedError` with one of four kinds and a message
that carries no URL, key or content. For streams the first chunk is awaited inside
`send()`, so a provider that fails before answering fails there, where the gateway can
still try another backend; a failure after that is raised from `chunks()`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from functools import partial
from types import ModuleType
from typing import Any, Final, Literal, TypeVar

from gateway.config.schema import BackendSettings
from gateway.upstream import openai_wire
from gateway.upstream.litellm_runtime import (
    aclose_litellm_clients,
    aload_litellm,
    check_base_url_environment,
)
from gateway.upstream.openai_wire import Endpoint

__all__ = [
    "HostedClient",
    "HostedError",
    "HostedErrorKind",
    "HostedResponse",
    "hosted_api_key",
    "hosted_error",
    "local_reason",
]

HostedErrorKind = Literal["connect", "timeout", "status", "protocol"]
T = TypeVar("T")

_CALLS: Final[dict[str, str]] = {
    "chat": "acompletion",
    "completions": "atext_completion",
    "embeddings": "aembedding",
}
_JSON: Final = b"application/json"
_SSE: Final = b"text/event-stream"
_ERROR_TYPE = re.compile(r"""["']type["']\s*:\s*["']([a-z_]{1,40})["']""")
# Error `type` values of the Anthropic and OpenAI APIs (their "Errors" references). Only
# these are repeated in messages: a provider that quotes the request back could otherwise
# put a word of the prompt where a type is expected.
_KNOWN_ERROR_TYPES: Final = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "rate_limit_error",
        "api_error",
        "overloaded_error",
        "billing_error",
        "timeout_error",
        "server_error",
        "insufficient_quota",
        "tokens_exceeded_error",
    }
)
_CHAIN_LIMIT = 16
# `litellm.BadRequestError: ` and `AnthropicException - `, repeated as LiteLLM nests them.
_LITELLM_PREFIX = re.compile(r"^(?:\s*(?:litellm\.\w+:|\w*Exception\s+-))+\s*")
_QUOTED = re.compile(r"""[\[\]{}'"`=]|Received\b|Traceback\b""")
_SENTENCE_END = re.compile(r"(?<=\.)\s|\n")
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S*", re.IGNORECASE)


class HostedError(Exception):
    """A hosted provider could not be reached, timed out, refused, or answered badly.

    `message` names the provider and, for `status`, the HTTP status and the provider's
    error type (`overloaded_error`), or why LiteLLM refused the request before sending it
    (a client error: `status` 400, the message says "not sent"); it never holds URLs, keys
    or request content.
    """

    def __init__(
        self,
        kind: HostedErrorKind,
        message: str,
        *,
        status: int | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.kind: HostedErrorKind = kind
        self.status = status
        self.message = message
        self.param = param  # the request field at fault, when known


class HostedResponse:
    """A provider's answer: `body` when complete, `chunks()` for both shapes.

    Streams: `chunks()` yields one `data: {...}\\n\\n` event per provider chunk and ends
    with `data: [DONE]\\n\\n`; call `aclose()` when the client goes away (it closes the
    provider connection, which stops the provider's work) and after the relay in any case.
    `usage` holds the token counts once the provider reported them, even when the client
    did not ask for the usage chunk. `ignored_fields` names request fields not sent.
    """

    def __init__(
        self,
        *,
        content_type: bytes,
        body: bytes | None = None,
        usage: dict[str, int] | None = None,
        ignored_fields: tuple[str, ...] = (),
        stream: _Stream | None = None,
        provider_ids: tuple[object, list[tuple[str, str]]] = (None, []),
    ) -> None:
        self.status = 200
        self.content_type = content_type
        self.body = body
        self.usage = usage
        self.ignored_fields = ignored_fields
        self._stream = stream
        # The provider's own ids for the answer, unchecked: the `id` of the answer (of a
        # stream's first chunk) and its response headers (gateway/api/hosted_relay.py keeps
        # only allow-listed, id-shaped ones).
        self.provider_ids = provider_ids

    @property
    def is_stream(self) -> bool:
        return self._stream is not None

    async def chunks(self) -> AsyncIterator[bytes]:
        """The response bytes as they come; raises `HostedError` if the stream breaks off."""
        if self._stream is None:
            if self.body:
                yield self.body
            return
        try:
            async for data, usage in self._stream.events():
                if usage is not None:
                    self.usage = usage
                if data is not None:
                    yield data
        finally:
            await self._stream.aclose()

    async def aclose(self) -> None:
        """Stop the provider call and release its connection; safe to call repeatedly."""
        if self._stream is not None:
            await self._stream.aclose()


class _Stream:
    """A LiteLLM stream whose first chunk has already arrived."""

    def __init__(
        self, source: Any, first: Any, endpoint: Endpoint, with_usage: bool, provider: str
    ) -> None:
        self._source = source
        self._pending: list[Any] = [] if first is None else [first]
        self._endpoint = endpoint
        self._with_usage = with_usage
        self._provider = provider
        self._closed = False

    async def events(self) -> AsyncIterator[tuple[bytes | None, dict[str, int] | None]]:
        while not self._closed:
            if self._pending:
                chunk = self._pending.pop()
            else:
                failure: HostedError | None = None
                try:
                    chunk = await anext(self._source)
                except StopAsyncIteration:
                    break
                except Exception as exc:  # noqa: BLE001 - every failure becomes a HostedError
                    if self._closed:
                        return  # aclose() from another task broke the read: not an error
                    failure = hosted_error(exc, self._provider)
                if failure is not None:
                    raise failure  # outside `except`: LiteLLM's exception is not its context
            encode = partial(
                openai_wire.encode_chunk, self._endpoint, chunk, with_usage=self._with_usage
            )
            yield _encoded(self._provider, encode)
        if not self._closed:
            yield openai_wire.DONE, None

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await _close_stream(self._source)


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
    ) -> None:
        """`timeout_s` bounds each wait on the provider (LiteLLM's `timeout`);
        `response_timeout_s` a whole (non-stream) answer, however steadily it arrives."""
        if backend.kind != "hosted":
            raise ValueError(f"backend {backend.id!r} is {backend.kind}, not hosted")
        self.backend_id = backend.id
        self._models = {m.name: m.provider_model for m in backend.models if m.provider_model}
        first = next(iter(self._models.values()), "")
        self.provider = backend.provider or first.split("/", 1)[0] or "provider"
        self._api_base = backend.base_url
        if backend.base_url is None:
            check_base_url_environment(backend.id, self._models.values(), environ)
        self._api_key = hosted_api_key(backend, environ)
        self._timeout_s = timeout_s
        self._response_timeout_s = response_timeout_s
        self._text_client: tuple[asyncio.AbstractEventLoop, Any] | None = None

    def __repr__(self) -> str:
        return f"HostedClient({self.backend_id!r}, provider={self.provider!r})"

    async def send(
        self, endpoint: Endpoint, doc: dict[str, Any], upstream_model: str
    ) -> HostedResponse:
        """Call the provider; returns once the answer (or a stream's first chunk) is in."""
        provider_model = self._models.get(upstream_model)
        if provider_model is None:
            raise ValueError(f"backend {self.backend_id!r} does not serve {upstream_model!r}")
        try:
            params, ignored = openai_wire.request_params(endpoint, doc)
        except openai_wire.InvalidField as exc:
            message = f"the request is not valid for {self.provider} (not sent): {exc}"
            raise HostedError("status", message, status=400, param=exc.param) from None
        litellm = await aload_litellm()
        call = getattr(litellm, _CALLS[endpoint])
        failure: HostedError | None = None
        try:
            options = self._options(provider_model)
            if endpoint == "completions":
                options.update(self._text_completion_client(litellm, provider_model))
            whole = None if params.get("stream") else self._response_timeout_s
            async with asyncio.timeout(whole):  # a TimeoutError is classified `timeout`
                result = await call(**params, **options)
        except Exception as exc:  # noqa: BLE001 - every LiteLLM failure becomes a HostedError
            failure = hosted_error(exc, self.provider, secrets=self._secrets())
        if failure is not None:
            # Raised outside `except`, so LiteLLM's exception (provider text that may quote
            # the prompt, URLs) is neither its cause nor its context.
            raise failure
        if not params.get("stream"):
            encode = partial(openai_wire.encode_response, endpoint, result)
            body, usage = _encoded(self.provider, encode)
            return HostedResponse(
                content_type=_JSON,
                body=body,
                usage=usage,
                ignored_fields=ignored,
                provider_ids=_provider_ids(result, result),
            )
        first = await self._first_chunk(result)
        stream = _Stream(result, first, endpoint, openai_wire.include_usage(doc), self.provider)
        return HostedResponse(
            content_type=_SSE,
            ignored_fields=ignored,
            stream=stream,
            provider_ids=_provider_ids(first, result),
        )

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
            "drop_params": True,  # an OpenAI field the provider lacks is left out, not fatal
        }
        if self._api_base is not None:
            options["api_base"] = self._api_base
        if self._api_key is not None:
            options["api_key"] = self._api_key
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
                api_key=key, base_url=base, max_retries=0, timeout=self._timeout_s
            )
            self._text_client = (loop, client)
        return {"client": self._text_client[1]}

    async def _first_chunk(self, stream: Any) -> Any:
        try:
            return await anext(stream)
        except StopAsyncIteration:
            return None
        except Exception as exc:  # noqa: BLE001 - every LiteLLM failure becomes a HostedError
            failure = hosted_error(exc, self.provider)
        except BaseException:
            await _close_stream(stream)  # cancelled: the provider must stop too
            raise
        await _close_stream(stream)
        raise failure


def _provider_ids(answer: Any, carrier: Any) -> tuple[object, list[tuple[str, str]]]:
    """The `id` of `answer` and the provider's response headers LiteLLM keeps on
    `carrier` (`_hidden_params["additional_headers"]`, named `llm_provider-<header>`)."""
    hidden = getattr(carrier, "_hidden_params", None)
    found = hidden.get("additional_headers") if isinstance(hidden, dict) else None
    headers = [
        (name.removeprefix("llm_provider-"), value)
        for name, value in (found.items() if isinstance(found, dict) else ())
        if isinstance(name, str) and name.startswith("llm_provider-") and isinstance(value, str)
    ]
    return getattr(answer, "id", None), headers


def _encoded(provider: str, encode: Callable[[], T]) -> T:
    """Run an `openai_wire` encoder; an answer it cannot encode is a protocol error."""
    try:
        return encode()
    except TypeError:  # not an object, or not JSON-encodable (orjson's error is a TypeError)
        failure = HostedError("protocol", f"{provider} answered in a shape LiteLLM did not map")
    raise failure


async def _close_stream(stream: Any) -> None:
    """Close a LiteLLM stream, which closes the provider connection under it.

    Chat streams (`CustomStreamWrapper`) have `aclose()`; a text-completion stream
    (`TextCompletionStreamWrapper`) does not, and wraps a chat stream that does.
    """
    inner = stream if hasattr(stream, "aclose") else getattr(stream, "completion_stream", None)
    if inner is not None:
        await inner.aclose()


def hosted_error(
    exc: BaseException, provider: str, *, secrets: tuple[str, ...] = ()
) -> HostedError:
    """Classify a LiteLLM failure by what actually happened on the wire.

    LiteLLM's own exception class is not enough: a refused connection surfaces as
    `InternalServerError` (500) and Anthropic's 529 as 500 too, so the cause chain is
    read: transport errors decide `connect` / `timeout`, and the innermost HTTP status
    (the provider's own) decides `status`. A 4xx that LiteLLM raised itself (its
    `BadRequestError` for a request it will not send) keeps LiteLLM's reason, cut down to
    its first sentence without anything quoted (`local_reason`) and with `secrets` (the
    key, the base URL) removed.
    """
    # Both are loaded with LiteLLM already; imported here to stay off the gateway's path.
    import httpx
    import openai

    chain = list(_causes(exc))
    connect = (httpx.ConnectError, httpx.ConnectTimeout, ConnectionRefusedError)
    if any(isinstance(e, connect) for e in chain):
        return HostedError("connect", f"could not connect to {provider}")
    timeout = (TimeoutError, httpx.TimeoutException, openai.APITimeoutError)
    if any(isinstance(e, timeout) for e in chain):
        return HostedError("timeout", f"{provider} did not answer in time")
    status = _wire_status(chain)
    if status is not None:
        types = [t for e in chain for t in _ERROR_TYPE.findall(str(e)) if t in _KNOWN_ERROR_TYPES]
        detail = f" ({types[0]})" if types else ""
        return HostedError("status", f"{provider} answered HTTP {status}{detail}", status=status)
    in_body = _in_body_status(chain)
    if in_body is not None:  # an error object in a 200 answer: the provider's text, unshown
        message = f"{provider} answered HTTP 200 with an error (code {in_body})"
        return HostedError("status", message, status=in_body)
    local = _status(getattr(exc, "status_code", None))
    if local is not None and local < 500:  # LiteLLM refused the request before sending it
        message = f"the request is not valid for {provider} (HTTP {local}, not sent)"
        reason = local_reason(str(exc), secrets)
        return HostedError("status", f"{message}: {reason}" if reason else message, status=local)
    return HostedError("protocol", f"{provider} call failed ({type(exc).__name__})")


def local_reason(text: str, secrets: tuple[str, ...] = ()) -> str:
    """The reason in a LiteLLM exception message, safe to show the client.

    LiteLLM writes `litellm.BadRequestError: AnthropicException - <reason> ... Received
    Messages=[...]` and quotes the request (dicts, lists, quoted values) in the reason.
    Kept: the reason's first sentence, up to the first bracket, brace or quote; without
    URLs, `secrets`, control characters; at most 200 characters.
    """
    for secret in secrets:
        text = text.replace(secret, "(redacted)")
    text = _LITELLM_PREFIX.sub("", text)
    text = _QUOTED.split(text, maxsplit=1)[0]
    text = _SENTENCE_END.split(text, maxsplit=1)[0]
    text = _URL.sub("(redacted)", text)
    text = "".join(c if c.isprintable() else " " for c in text)
    return " ".join(text.split())[:200].strip(" -:,;")


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen and len(seen) < _CHAIN_LIMIT:
        seen.add(id(link))
        yield link
        link = link.__cause__ or (None if link.__suppress_context__ else link.__context__)


def _wire_status(chain: list[BaseException]) -> int | None:
    """The status of an HTTP response that really arrived, innermost (the provider's) first.

    Only httpx's and the OpenAI SDK's status errors are trusted: LiteLLM's wrappers also
    carry a `status_code`, but it is 500 for its own failures (a refused connection, a
    bug) as much as for a provider's 5xx.
    """
    import httpx

    for link in reversed(chain):
        if isinstance(link, httpx.HTTPStatusError):
            return link.response.status_code
        status = _status(getattr(link, "status_code", None))
        if status is not None and type(link).__module__.startswith("openai"):
            return status
    return None


def _in_body_status(chain: list[BaseException]) -> int | None:
    """The `code` of an error object a provider answered with HTTP 200 (OpenRouter does).

    LiteLLM 1.108.7 (`convert_to_model_response_object`) raises a bare `Exception` with
    the object's `code` as `status_code` and its `message`, the provider's own text that
    may quote the prompt or the key, which its wrappers then repeat. It is the innermost
    link, from no library's module: a refusal LiteLLM makes itself ends in one of its own.
    """
    innermost = chain[-1]
    if type(innermost) is not Exception or not hasattr(innermost, "status_code"):
        return None
    return _status(innermost.status_code) or 500


def _status(value: object) -> int | None:
    return value if isinstance(value, int) and 400 <= value <= 599 else None
