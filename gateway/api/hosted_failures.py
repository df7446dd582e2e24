"""What a hosted provider's failed call means (gateway/api/hosted_relay.py): the error its
client gets if it was the request's last attempt (`last_error`), the 400 for a request no
adapter could translate (`untranslated`), and what it tells the provider's breakers
(`judge`)."""

from __future__ import annotations

from gateway.api.attempt_errors import out_of_descriptors
from gateway.api.exchange import TryNext
from gateway.errors import ErrorCode, GatewayError
from gateway.routing.attempt import Attempt
from gateway.upstream.errors import sanitize_upstream_message
from gateway.upstream.hosted import HostedError
from gateway.upstream.hosted_finish import Unfinished

__all__ = ["judge", "last_error", "untranslated"]


def last_error(exc: HostedError) -> GatewayError | None:
    """What the client sees if this failed call was the last attempt: 504 for a timeout,
    as for a private backend (`last_error`, gateway/api/private_failures.py), 502 for a
    whole answer without the provider's finish reason, 503 with `retry-after: 1` saying
    the gateway is out of descriptors (`exhausted`, as for a private backend); None: 503
    naming every failure (gateway/api/proxy.py)."""
    if isinstance(exc, Unfinished):  # as a private backend's answer of the wrong shape
        return GatewayError(ErrorCode.upstream_error, exc.public)
    if exc.kind == "exhausted":  # the gateway's state: say so, never blame the provider
        return out_of_descriptors()
    if exc.kind != "timeout":
        return None
    return GatewayError(ErrorCode.upstream_timeout, "the backend did not answer in time")


def untranslated(backend: str, exc: HostedError) -> TryNext:
    """LiteLLM failed before sending anything (`untranslated`): the client's request this
    adapter cannot translate, or the gateway's own misconfiguration (a malformed
    credential) failing the same way on every request. No verdict on the provider, so a
    client's input never charges a breaker; counted as `kind="untranslated"` and logged
    (`HostedSignals.untranslated`) so that a misconfigured backend shows; and the next
    backend may serve. If none does, the client gets this 400 (a request every adapter
    refuses is the client's)."""
    message = sanitize_upstream_message(exc.public)  # names no provider
    error = GatewayError(ErrorCode.upstream_bad_request, message, param=exc.param)
    return TryNext(f"{backend}: {exc.message}", error)


def judge(attempt: Attempt, exc: HostedError) -> None:
    """Tell the attempt's breakers what `exc`, the provider call's failure, says of the
    provider (gateway/api/hosted_relay.py's docstring says why): a connection failure,
    timeout, protocol failure or 5xx is a failure charged to the tenant too; any other
    status is no verdict.

    Unlike a private backend's, a hosted `connect` failure is not taken as one no tenant
    can cause: some adapters fetch a content part's URL from the gateway before calling
    the provider (LiteLLM's Bedrock image fetch lets the `httpx.ConnectError` through), so
    a client naming a public host that refuses connections makes the call fail the
    same way. One tenant's such failures open its own breaker, two tenants' the
    provider's."""
    if exc.kind not in ("status", "untranslated", "exhausted"):  # exhausted: the gateway's own
        attempt.failed(f"{exc.kind}: {exc.message}")
    elif exc.status is not None and exc.status >= 500:
        attempt.failed(exc.message)
