"""A private stream with an event past the 64 KiB the gateway reads of one event
(`sse_events.EventReader`'s `max_event`), against what the client's SDK reads and what the
log says.

The event's bytes are relayed as written and the response commitment covers them. Its
usage is what the SDK shows: past a long event that is JSON (a long content delta) the
SDK reads on and shows the usage chunk, and the record states it; at a long event that is
not JSON the SDK raises (`json.loads`), reads no further and shows no usage, and the
record states none, though the backend wrote a usage chunk after it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from tests.helpers.audit_rig import (
    ASKS_USAGE,
    USAGE_CHUNK,
    assert_logged_as_received,
    chunked,
    client_gets,
    logged,
    request_log,
    writes,
)
from tests.helpers.gateways import Gateway, backend
from tests.helpers.log_truth import DONE, EVENT
from tests.helpers.raw_backend import Answer, RawBackend

_LONG = 70_000  # past the 64 KiB the gateway reads of one event
_NOT_JSON = b"data: " + b"x" * _LONG + b"\n\n"
_JSON = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"' + b"y" * _LONG + b'"}}]}\n\n'


def _sdk_usage(gateway: Gateway) -> tuple[object, bool]:
    """The last usage the OpenAI SDK showed reading the stream, and whether it raised."""
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key, max_retries=0)
    usage: object = None
    try:
        stream = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            usage = chunk.usage.model_dump(exclude_none=True) if chunk.usage is not None else usage
    except json.JSONDecodeError:
        return usage, True
    finally:
        client.close()
    return usage, False


@pytest.mark.parametrize("long", [_NOT_JSON, _JSON], ids=["not-json", "json"])
def test_a_long_event_is_relayed_and_the_usage_recorded_is_the_one_the_sdk_shows(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    long: bytes,
) -> None:
    raw = start_raw(writes(*chunked(EVENT, long, USAGE_CHUNK, DONE)))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = client_gets(gateway, ASKS_USAGE)
    assert received.status == 200
    assert EVENT + long + USAGE_CHUNK + DONE in received.body
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
    completion = request_log(tmp_path / "log", vkey, received.headers["x-request-id"])[-1]
    shown, raised = _sdk_usage(gateway)
    assert raised == (long is _NOT_JSON)
    assert completion["status"] == 200
    assert completion["usage"] == shown
    assert (shown is None) == (long is _NOT_JSON)
