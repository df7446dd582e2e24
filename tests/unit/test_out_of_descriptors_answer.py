"""A request the gateway could not send because it is out of file descriptors is told to
retry, with `retry-after: 1`, as a busy backend's refusal is (gateway/api/attempt_errors.py
`out_of_descriptors`): a private backend's attempt (`exhausted`, gateway/api/private_failures.py)
and a hosted provider's alike (gateway/api/hosted_failures.py). Before, the private 503 said
"retry later" with no `retry-after`, and the hosted one neither said why nor when.
tests/integration/test_out_of_descriptors.py checks the header on the wire."""

from __future__ import annotations

from gateway.api import hosted_failures, private_failures
from gateway.api.attempt_errors import attempt_error
from gateway.api.exchange import TryNext
from gateway.errors import ErrorCode, GatewayError
from gateway.upstream.hosted_errors import HostedError
from gateway.upstream.http import UpstreamError

RETRY_SOON = ((b"retry-after", b"1"),)


def _told_to_retry(error: GatewayError | None) -> None:
    assert error is not None
    assert (error.status, error.code) == (503, ErrorCode.backend_unavailable)
    assert "out of file descriptors" in error.message
    assert error.headers == RETRY_SOON


def test_a_private_attempt_without_a_descriptor_is_503_with_retry_after() -> None:
    error = private_failures.last_error(UpstreamError("exhausted", "no descriptor left"))
    _told_to_retry(error)
    _told_to_retry(attempt_error(TryNext("gpu: exhausted", error, busy=True), "m", "req-1"))


def test_a_hosted_call_without_a_descriptor_is_503_with_retry_after() -> None:
    message = "the gateway is out of file descriptors or socket memory: openai not called"
    error = hosted_failures.last_error(HostedError("exhausted", message))
    _told_to_retry(error)
    _told_to_retry(attempt_error(TryNext(f"openai: {message}", error), "m", "req-1"))


def test_as_a_busy_backend_is() -> None:
    """The refusal it now matches (a guard: the two say the same `retry-after`)."""
    busy = attempt_error(TryNext("gpu: busy", busy=True), "m", "req-1")
    assert busy.headers == RETRY_SOON
