"""`owngate audit verify --backend-pin` takes a pinned backend's record that names no key
for an attempt that sent nothing only on the failures the gateway has before writing a
byte of the request: the auditor's list (gateway/provenance, which imports no gateway
code) must be the gateway's own."""

from __future__ import annotations

from gateway.api.private_failures import NOT_SENT
from gateway.provenance.audit import pinned


def test_the_audits_failures_that_sent_nothing_are_the_gateways() -> None:
    assert pinned._NOTHING_SENT == NOT_SENT


def test_only_an_unanswered_failure_before_writing_of_that_backend_sent_nothing() -> None:
    unanswered = {"status": 502, "error": "gpu-a: tls", "response_commitment": None}
    assert pinned.sent_nothing(unanswered, "gpu-a")
    assert pinned.sent_nothing({**unanswered, "error": "gpu-a: connect"}, "gpu-a")
    assert not pinned.sent_nothing(unanswered, "gpu-b")  # another backend's failure
    assert not pinned.sent_nothing({**unanswered, "error": "gpu-a: closed"}, "gpu-a")
    assert not pinned.sent_nothing({**unanswered, "error": "gpu-a: timeout"}, "gpu-a")
    assert not pinned.sent_nothing({**unanswered, "error": None}, "gpu-a")
    assert not pinned.sent_nothing({**unanswered, "response_commitment": "ab" * 32}, "gpu-a")
