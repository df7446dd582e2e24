"""A hosted answer LiteLLM reads with its *sync* httpx client is bounded too
(`limits.max_response_bytes`, gateway/upstream/hosted_bound.py).

LiteLLM 1.108.7 serves some providers (`maritalk/`, `oobabooga/`, `nlp_cloud/`,
`petals/`) only synchronously: `acompletion` runs their handler in a worker thread, which
sends through `httpx.Client.send`. Only the async `send` was bounded, so such a
provider's 48 MiB answer was read whole into memory and relayed. Asserted on what the
provider managed to write, as in tests/integration/test_hosted_answer_bound.py.
"""

from __future__ import annotations

import asyncio
import gzip
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import pytest

from gateway.upstream.hosted_bound import NOT_IDENTITY, AnswerTooLarge
from gateway.upstream.hosted_transport import install_transport_marks, watching
from tests.helpers.gateways import HOSTED_ONLY_POLICY, LITELLM_WARNINGS, Gateway, hosted_backend
from tests.helpers.hosted_flood import (
    ANSWER_HEAD,
    ANSWER_TAIL,
    LIMIT,
    LINE_HEAD,
    TOO_LARGE,
    flood,
)
from tests.helpers.raw_backend import Answer, Post, RawBackend, completion_body, json_answer
from tests.helpers.waiting import until

pytestmark = LITELLM_WARNINGS


def maritalk_gateway(
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    provider: RawBackend,
    route: str = "maritalk",
    **limits: float,
) -> Gateway:
    """A gateway whose one hosted backend is LiteLLM's `maritalk/` route (or `route`) at
    `provider`, with `max_response_bytes` LIMIT and the other `limits` given."""
    (tmp_path / "policy.yaml").write_text(HOSTED_ONLY_POLICY)
    backend = hosted_backend(
        "hosted",
        provider.url + "/v1",
        provider=route,
        owner=route,
        models=[{"name": "m", "provider_model": f"{route}/m"}],
    )
    return start_gateway(
        [backend],
        policy={"paths": [str(tmp_path)]},
        environ={"HOSTED_KEY": "test-key"},
        limits={"max_response_bytes": LIMIT, **limits},
    )


def _ask(gateway: Gateway) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(
        gateway.url + "/v1/chat/completions", json=body, headers=gateway.headers, timeout=120
    )


def test_a_sync_route_flood_is_read_no_further_than_the_bound(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    # (A stream on these routes fails in LiteLLM 1.108.7 itself before a chunk: its async
    # wrapper iterates their sync generator as an async one. The sync stream's bound is
    # asserted below, on httpx's Client as LiteLLM uses it.)
    written = [0]
    provider = start_raw(flood(b"application/json", ANSWER_HEAD, ANSWER_TAIL, written))
    gateway = maritalk_gateway(start_gateway, tmp_path, provider)
    response = _ask(gateway)
    assert provider.finished.wait(60)
    assert provider.connections == 1  # it was this route that sent
    # the bound, plus what the sockets' buffers on both sides hold on loopback
    assert written[0] < LIMIT + 8 * 1024 * 1024, f"the gateway read {written[0]} bytes"
    assert response.status_code == 502, response.text
    assert TOO_LARGE in response.json()["error"]["message"]
    assert b"xxxx" not in response.content


def test_a_sync_route_answer_within_the_bound_is_served(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    content = "y" * (LIMIT - 4096)
    provider = start_raw(json_answer(completion_body(content)))
    gateway = maritalk_gateway(start_gateway, tmp_path, provider)
    response = _ask(gateway)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == content


# What LiteLLM's `custom/` route reads: its own shape, not OpenAI's.
CUSTOM_BODY = orjson.dumps({"data": [{"prompt": "hi", "output": ["ok"]}], "message": "ok"})


@pytest.mark.parametrize(
    ("route", "answer"),
    [
        ("maritalk", completion_body("ok")),
        ("amazon_nova", completion_body("ok")),
        ("custom", CUSTOM_BODY),
    ],
)
def test_a_stream_to_a_sync_route_is_refused_unsent(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    route: str,
    answer: bytes,
) -> None:
    # LiteLLM 1.108.7 cannot stream these routes: the request went out, its stream failed
    # before a chunk, and the provider connection it left open was never closed (one held
    # per streamed request). Refused before anything is sent, naming the field.
    # `amazon_nova/` runs maritalk's sync handler: its streams were sent (503) and each
    # held its provider connection open. `custom/` sent its streams and failed them
    # (503), opening the backend's breaker for every tenant's whole answers.
    provider = start_raw(json_answer(answer))
    gateway = maritalk_gateway(start_gateway, tmp_path, provider, route)
    for _ in range(3):
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        response = httpx.post(
            gateway.url + "/v1/chat/completions", json=body, headers=gateway.headers, timeout=60
        )
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "stream"
        assert "not sent" in error["message"]
    assert provider.connections == 0  # nothing reached the provider
    response = _ask(gateway)  # a whole answer on the route is still served
    assert response.status_code == 200, response.text
    assert provider.connections == 1


def _read_all(client: httpx.Client, url: str, *, whole: bool) -> None:
    """POST to `url` and read the answer, whole or as a stream line by line."""
    if whole:
        client.post(url, json={})
        return
    with client.stream("POST", url, json={}) as response:
        for _ in response.iter_lines():
            pass


@pytest.mark.parametrize("whole", [False, True])
def test_a_sync_send_in_a_watched_call_is_bounded(
    start_raw: Callable[[Answer], RawBackend], whole: bool
) -> None:
    # What LiteLLM's worker thread does: httpx's sync Client, in the call's context. A
    # stream's endless first event, or a whole answer, is read no further than the bound.
    install_transport_marks()  # as gateway/upstream/litellm_runtime.py does at load
    written = [0]
    provider = start_raw(flood(b"text/event-stream", LINE_HEAD, b'"}}]}\n\n', written))
    url = provider.url + "/v1/chat/completions"
    with (
        watching(LIMIT) as outbound,
        httpx.Client(timeout=60) as client,
        pytest.raises(AnswerTooLarge),
    ):
        _read_all(client, url, whole=whole)
    assert provider.finished.wait(60)
    assert outbound.reached
    assert outbound.cut is not None and f"larger than {LIMIT} bytes" in outbound.cut
    assert written[0] < LIMIT + 8 * 1024 * 1024, f"read {written[0]} bytes"


def test_a_sync_send_in_a_content_coding_is_refused_unread(
    start_raw: Callable[[Answer], RawBackend],
) -> None:
    bomb = gzip.compress(ANSWER_HEAD + b"x" * (8 * LIMIT) + ANSWER_TAIL, compresslevel=9)
    asked: list[bytes] = []

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        asked.extend(post.header_values(b"accept-encoding"))
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(bomb), bomb)
        )
        await writer.drain()
        return False

    install_transport_marks()
    provider = start_raw(answer)
    with (
        watching(LIMIT) as outbound,
        httpx.Client(timeout=60) as client,
        pytest.raises(AnswerTooLarge),
    ):
        client.post(provider.url + "/v1/chat/completions", json={})
    assert asked == [b"identity"]
    assert outbound.cut == NOT_IDENTITY


def test_a_sync_read_stops_when_its_call_has_timed_out(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    # LiteLLM reads a sync route's answer in a worker thread, which the call's timeout
    # does not reach: the client had its 504, and the thread went on reading a provider
    # that sent a byte every 50 ms for as long as it liked (holding a thread of the
    # loop's default executor, which reloads and the admin API use, and the connection).
    # It stops at its next read once the call has ended.
    stop = threading.Event()
    dripped = [0]

    async def drip(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(ANSWER_HEAD), ANSWER_HEAD)
        )
        await writer.drain()
        for _ in range(2400):  # 120 s at most
            if stop.is_set():
                break
            await asyncio.sleep(0.05)
            writer.write(b"1\r\nx\r\n")
            await writer.drain()  # raises once the gateway dropped the connection
            dripped[0] += 1
        return False

    provider = start_raw(drip)
    gateway = maritalk_gateway(
        start_gateway,
        tmp_path,
        provider,
        first_byte_timeout_s=1,
        response_timeout_s=2,
    )
    try:
        response = _ask(gateway)
        assert response.status_code == 504, response.text
        # before: still read 10 s on (the drip goes on for 120 s)
        until(
            lambda: provider.ended == provider.connections == 1,
            "the provider connection closed",
            detail=lambda: f"{dripped[0]} bytes dripped and read",
        )
    finally:
        stop.set()


def test_a_sync_routes_whole_answer_has_the_response_timeout_once_its_head_is_in(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    # As on the async routes (docs/configuration.md, limits.first_byte_timeout_s): the
    # head by the first-byte timeout, the body then within limits.response_timeout_s.
    # The sync read never told the call its head was in, so a body that took longer than
    # the first-byte timeout was a 504 well within the response timeout.
    content = b"y" * 4096

    async def slow_body(writer: asyncio.StreamWriter, _post: Post) -> bool:
        body = completion_body(content.decode())
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(body)
        )
        await writer.drain()
        for start in range(0, len(body), len(body) // 20 + 1):  # over about 2 s
            await asyncio.sleep(0.1)
            writer.write(body[start : start + len(body) // 20 + 1])
            await writer.drain()
        return False

    provider = start_raw(slow_body)
    gateway = maritalk_gateway(
        start_gateway,
        tmp_path,
        provider,
        first_byte_timeout_s=1,
        response_timeout_s=30,
    )
    response = _ask(gateway)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == content.decode()
