"""A stream whose receipt is not signed gets no receipt line, which used to be what ended
the backend's last event when the backend left it open (no blank line after it): the
client's SDK never dispatched that event (openai/_streaming.py dispatches at a blank line
only), while the completion record read it (`EventReader.finish`) and stated its usage.
The gateway now ends that event itself (`stream_writes.end_stream`), so the client reads what
the record states, and those bytes are in the response commitment: the stream, as
received, opens it (a real gateway, provenance on, the signer failing)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.api.recorder import Recorder
from gateway.provenance.formats.commitments import commit_digest
from tests.helpers.audit_rig import ASKS_USAGE, chunked, client_gets, logged, settled, writes
from tests.helpers.gateways import Gateway, backend
from tests.helpers.independent_audit import log_records
from tests.helpers.log_truth import EVENT
from tests.helpers.raw_backend import Answer, RawBackend
from tests.helpers.sdk_stream import counts, sdk_shown_usage

SMALL = b'{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}'
BIG = b'{"prompt_tokens":900,"completion_tokens":900,"total_tokens":1800}'
LAST = b'data: {"id":"c","choices":[],"usage":' + BIG + b"}"
ENDS = {"line-ended": b"\n", "mid-line": b"", "cr": b"\r"}


def _completion(logdir: Path, vkey: str, request_id: str) -> dict[str, Any]:
    records = [json.loads(entry) for entry in log_records(logdir, vkey)]
    found: dict[str, Any] = next(
        r for r in records if r["type"] == "completion" and r["request_id"] == request_id
    )
    return found


@pytest.mark.parametrize("end", list(ENDS))
def test_without_a_receipt_line_the_backend_s_open_last_event_is_ended_and_committed(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    end: str,
) -> None:
    def refused(*args: object, **kwargs: object) -> list[bytes]:
        raise ValueError("the signing key is gone")

    monkeypatch.setattr("gateway.api.recorder_log.seal_receipts", refused)
    salts: dict[str, bytes] = {}
    complete = Recorder.complete

    def noting(self: Recorder, exchange: Any, trail: Any, **kwargs: Any) -> None:
        salts[exchange.request_id.decode()] = trail.salts.response
        complete(self, exchange, trail, **kwargs)

    monkeypatch.setattr(Recorder, "complete", noting)
    body = EVENT + b'data: {"id":"c","choices":[],"usage":' + SMALL + b"}\n\n"
    raw = start_raw(writes(*chunked(body, LAST + ENDS[end])))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = client_gets(gateway, ASKS_USAGE)
    assert received.status == 200
    assert b"owngate-receipt" not in received.body
    request_id = received.headers["x-request-id"]
    settled(tmp_path / "log", vkey, request_id)
    shown = counts(sdk_shown_usage(received.body))
    assert shown == json.loads(BIG)  # the gateway's bytes ended the event: the SDK read it
    completion = _completion(tmp_path / "log", vkey, request_id)
    assert completion["usage"] == shown
    digest = hashlib.sha256(received.body).digest()
    assert completion["response_commitment"] == commit_digest("response", salts[request_id], digest)
