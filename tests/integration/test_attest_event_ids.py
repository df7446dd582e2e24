"""A stream with event `id` fields and no `[DONE]`, through the `owngate attest` sidecar,
read by the OpenAI Python SDK.

The SDK keeps the last event id for every later event and, while one is set, dispatches
an event at any blank line; its `json()` of that event's empty data raises. The gateway
clears it with an `id` line of its own before its receipt line
(tests/integration/test_log_truth_event_ids.py), but not on an attested backend's stream,
whose countersigned body must be the client's bytes: there the SDK raised
`JSONDecodeError` at the receipt line's blank line, at the end of an answer it had read
whole, while the record said 200 with the usage shown and no stream error, and the
countersignature stood for it. The sidecar now writes that `id` line itself after the
backend's bytes (relayed and hashed as part of the body, as its line end before its
comment is), so the SDK reads the answer to its end, the countersignature is accepted,
and the independent audit finds the log says what the client got.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from gateway.provenance import write_signing_key
from tests.helpers.attest import start_sidecar
from tests.helpers.audit_rig import (
    ASKS_USAGE,
    assert_logged_as_received,
    chunked,
    client_gets,
    logged,
    request_log,
    writes,
)
from tests.helpers.gateways import Gateway, backend
from tests.helpers.raw_backend import Answer, RawBackend

COUNTS = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
TOKEN = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}'
USAGE = b'data: {"id":"c","choices":[],"usage":' + json.dumps(COUNTS).encode() + b"}"

# The backend's events (each one chunk); all end without `[DONE]`, their framing whole.
STREAMS: dict[str, tuple[bytes, ...]] = {
    "ids": (b"id: 1\n" + TOKEN + b"\n\n", b"id: 2\n" + USAGE + b"\n\n"),
    "ids-crlf": (b"id: 1\r\n" + TOKEN + b"\r\n\r\n", b"id: 2\r\n" + USAGE + b"\r\n\r\n"),
    "ids-cr-only": (b"id: 1\r" + TOKEN + b"\r\r", b"id: 2\r" + USAGE + b"\r\r"),
    "id-split-across-reads": (TOKEN + b"\n\ni", b"d: 1\n" + USAGE + b"\n\n"),
    "id-without-value-colon": (b"id:a\n" + TOKEN + b"\n\n", USAGE + b"\n\n"),
    "ids-last-event-open": (b"id: 1\n" + TOKEN + b"\n\n", b"id: 2\n" + USAGE),
}


def _sdk_reads(gateway: Gateway) -> tuple[list[object], Exception | None]:
    """The usages the real OpenAI SDK showed, chunk by chunk, and what it raised, if any."""
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key, max_retries=0)
    shown: list[object] = []
    try:
        stream = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            shown.append(None if chunk.usage is None else chunk.usage.model_dump(exclude_none=True))
    except Exception as exc:  # noqa: BLE001 (what the SDK raised is the finding)
        return shown, exc
    finally:
        client.close()
    return shown, None


@pytest.mark.parametrize("name", list(STREAMS))
def test_an_attested_stream_with_event_ids_is_read_whole_by_the_sdk(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    name: str,
) -> None:
    raw = start_raw(writes(*chunked(*STREAMS[name])))
    sidecar = start_sidecar(tmp_path, "gpu-a", raw.url)
    try:
        attested = backend("gpu", sidecar.url, "m", attest={"key": sidecar.vkey})
        gateway, vkey = logged(start_gateway, tmp_path, [attested])
        shown, raised = _sdk_reads(gateway)
        assert raised is None, raised
        assert [u for u in shown if u is not None] == [COUNTS]
        received = client_gets(gateway, ASKS_USAGE)
        assert received.status == 200
        assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
        records = request_log(tmp_path / "log", vkey, received.headers["x-request-id"])
        completion = records[-1]
        assert completion["status"] == 200 and completion.get("stream_error") is None
        assert completion["usage"] == COUNTS
        assert completion["attestation"]["failure"] is None, completion["attestation"]
    finally:
        sidecar.process.kill()


# A backend named as attested whose answers arrive with no countersignature comment (an
# old sidecar, one that failed, or none at all): nothing countersigned covers the stream,
# so the gateway writes its own `id` line, as for an unattested backend.
UNSIGNED: dict[str, tuple[bytes, ...]] = {
    "no-comment": STREAMS["ids"],
    "no-comment-last-event-open": STREAMS["ids-last-event-open"],
    # a comment that is not a well-framed last line: never accepted either
    "comment-mid-stream": (
        b"id: 1\n" + TOKEN + b"\n\n: owngate-attest AAAA\n",
        b"id: 2\n" + USAGE + b"\n\n",
    ),
}


@pytest.mark.parametrize("name", list(UNSIGNED))
def test_an_attested_stream_with_ids_that_came_without_a_countersignature_is_read_whole(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    name: str,
) -> None:
    """Before, the gateway wrote its `id` line only on an unattested backend's stream: one
    from a backend named as attested that came without a countersignature made the SDK
    raise at the receipt line's blank line, at the end of an answer it had read whole."""
    raw = start_raw(writes(*chunked(*UNSIGNED[name])))
    sidecar_key = write_signing_key(tmp_path / "sidecar.key", "gpu-a")  # never used
    attested = backend("gpu", raw.url, "m", attest={"key": sidecar_key})
    gateway, vkey = logged(start_gateway, tmp_path, [attested])
    shown, raised = _sdk_reads(gateway)
    assert raised is None, raised
    assert [u for u in shown if u is not None] == [COUNTS]
    received = client_gets(gateway, ASKS_USAGE)
    assert received.status == 200
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
    completion = request_log(tmp_path / "log", vkey, received.headers["x-request-id"])[-1]
    assert completion["status"] == 200 and completion.get("stream_error") is None
    assert completion["usage"] == COUNTS
    assert completion["attestation"]["failure"] is not None, completion["attestation"]
