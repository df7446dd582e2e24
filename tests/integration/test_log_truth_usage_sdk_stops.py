"""Where the OpenAI SDK raises mid-stream, the completion record's usage is the last the
SDK showed before it raised, not a later one (a real gateway, provenance on, in front of a
scripted backend; the client's bytes replayed through the installed SDK's decoder,
tests/helpers/sdk_stream.py). One case per way the SDK stops: (a) a line that is not
UTF-8, (b) an event dispatched without data, (c) an event holding a usage or `[DONE]`
whose data is not JSON; and a valid character split across the backend's writes, which
stops nothing. And (c) at a paced server's pace: each event its own read (the backend
writes the next once the client has the last), an event whose data is not JSON read as
one `data: {` line, whatever it holds (gateway/api/sse_framing.py, `one_data_line`)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import pytest

from tests.helpers.audit_rig import ASKS_USAGE, chunked, client_gets, logged, settled, writes
from tests.helpers.gateways import Gateway, backend
from tests.helpers.independent_audit import audit, log_records
from tests.helpers.log_truth import DONE, EVENT
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head
from tests.helpers.sdk_stream import counts, sdk_shown_usage

SMALL = b'{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}'
BIG = b'{"prompt_tokens":900,"completion_tokens":900,"total_tokens":1800}'


def usage_chunk(usage: bytes) -> bytes:
    return b'data: {"id":"c","choices":[],"usage":' + usage + b"}\n\n"


def stopped_at(*stop: bytes) -> tuple[bytes, ...]:
    """SMALL shown, then what stops the SDK, then BIG (which it never reads)."""
    return chunked(EVENT, usage_chunk(SMALL), *stop, EVENT, usage_chunk(BIG), DONE)


WIDE = "日".encode()
STREAMS: dict[str, tuple[tuple[bytes, ...], bytes]] = {
    # (a) the SDK decodes each line with bytes.decode("utf-8"): it raises
    "a-comment-not-utf8": (stopped_at(b": \xff\n"), SMALL),
    "a-surrogate-in-data": (stopped_at(b'data: {"c":"\xed\xa0\x80"}\n\n'), SMALL),
    "a-character-cut-short": (stopped_at(b'data: {"c":"' + WIDE[:2] + b'"}\n\n'), SMALL),
    "a-character-split-across-writes": (
        chunked(
            EVENT,
            usage_chunk(SMALL),
            b'data: {"c":"' + WIDE[:1],
            WIDE[1:] + b'"}\n\n',
            usage_chunk(BIG),
            DONE,
        ),
        BIG,
    ),
    # (b) an event without data dispatched: json.loads("") raises
    "b-retry": (stopped_at(b"retry: 5\n\n"), SMALL),
    "b-id": (stopped_at(b"id: 1\n\n"), SMALL),
    "b-event-name": (stopped_at(b"event: ping\n\n"), SMALL),
    "b-id-then-blank-line": (stopped_at(b"id: 1\n", EVENT, b"\n"), SMALL),
    # (c) data that is not JSON, in an event the gateway parses
    "c-done-two-spaces": (stopped_at(b"data:  [DONE]\n\n"), SMALL),
    "c-usage-cut-short": (stopped_at(b'data: {"usage":{"prompt_tokens":5}\n\n'), SMALL),
    "c-two-usage-documents": (stopped_at(usage_chunk(SMALL)[:-1]), SMALL),
    # not a stop: the last usage shown has a count that is no integer (none, not SMALL's)
    "float-count-last": (
        chunked(EVENT, usage_chunk(SMALL), usage_chunk(b'{"prompt_tokens":3.9}'), DONE),
        b"null",
    ),
}


def _recorded_usage(logdir: Path, vkey: str) -> object:
    records = [json.loads(e) for e in log_records(logdir, vkey)]
    return [r for r in records if r["type"] == "completion"][-1]["usage"]


@pytest.mark.parametrize("case", list(STREAMS))
def test_the_record_s_usage_stops_where_the_sdk_raises(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    pieces, expected = STREAMS[case]
    raw = start_raw(writes(*pieces))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = client_gets(gateway, ASKS_USAGE)
    settled(tmp_path / "log", vkey, received.headers["x-request-id"])
    shown = counts(sdk_shown_usage(received.body))
    assert shown == json.loads(expected)  # what the installed SDK shows, held to the case
    assert _recorded_usage(tmp_path / "log", vkey) == shown
    assert audit(received, tmp_path / "log", vkey) == []  # the independent auditor's reading


def _lockstep(events: list[bytes], got: list[threading.Event]) -> Answer:
    """A chunked stream of `events`, one chunk each, the next written once the client
    has the last (`got`): each reaches the gateway as a read of its own."""

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        loop = asyncio.get_running_loop()
        writer.write(sse_head(b"transfer-encoding: chunked\r\n"))
        for event, arrived in zip(events, got, strict=True):
            writer.write(b"%x\r\n%b\r\n" % (len(event), event))
            await writer.drain()
            assert await loop.run_in_executor(None, arrived.wait, 30)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return False

    return answer


@pytest.mark.parametrize("line", [b"data: {x [DONE]", b"data: {x id: 1", b"data: {x"])
def test_a_paced_one_line_event_that_is_not_json_stops_the_record_s_usage(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    line: bytes,
) -> None:
    events = [EVENT, usage_chunk(SMALL), line + b"\n\n", EVENT, usage_chunk(BIG), DONE]
    got = [threading.Event() for _ in events]
    ends = [len(b"".join(events[: i + 1])) for i in range(len(events))]

    def arrived(body: bytes) -> bool:
        for end, event in zip(ends, got, strict=True):
            if len(body) >= end:
                event.set()
        return False

    raw = start_raw(_lockstep(events, got))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = client_gets(gateway, ASKS_USAGE, enough=arrived)
    assert received.body.startswith(b"".join(events))
    settled(tmp_path / "log", vkey, received.headers["x-request-id"])
    shown = counts(sdk_shown_usage(received.body))
    assert shown == json.loads(SMALL)  # the SDK raised at the line: BIG never shown
    assert _recorded_usage(tmp_path / "log", vkey) == shown
    assert audit(received, tmp_path / "log", vkey) == []


# An event whose data is not JSON and holds nothing the reader searches for, among others:
# SMALL shown, then `data: {x` (the SDK raises), then BIG, which the SDK never shows.
_NOT_JSON_AMONG = [EVENT, usage_chunk(SMALL), b"data: {x\n\n", EVENT, usage_chunk(BIG), DONE]
_BODY = b"".join(_NOT_JSON_AMONG)
_AT = _BODY.index(b"data: {x")
# Where the backend's writes are cut: nowhere (one read of every event), and at awkward
# places around the event the SDK refuses (inside its data, between its two line ends,
# just before and after it, inside the next event's field name).
CUTS: dict[str, tuple[int, ...]] = {
    "coalesced": (),
    "inside-its-data": (_AT + len(b"data: {"),),
    "between-its-line-ends": (_AT + len(b"data: {x\n"),),
    "just-before-and-after": (_AT, _AT + len(b"data: {x\n\n")),
    "inside-a-field-name": (_AT - 3, _AT + 2, _AT + len(b"data: {x\n\nda")),
}


@pytest.mark.parametrize("cut", list(CUTS))
def test_a_needle_less_event_that_is_not_json_stops_the_record_whatever_the_reads(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    cut: str,
) -> None:
    bounds = (0, *CUTS[cut], len(_BODY))
    pieces = [_BODY[a:b] for a, b in pairwise(bounds)]
    got = [threading.Event() for _ in pieces]
    ends = [bounds[i + 1] for i in range(len(pieces))]

    def arrived(body: bytes) -> bool:
        for end, event in zip(ends, got, strict=True):
            if len(body) >= end:
                event.set()
        return False

    raw = start_raw(_lockstep(pieces, got))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = client_gets(gateway, ASKS_USAGE, enough=arrived)
    assert received.body.startswith(_BODY)
    settled(tmp_path / "log", vkey, received.headers["x-request-id"])
    shown = counts(sdk_shown_usage(received.body))
    assert shown == json.loads(SMALL)  # the SDK raised at `data: {x`: BIG never shown
    assert _recorded_usage(tmp_path / "log", vkey) == shown
    assert audit(received, tmp_path / "log", vkey) == []
