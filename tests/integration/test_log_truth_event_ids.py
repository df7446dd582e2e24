"""A stream whose backend gives its events `id` fields and ends without `[DONE]` (its
framing says it is whole), read by the OpenAI Python SDK through the gateway.

The SDK keeps the last event id for every later event and, while it is set, dispatches an
event at any blank line, even one with no field before it; its `json()` of that event's
empty data raises. The gateway's receipt line ends with a blank line, so after a whole
last event the SDK raised `JSONDecodeError` at the end of an answer it had read whole, a
failure of the gateway's making that the record (200, the usage shown, no stream error)
did not state. The gateway now writes an `id` field with no value before its receipt
line (the SDK then holds no id), relayed as part of the stream and committed to: the SDK
reads the answer to its end, and the audit finds the log says what the client got.
Streams without ids, or ending at `[DONE]`, get no such line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

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
from tests.helpers.log_truth import CHAT, DONE
from tests.helpers.raw_backend import Answer, RawBackend

COUNTS = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
TOKEN = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}'
USAGE = b'data: {"id":"c","choices":[],"usage":' + json.dumps(COUNTS).encode() + b"}"

# (the backend's events, whether the client asks for usage, whether the SDK shows it)
STREAMS: dict[str, tuple[tuple[bytes, ...], bool]] = {
    "ids-usage-asked": ((b"id: 1\n" + TOKEN + b"\n\n", b"id: 2\n" + USAGE + b"\n\n"), True),
    # the gateway asked for the usage chunk and holds it back: the client reads no usage
    "ids-usage-held-back": ((b"id: 1\n" + TOKEN + b"\n\n", b"id: 2\n" + USAGE + b"\n\n"), False),
    "ids-crlf": ((b"id: 1\r\n" + TOKEN + b"\r\n\r\n", b"id: 2\r\n" + USAGE + b"\r\n\r\n"), True),
    "ids-cr-only": ((b"id: 1\r" + TOKEN + b"\r\r", b"id: 2\r" + USAGE + b"\r\r"), True),
    # the last event left open, mid-line: the gateway's line end comes first
    "ids-last-event-open": ((b"id: 1\n" + TOKEN + b"\n\n", b"id: 2\n" + USAGE), True),
    # the SDK keeps the first event's id through the later ones, which have none
    "id-on-the-first-event-only": ((b"id: a\n" + TOKEN + b"\n\n", USAGE + b"\n\n"), True),
}


def _sdk_reads(gateway: Gateway, ask: dict[str, Any]) -> tuple[list[object], Exception | None]:
    """The usages the SDK showed, chunk by chunk, and what it raised, if anything."""
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key, max_retries=0)
    shown: list[object] = []
    extra = {"stream_options": ask["stream_options"]} if "stream_options" in ask else {}
    try:
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True, **extra
        )
        for chunk in stream:
            shown.append(None if chunk.usage is None else chunk.usage.model_dump(exclude_none=True))
    except Exception as exc:  # noqa: BLE001 (what the SDK raised is the finding)
        return shown, exc
    finally:
        client.close()
    return shown, None


@pytest.mark.parametrize("name", list(STREAMS))
def test_a_whole_stream_with_event_ids_is_read_whole_by_the_sdk_and_logged_as_received(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    name: str,
) -> None:
    events, asks_usage = STREAMS[name]
    ask = ASKS_USAGE if asks_usage else CHAT
    raw = start_raw(writes(*chunked(*events)))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = client_gets(gateway, ask)
    assert received.status == 200
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
    completion = request_log(tmp_path / "log", vkey, received.headers["x-request-id"])[-1]
    assert completion["status"] == 200 and completion.get("stream_error") is None
    assert completion["usage"] == COUNTS  # shown, or held back from the client
    shown, raised = _sdk_reads(gateway, ask)
    assert raised is None, (received.body, raised)
    assert [u for u in shown if u is not None] == ([COUNTS] if asks_usage else [])


PLAIN = (TOKEN + b"\n\n", USAGE + b"\n\n")
AT_DONE = (b"id: 1\n" + TOKEN + b"\n\n", b"id: 2\n" + USAGE + b"\n\n", DONE)


@pytest.mark.parametrize("events", [PLAIN, AT_DONE], ids=["no-ids", "ids-and-done"])
def test_a_stream_without_ids_or_ending_at_done_gets_no_id_line(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    events: tuple[bytes, ...],
) -> None:
    raw = start_raw(writes(*chunked(*events)))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = client_gets(gateway, ASKS_USAGE)
    assert received.body.startswith(b"".join(events) + b": owngate-receipt ")
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
    assert _sdk_reads(gateway, ASKS_USAGE)[1] is None


# An event past the 64 KiB the gateway's reader keeps of an unfinished event
# (gateway/api/sse_data.py `MAX_EVENT`), cut across reads: its `id` line comes first.
LONG = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"' + b"a" * 1_000_000 + b'"}}]}'


@pytest.mark.parametrize(
    "events",
    [
        (b"id: 1\n" + LONG[:400_000], LONG[400_000:] + b"\n\n", USAGE + b"\n\n"),
        (LONG[:400_000], LONG[400_000:] + b"\nid: 9\n\n", USAGE + b"\n\n"),
        (LONG[:999_000], LONG[999_000:] + b"\ni", b"d: 9\n\n", USAGE + b"\n\n"),
    ],
    ids=["id-before", "id-after", "id-cut-across-reads"],
)
def test_an_id_in_an_event_too_long_to_read_still_gets_the_id_line(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    events: tuple[bytes, ...],
) -> None:
    """The gateway's reader lets go of an unfinished event past 64 KiB unread, and with it
    an `id` line in it: the SDK kept that id, and raised at the receipt line's blank line
    at the end of an answer it had read whole."""
    raw = start_raw(writes(*chunked(*events)))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    shown, raised = _sdk_reads(gateway, ASKS_USAGE)
    assert raised is None, raised
    assert [u for u in shown if u is not None] == [COUNTS]
    received = client_gets(gateway, ASKS_USAGE)
    assert received.status == 200
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
