"""How a hosted provider's failure is told: `HostedError` (one of five kinds, a message
without URL, key or content) and `hosted_error`, which classifies a LiteLLM exception by
what happened on the wire (gateway/upstream/hosted.py raises them); `HostedUnavailable`
when the gateway's own LiteLLM could not be loaded, which is no provider's failure.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Iterator
from typing import Final, Literal

from gateway.upstream.hosted_bound import AnswerTooLarge, cut_kind
from gateway.upstream.response import OUT_OF_RESOURCES, no_socket_now

__all__ = [
    "HostedError",
    "HostedErrorKind",
    "HostedUnavailable",
    "forget_frames",
    "hosted_error",
    "local_reason",
    "unnamed",
]

# `untranslated`: failed before any HTTP request began, in a data error (`_untranslatable`).
# `too_large`: the answer passed limits.max_response_bytes as it was read (hosted_bound):
# not the provider's failure (a client can ask for a huge answer), like a private one's.
# `exhausted`: the gateway ran out of file descriptors or socket memory (an `OSError` of
# OUT_OF_RESOURCES anywhere in the cause chain, under LiteLLM's connection error; or a
# connect failure no refusal or timeout explains while no socket can be opened now: a host
# name's lookup at the limit fails with EAI_SYSTEM and EBUSY, not EMFILE): its own
# state, not the provider's, as for a private backend (gateway/upstream/http.py).
HostedErrorKind = Literal[
    "connect", "timeout", "status", "protocol", "untranslated", "too_large", "exhausted"
]
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
# What an adapter raises on data it cannot translate (`_untranslatable`), and the modules
# whose exceptions mean a request was (being) sent.
_DATA_ERRORS: Final = (TypeError, LookupError, AttributeError, ValueError)
_TRANSPORT_MODULES: Final = frozenset(
    {"httpx", "httpx2", "httpcore", "h11", "h2", "aiohttp", "ssl", "openai", "anyio"}
)
# `litellm.BadRequestError: ` and `AnthropicException - `, repeated as LiteLLM nests them.
_LITELLM_PREFIX = re.compile(r"^(?:\s*(?:litellm\.\w+:|\w*Exception\s+-))+\s*")
_QUOTED = re.compile(r"""[\[\]{}'"`=]|Received\b|Traceback\b""")
_SENTENCE_END = re.compile(r"(?<=\.)\s|\n")
# The whole run of scheme characters before `://`, tried once per run and never
# backtracked into: tried at every `\b` of `a-a-a-...`, the search scanned to the end from
# each (quadratic: ~1.4 s at 8,000 characters).
_URL = re.compile(r"(?<![a-z0-9+.-])[a-z0-9+.-]*+://\S*", re.IGNORECASE)


class HostedError(Exception):
    """A hosted provider could not be reached, timed out, refused, or answered badly.

    `message` names the provider and, for `status`, the HTTP status and the provider's
    error type (`overloaded_error`), or why LiteLLM refused the request before sending it
    (a client error: `status` 400, the message says "not sent"); it never holds URLs, keys
    or request content. `untranslated` (`status` 400, "not sent"): LiteLLM failed before
    sending anything, which is the client's request or the gateway's own configuration
    (a malformed credential), not the provider; another backend may still serve.
    `error_class`: for `untranslated`, the class name of the error the translation ended
    in (`TypeError`, `Exception`), for the operator's log; code names it, never a client.
    `public`: what a client may read of it, which names no provider (which hosted
    provider a request was headed for is a routing internal: docs/security.md); given
    where a client gets the error (a 4xx, `untranslated`, a request refused unsent),
    else the kind in neutral words.
    """

    def __init__(
        self,
        kind: HostedErrorKind,
        message: str,
        *,
        status: int | None = None,
        param: str | None = None,
        error_class: str | None = None,
        public: str | None = None,
    ) -> None:
        super().__init__(message)
        self.kind: HostedErrorKind = kind
        self.status = status
        self.message = message
        self.param = param  # the request field at fault, when known
        self.error_class = error_class
        self.public = public if public is not None else f"the provider call failed ({kind})"


class HostedUnavailable(Exception):
    """LiteLLM could not be loaded (imported and configured): no hosted backend can be
    called, and nothing was sent. The gateway's own failure, the same for every hosted
    backend; `error_class` is the class name of what the load raised (`ImportError`),
    for the operator's log. The message is the gateway's own words only."""

    def __init__(self, error_class: str) -> None:
        super().__init__(f"LiteLLM failed to load ({error_class})")
        self.error_class = error_class


def hosted_error(
    exc: BaseException,
    provider: str,
    *,
    secrets: tuple[str, ...] = (),
    sent: bool = True,
    cut: str | None = None,
) -> HostedError:
    """Classify a LiteLLM failure by what actually happened on the wire.

    LiteLLM's own exception class is not enough: a refused connection surfaces as
    `InternalServerError` (500) and Anthropic's 529 as 500 too, so the cause chain is
    read: transport errors decide `connect` / `timeout`, and the innermost HTTP status
    (the provider's own; a redirect, which is never followed, too) decides `status`. A
    4xx that LiteLLM raised itself (its `BadRequestError` for a request it will not send)
    keeps LiteLLM's reason, cut down to its first sentence without anything quoted
    (`local_reason`) and with `secrets` (the key, the base URL) removed.

    `sent=False`: no HTTP request of the call began (gateway/upstream/hosted_transport.py).
    A failure that would otherwise be `protocol` and that ends in a data error
    (`_untranslatable`) is then `untranslated` (`status` 400, "not sent", naming only the
    error's class): the client's request that this adapter could not translate, or the
    gateway's own misconfiguration failing the same way (LiteLLM's Vertex credentials
    read raises a bare `Exception`). Neither is the provider's failure; the caller tries
    the next backend and gives the client the 400 only if none serves.
    """
    # Both are loaded with LiteLLM already; imported here to stay off the gateway's path.
    import httpx
    import openai

    chain = list(_causes(exc))
    if cut is None:  # `cut`: the answer was cut short (`Outbound.cut`), whatever LiteLLM raised
        cut = next((str(e) for e in chain if isinstance(e, AnswerTooLarge)), None)
    if cut is not None:  # read no further (gateway/upstream/hosted_bound.py)
        return HostedError(cut_kind(cut), f"{provider} {cut}")
    connect = (httpx.ConnectError, httpx.ConnectTimeout, ConnectionRefusedError)
    failed_to_connect = any(isinstance(e, connect) for e in chain)
    answered = (ConnectionError, TimeoutError, httpx.ConnectTimeout)  # on a socket it had
    if any(isinstance(e, OSError) and e.errno in OUT_OF_RESOURCES for e in chain) or (
        failed_to_connect and not any(isinstance(e, answered) for e in chain) and no_socket_now()
    ):
        message = f"the gateway is out of file descriptors or socket memory: {provider} not called"
        return HostedError("exhausted", message)
    if failed_to_connect:
        return HostedError("connect", f"could not connect to {provider}")
    timeout = (TimeoutError, httpx.TimeoutException, openai.APITimeoutError)
    if any(isinstance(e, timeout) for e in chain):
        return HostedError("timeout", f"{provider} did not answer in time")
    status = _wire_status(chain)
    if status is not None:
        types = [t for e in chain for t in _ERROR_TYPE.findall(str(e)) if t in _KNOWN_ERROR_TYPES]
        detail = f" ({types[0]})" if types else ""
        if status < 400:  # the HTTP clients are told not to follow (litellm_runtime)
            detail = " (a redirect: not followed)"
        message = f"answered HTTP {status}{detail}"
        return HostedError(
            "status", f"{provider} {message}", status=status, public=f"the provider {message}"
        )
    in_body = _in_body_status(chain)
    if in_body is not None:  # an error object in a 200 answer: the provider's text, unshown
        message = f"answered HTTP 200 with an error (code {in_body})"
        return HostedError(
            "status", f"{provider} {message}", status=in_body, public=f"the provider {message}"
        )
    local = _status(getattr(exc, "status_code", None))
    if local is not None and local < 500:  # LiteLLM refused the request before sending it
        reason = local_reason(str(exc), secrets)
        message = f"the request is not valid for {provider} (HTTP {local}, not sent)"
        public = f"the request is not valid for this model's provider (HTTP {local}, not sent)"
        if reason:  # LiteLLM's words, with the provider's name in them taken out
            message, public = f"{message}: {reason}", f"{public}: {unnamed(reason, provider)}"
        return HostedError("status", message, status=local, public=public)
    untranslatable = None if sent else _untranslatable(chain)
    if untranslatable is not None:
        detail = f" (not sent: its adapter could not translate it, {untranslatable})"
        return HostedError(
            "untranslated",
            f"the request is not valid for {provider}{detail}",
            status=400,
            error_class=untranslatable,
            public=f"the request is not valid for this model's provider{detail}",
        )
    return HostedError("protocol", f"{provider} call failed ({type(exc).__name__})")


def unnamed(text: str, provider: str) -> str:
    """`text` with the provider's name (in any letter case; `vertex_ai` also as
    `vertex ai`/`vertexai`) said as "the provider"."""
    if not provider:
        return text
    name = r"[ _-]?".join(re.escape(part) for part in re.split(r"[ _-]", provider) if part)
    return re.sub(name, "the provider", text, flags=re.IGNORECASE)


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


def _untranslatable(chain: list[BaseException]) -> str | None:
    """The class name of the data error a request's translation ended in, or None.

    The innermost link decides: Python's own `TypeError`, `LookupError`, `AttributeError`,
    `ValueError` (a JSON or pydantic validation error among them) or a bare `Exception`
    (LiteLLM raises those for input it cannot convert). An error of any other class, one
    of an HTTP or TLS library anywhere in the chain, or an `OSError`, is none: a provider's
    or the gateway's own, not the request's.
    """
    if any(isinstance(e, OSError) or _from_transport(e) for e in chain):
        return None
    innermost = chain[-1]
    if type(innermost) is Exception or isinstance(innermost, _DATA_ERRORS):
        return type(innermost).__name__[:40]
    return None


def forget_frames(exc: BaseException) -> None:
    """Clear the locals of the finished frames that `exc` and the exceptions it chains
    (cause and context) passed through, and drop each one's traceback: LiteLLM's and the
    SDKs' frames, whose locals hold the call's keyword arguments (the request's messages)
    and, in some, the exception raised through them (a reference cycle). Once classified
    (`hosted_error`), nothing of them is read again, and the request's content then goes
    with its last reference, not when the cyclic collector next runs.

    The traceback goes too: a frame still running when this is called (the gateway's own
    that caught it, `HostedClient._call` with the call's `params`) keeps its locals, and
    the frames chained from it (`f_back`) are kept by the traceback. LiteLLM's `Logging`
    object holds the exception among its call details while the call's keyword
    arguments, which that traceback's frames hold, hold the `Logging` object (its
    Responses API bridge, `openai/responses/...`): without the traceback, nothing the
    exception reaches leads back to it, and the exceptions (their httpx `Request`, the
    prompt sent) go with the `Logging` object, by reference count."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo and len(seen) < 4 * _CHAIN_LIMIT:
        link = todo.pop()
        if id(link) in seen:
            continue
        seen.add(id(link))
        traceback.clear_frames(link.__traceback__)
        link.__traceback__ = None
        todo.extend(e for e in (link.__cause__, link.__context__) if e is not None)


def _from_transport(exc: BaseException) -> bool:
    return type(exc).__module__.partition(".")[0] in _TRANSPORT_MODULES


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
        status = _status(getattr(link, "status_code", None), lowest=300)
        if status is not None and type(link).__module__.startswith("openai"):
            return status
    return None


def _status(value: object, lowest: int = 400) -> int | None:
    """`value` if it is an HTTP status from `lowest` (an error; 300: a redirect too) to 599."""
    return value if isinstance(value, int) and lowest <= value <= 599 else None


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
