"""What a private backend's failed attempt means (gateway/api/passthrough.py): which
answers fail it over, which failures sent nothing or were the gateway's own lack of room,
and the error its client gets if it was the request's last attempt (`last_error`)."""

from __future__ import annotations

from typing import Final

from gateway.api.attempt_errors import out_of_descriptors
from gateway.errors import ErrorCode, GatewayError
from gateway.upstream.http import UpstreamError

__all__ = ["NOT_SENT", "NO_ROOM", "REFUSALS", "RETRYABLE", "last_error"]

# Statuses of an answer that fail the attempt over (nothing reached the client).
RETRYABLE: Final = frozenset({429, 500, 502, 503, 504})
# Refusals of this request by this backend: the gateway's key (401, 403), a model or an
# endpoint it does not serve (404, 501). Another backend may serve: the attempt fails
# over (a black hole otherwise, every request it got ending there). They are no verdict
# on the backend's health (its breaker): the endpoint is the client's choice, and one
# tenant's requests to an endpoint a backend lacks must not take it out for every tenant.
REFUSALS: Final = frozenset({401, 403, 404, 501})
# Failures before the backend had the request: nothing of it was sent.
NOT_SENT: Final = frozenset({"connect", "tls", "busy", "exhausted", "retired"})
# The gateway's own limits: the backend is up, this gateway has no room to reach it (its
# state "busy", as for a 429: only `when_private_saturated` falls back past it).
NO_ROOM: Final = frozenset({"busy", "exhausted"})


def last_error(exc: UpstreamError) -> GatewayError | None:
    """What the client sees if this failed attempt was the last one: 504 for a timeout,
    502 for an answer in a coding the gateway did not accept, 503 saying the gateway is
    out of descriptors (`exhausted`, with `retry-after: 1`); None: 503 naming every
    failure (gateway/api/proxy.py)."""
    if exc.kind == "shape":
        return GatewayError(
            ErrorCode.upstream_error,
            f"the backend answered in the wrong shape: {exc.detail}",
        )
    if exc.kind == "encoding":
        return GatewayError(
            ErrorCode.upstream_error,
            "the backend answered in a content coding the gateway did not ask for "
            "(it asks for identity and relays nothing else)",
        )
    if exc.kind == "exhausted":  # the gateway's state: say so, never blame the backend
        return out_of_descriptors()
    if exc.kind != "timeout":
        return None
    return GatewayError(ErrorCode.upstream_timeout, "the backend did not answer in time")
