"""What the client gets when no attempt served its request after one was dispatched
(gateway/api/proxy.py): the last failed attempt's error, whose status that attempt's
completion record holds (`attempt_status`), or, when its key lapsed before another
attempt was made, that error too (`stopped`); and the error of an attempt the gateway
could open no socket for (`out_of_descriptors`, private and hosted alike)."""

from __future__ import annotations

from gateway.api.exchange import TryNext
from gateway.api.refusal import lapsed, not_served
from gateway.errors import ErrorCode, GatewayError
from gateway.policy import Decision

__all__ = ["attempt_error", "attempt_status", "out_of_descriptors", "stopped"]

_RETRY_SOON = ((b"retry-after", b"1"),)


def out_of_descriptors() -> GatewayError:
    """What the client sees when the gateway's last attempt found no file descriptor (or
    socket memory) to reach its backend: 503 saying so, never blaming the backend, with
    `retry-after: 1` as for a busy backend (descriptors come back as connections end).
    Before, it said "retry later" with no `retry-after`, unlike the busy refusal."""
    return GatewayError(
        ErrorCode.backend_unavailable,
        "the gateway is out of file descriptors and could not reach the backend; retry later",
        headers=_RETRY_SOON,
    )


def attempt_status(exc: TryNext) -> int:
    """The status a failed attempt answers the client with if it is the last one."""
    return exc.error.status if exc.error is not None else ErrorCode.backend_unavailable.status


def stopped(
    stop: GatewayError, decision: Decision, last: TryNext | None, model: str, request_id: str
) -> GatewayError:
    """What the client gets when its key lapsed before an attempt was made (`stop`): with
    nothing dispatched, `stop` as a refusal (its record says why); after an attempt that
    was dispatched and failed, that attempt's error, which its completion record holds
    (it was written while the key still stood)."""
    if last is None:
        return lapsed(stop, decision)
    return attempt_error(last, model, request_id)


def attempt_error(last: TryNext, model: str, request_id: str) -> GatewayError:
    """What the client gets when every attempt failed: the last attempt's error (what the
    backend said, translated), or 503 backend_unavailable in the words of `not_served`
    (which backends failed, and how, is the operator's: never a tenant's), with
    `retry-after: 1` where that attempt was `busy` (the tenant's share of the backend
    held, or its pool full: room comes back as a request ends, as in a saturated pool's
    queue). Its status is `attempt_status(last)`, which the last completion record holds."""
    if last.error is not None:
        return last.error
    headers = _RETRY_SOON if last.busy else ()
    return GatewayError(
        ErrorCode.backend_unavailable, not_served(model, request_id), headers=headers
    )
