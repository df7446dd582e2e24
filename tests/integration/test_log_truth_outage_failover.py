"""The log fails between two attempts of one request: the first private backend was sent
the request (its dispatch record durable) and failed; the next attempt's dispatch record
cannot be written (the disk refused it). The second backend gets nothing, and the client
gets what the log says of its request: the first attempt's error, the status its
completion record holds, not a 503 the log never states."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.provenance.writer import segment_writer
from tests.helpers.audit_rig import (
    ASKS_USAGE,
    WHOLE,
    client_gets,
    failing_over_onto_the_log,
    later_receipt,
    settled,
)
from tests.helpers.gateways import Gateway
from tests.helpers.independent_audit import audit
from tests.helpers.provenance import FailingDisk
from tests.helpers.raw_backend import Answer, RawBackend
from tests.helpers.waiting import until


@pytest.mark.parametrize("ask", [WHOLE, ASKS_USAGE], ids=["whole", "stream"])
def test_a_log_outage_after_a_failed_attempt_answers_what_the_log_says(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    ask: dict[str, object],
) -> None:
    disk = FailingDisk()
    monkeypatch.setattr(segment_writer, "os", disk)

    def arm() -> None:
        disk.failing = True

    gateway, vkey, a, b = failing_over_onto_the_log(start_raw, start_gateway, tmp_path, arm)
    received = client_gets(gateway, ask)
    assert len(a.posts) == 1 and b.posts == []
    log = gateway.app.proxy.recorder.log  # type: ignore[union-attr]
    until(lambda: log.last_error is not None, "the refused write")
    disk.failing = False  # the disk is back: the completion it refused goes in
    request_id = received.headers["x-request-id"]
    settled(tmp_path / "log", vkey, request_id)
    later = later_receipt(gateway, request_id)
    assert audit(received, tmp_path / "log", vkey, later_receipt=later) == []
    assert received.status == 502, received.body  # the first attempt's, as its record says
