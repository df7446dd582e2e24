"""A piece of a stream that never went out is not read into the record.

The direct relay (gateway/api/stream_relay.py, its `sink`) fed each read to the stream's
watch (the usage and the error event the client read) before `BodyWriter.write` found
the client's connection reset and not yet told (uvloop closes it at once and tells the
protocol a turn later), and wrote nothing: the record of the client that left (499) then
stated a usage from a chunk the client never got, where the docs say the usage recorded
is "that of the last event holding a usage object with counts that the client read";
so with a backend's error event the client never got (`stream_error`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.body_writer import BodyWriter
from gateway.upstream.response import UpstreamResponse
from tests.helpers.audit_rig import (
    ASKS_USAGE,
    USAGE_CHUNK,
    chunked,
    first_request_settled,
    logged,
    request_log,
)
from tests.helpers.gateways import Gateway, backend
from tests.helpers.log_truth import DONE, EVENT
from tests.helpers.raw_backend import Answer, Post, RawBackend

ERROR = b'data: {"error":{"message":"down"}}\n\n'


@pytest.mark.parametrize(
    ("piece", "mark"), [(USAGE_CHUNK, b'"usage"'), (ERROR, b'"error"')], ids=["usage", "error"]
)
def test_a_piece_that_found_the_connection_reset_is_not_read_into_the_record(
    piece: bytes,
    mark: bytes,
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read_first = threading.Event()  # the client read the first event
    release = threading.Event()
    head, first, usage, done = chunked(EVENT, piece, DONE, last=False)

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(head + first)
        await writer.drain()
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, read_first.wait, 30)
        writer.write(usage + done)  # one read: the piece and `[DONE]`
        await writer.drain()
        await loop.run_in_executor(None, release.wait, 30)  # the body never ends
        return False

    writers: list[BodyWriter] = []
    ready = BodyWriter.ready

    def kept(writer: BodyWriter) -> bool:
        writers.append(writer)
        return ready(writer)

    push = UpstreamResponse._push
    reset: list[bytes] = []

    def reset_first(response: UpstreamResponse, data: bytes) -> None:
        """The client's reset arrives as the backend's piece is read: the
        connection is closing, its `connection_lost` not yet delivered (uvloop)."""
        if mark in data and writers and not reset:
            reset.append(data)
            cycle = writers[-1]._cycle()
            assert cycle is not None
            cycle.transport.abort()
        push(response, data)

    monkeypatch.setattr(BodyWriter, "ready", kept)
    monkeypatch.setattr(UpstreamResponse, "_push", reset_first)
    raw = start_raw(answer)
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    try:
        body = _read_until_cut(gateway, read_first)
        request_id = first_request_settled(tmp_path / "log", vkey)
    finally:
        read_first.set()
        release.set()
    assert reset, "the piece never came"
    assert piece not in body
    last = request_log(tmp_path / "log", vkey, request_id)[-1]
    assert last["status"] == 499, last
    assert last["usage"] is None, last  # the client read none
    assert last.get("stream_error") is None, last  # nor the backend's error event


def _read_until_cut(gateway: Gateway, read_first: threading.Event) -> bytes:
    """The stream as the client read it until the gateway's side of its connection went
    (`read_first` set once the first event came)."""
    body = bytearray()
    try:
        with httpx.stream(
            "POST",
            f"{gateway.url}/v1/chat/completions",
            json=ASKS_USAGE,
            headers=gateway.headers,
            timeout=30,
        ) as response:
            for read in response.iter_raw():
                body += read
                if EVENT in body:
                    read_first.set()
    except httpx.HTTPError:
        return bytes(body)
    raise AssertionError("the stream ended whole: the connection was never reset")
