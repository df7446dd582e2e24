"""The usage a completion record states is the usage its client was shown, read as the
client's JSON parser reads it (gateway/api/usage_read.py), from a hostile or broken
private backend: a count left out or zero, a document orjson refuses and Python's `json`
reads (`NaN`, a lone surrogate escape, a byte order mark, a number past a double's
range), usage after `[DONE]` (which no SDK reads), and the tail of a comment line too
long to hold, cut by a read boundary just before a `data: {"usage"...` of its own.

Each case runs a real gateway (provenance on) in front of a scripted backend and
checks the log with the independent auditor (tests/helpers/independent_audit.py).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.audit_rig import (
    ANSWER,
    ASKS_USAGE,
    JSON,
    USAGE,
    USAGE_CHUNK,
    WHOLE,
    chunked,
    client_gets,
    logged,
    private_answer_logged,
    settled,
    whole_answer,
    writes,
)
from tests.helpers.gateways import Gateway, backend
from tests.helpers.independent_audit import audit, log_records
from tests.helpers.log_truth import CHAT, DONE, EVENT
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head


def writes_sse(*events: bytes) -> tuple[bytes, ...]:
    """An SSE answer of `events` whose body ends with the connection (no framing)."""
    return (sse_head(), *events)


def _usage_chunk(usage: bytes, extra: bytes = b"") -> bytes:
    return b'data: {"id":"c","choices":[],"usage":' + usage + extra + b"}\n\n"


OTHER = b'{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}'
NAN = _usage_chunk(USAGE, b',"x":NaN')
# One usage chunk over three `data:` lines: an SDK joins them with LF and reads one JSON
# document (the gateway read each line alone: none parsed, the record said null).
SPREAD = b'data: {"id":"c","choices":[],\ndata: "usage":\ndata: ' + USAGE + b"}\n\n"
# Two usage documents in one event: their join does not parse, the SDK shows neither
# (the gateway recorded the second).
TWO = _usage_chunk(USAGE)[:-1] + _usage_chunk(OTHER)
# A backend's own error event in its 200 stream, exactly as the gateway writes its own.
BACKEND_ERROR = (
    b'data: {"error":{"message":"the backend failed","type":"server_error",'
    b'"param":null,"code":"upstream_error"}}\n\n'
)

CASES: dict[str, tuple[tuple[bytes, ...], dict[str, Any]]] = {
    # The SDKs stop at `[DONE]`: the usage after it is no usage the client saw.
    "usage-after-done-asked": (chunked(EVENT, _usage_chunk(OTHER), DONE, USAGE_CHUNK), ASKS_USAGE),
    "usage-zero-last-asked": (
        chunked(
            EVENT,
            USAGE_CHUNK,
            _usage_chunk(b'{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}'),
            DONE,
        ),
        ASKS_USAGE,
    ),
    "usage-total-left-out-asked": (
        chunked(
            EVENT, USAGE_CHUNK, _usage_chunk(b'{"prompt_tokens":4,"completion_tokens":4}'), DONE
        ),
        ASKS_USAGE,
    ),
    "usage-nan-asked": (chunked(EVENT, NAN, DONE), ASKS_USAGE),
    "usage-over-data-lines-asked": (chunked(EVENT, SPREAD, DONE), ASKS_USAGE),
    "usage-over-data-lines-held-back": (chunked(EVENT, SPREAD, DONE), CHAT),
    "usage-over-data-lines-cr": (
        chunked(EVENT, SPREAD.replace(b"\n", b"\r"), DONE.replace(b"\n", b"\r")),
        ASKS_USAGE,
    ),
    "usage-escaped-key-asked": (
        chunked(EVENT, _usage_chunk(OTHER).replace(b'"usage"', b'"\\u0075sage"'), DONE),
        ASKS_USAGE,
    ),
    "two-usages-in-one-event-asked": (chunked(EVENT, TWO, DONE), ASKS_USAGE),
    "usage-after-backend-error-asked": (
        chunked(EVENT, BACKEND_ERROR, _usage_chunk(OTHER), DONE),
        ASKS_USAGE,
    ),
    "backend-error-event": (chunked(EVENT, BACKEND_ERROR, DONE), CHAT),
    "backend-error-event-last-unframed": (writes_sse(EVENT, BACKEND_ERROR[:-2]), CHAT),
    "usage-nan-held-back": (chunked(EVENT, NAN, DONE), CHAT),
    "whole-nan": ((whole_answer(200, ANSWER[:-1] + b',"x":NaN}', JSON),), WHOLE),
    "whole-bom": ((whole_answer(200, b"\xef\xbb\xbf" + ANSWER, JSON),), WHOLE),
    "whole-lone-surrogate": ((whole_answer(200, ANSWER[:-1] + b',"x":"\\ud800"}', JSON),), WHOLE),
    "whole-1e400": ((whole_answer(200, ANSWER[:-1] + b',"x":1e400}', JSON),), WHOLE),
}


def _record(logdir: Path, vkey: str) -> dict[str, Any]:
    records: list[dict[str, Any]] = [json.loads(e) for e in log_records(logdir, vkey)]
    return [r for r in records if r["type"] == "completion"][-1]


@pytest.mark.parametrize("case", list(CASES))
def test_the_record_s_usage_is_the_usage_the_client_was_shown(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    received, vkey = private_answer_logged(start_raw, start_gateway, tmp_path, *CASES[case])
    record = _record(tmp_path / "log", vkey)
    if case == "usage-nan-held-back":  # kept from the client, recorded all the same
        assert b'"usage"' not in received.body
        assert record["usage"] == json.loads(USAGE)
    if case in ("two-usages-in-one-event-asked", "usage-after-backend-error-asked"):
        assert record["usage"] is None  # none shown: the SDK read none
    if "usage-over-data-lines" in case:
        assert record["usage"] == json.loads(USAGE)
    # The backend's error event, not the gateway's: the client got 200, an error event
    # its SDK raised, and the record says so.
    errors = "backend-error" in case or "after-backend-error" in case
    assert record.get("stream_error") == ("backend" if errors else None)
    # (the unframed one then closed before [DONE]: the SDK raised at the backend's error
    # event, read nothing after it, as a client that left there: 200, no gateway error
    # event; before, 502 and an error event it never read, tests/integration/
    # test_log_truth_sdk_end.py)
    assert record["status"] == 200 and record["error"] is None
    assert received.body.count(b"upstream_error") == (1 if errors else 0)  # the backend's


def test_a_comment_too_long_to_hold_hides_no_usage_in_its_tail(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """A comment line past the watch's 64 KiB bound, whose rest arrives in a read of its
    own starting `data: {...,"usage":...}`: to the client all of it is one comment, so
    the record holds no usage of it (it held the tail's counts, which the tenant was
    charged)."""
    comment = b": " + b"p" * (80 << 10)
    hidden = _usage_chunk(b'{"prompt_tokens":900,"completion_tokens":900,"total_tokens":1800}')
    relayed = threading.Event()

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(sse_head() + EVENT + comment)
        await writer.drain()
        # The gateway relayed the comment's start before its rest is written: the rest
        # comes in a read of its own.
        await asyncio.get_running_loop().run_in_executor(None, relayed.wait, 30)
        writer.write(hidden + DONE)
        await writer.drain()
        return False

    raw = start_raw(answer)
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])

    def read(body: bytes) -> bool:
        if len(body) >= len(EVENT + comment):
            relayed.set()
        return False  # read to the end

    received = client_gets(gateway, ASKS_USAGE, enough=read)
    relayed.set()
    assert received.body.startswith(EVENT + comment + hidden + DONE)
    settled(tmp_path / "log", vkey, received.headers["x-request-id"])
    assert audit(received, tmp_path / "log", vkey) == []
    assert _record(tmp_path / "log", vkey)["usage"] is None


def test_a_backend_error_event_counts_against_the_backend_s_breaker(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """A stream whose backend sends its own error event failed, as a 5xx does: with a
    breaker that one failure opens, the next request finds no backend (it counted as a
    success, and the next request went to the failing backend again)."""
    raw = start_raw(writes(*chunked(EVENT, BACKEND_ERROR, DONE)))
    breaker = {"breaker": {"failure_threshold": 1, "cooldown_s": 60, "max_cooldown_s": 60}}
    gateway, _ = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")], routing=breaker)
    first = client_gets(gateway, CHAT)
    assert first.status == 200 and BACKEND_ERROR in first.body
    second = client_gets(gateway, CHAT)
    assert second.status == 503, second.body
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    assert 'kind="error_event"' in metrics
