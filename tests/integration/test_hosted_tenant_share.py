"""Each tenant's share of a hosted backend's calls (gateway/upstream/tenant_share.py).

Every tenant's hosted calls go through one LiteLLM connector, whose pool (500 connections
per host) a stream holds for as long as the provider streams. Here LiteLLM's pool is made
as small as the configured one (`limits.max_connections_per_backend`, 2), so that two
unread streams hold all of it, as 500 would the real one: `acme` opens two streams it
never reads, the provider pacing tokens until the test releases it, then `other` asks.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx
import pytest

from gateway.tenants import hash_api_key
from gateway.upstream.litellm_runtime import load_litellm
from gateway.upstream.tenant_share import hosted_calls
from tests.helpers.gateways import (
    HOSTED_ONLY_POLICY,
    LITELLM_WARNINGS,
    OTHER_KEY,
    TENANT_KEY,
    Gateway,
    hosted_backend,
)
from tests.helpers.paced_stream import paced
from tests.helpers.raw_backend import Answer, Post, RawBackend, completion_response, sse_head
from tests.helpers.waiting import until, until_async

pytestmark = LITELLM_WARNINGS

TWO_TENANTS = [
    {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["m"]},
    {"id": "other", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["m"]},
]
POOL = 2  # limits.max_connections_per_backend, and LiteLLM's connections per host here
ASK = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def small_litellm_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """LiteLLM's connectors made from now on hold POOL connections per host, not 500."""
    load_litellm()
    handler = sys.modules["litellm.llms.custom_httpx.http_handler"]
    monkeypatch.setattr(handler, "AIOHTTP_CONNECTOR_LIMIT_PER_HOST", POOL)


def _hosted_gateway(
    start_gateway: Callable[..., Gateway], raw: RawBackend, tmp_path: Path
) -> Gateway:
    policy = HOSTED_ONLY_POLICY.replace("tenants: [acme]", "tenants: [acme, other]")
    (tmp_path / "policy.yaml").write_text(policy)
    return start_gateway(
        [hosted_backend("hosted", raw.url + "/v1", "m")],
        policy={"paths": [str(tmp_path)]},
        environ={"HOSTED_KEY": "test-key"},
        tenants=TWO_TENANTS,
        limits={"max_connections_per_backend": POOL, "first_byte_timeout_s": 3.0},
    )


def _request(
    client: httpx.AsyncClient, key: str, content: str = "hi", **fields: object
) -> httpx.Request:
    """A chat request of the tenant whose key is `key`, its message `content`."""
    messages = [{"role": "user", "content": content}]
    return client.build_request(
        "POST",
        "/v1/chat/completions",
        json={**ASK, "messages": messages, **fields},
        headers={"authorization": f"Bearer {key}"},
    )


def test_one_tenants_unread_hosted_streams_leave_another_tenant_an_answer(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    small_litellm_pool: None,
) -> None:
    """`acme` opens POOL hosted streams and reads none. Without a share both held
    LiteLLM's connections and `other`'s call waited for one until the first-byte timeout
    (504). With two tenants `acme` may hold half (`tenant_share_of_backend`, 0.5): its
    second stream is `busy` at once (503 with `retry-after: 1`, nothing else may serve
    it) and `other` is served."""
    released = threading.Event()
    raw = start_raw(paced(released))
    gateway = _hosted_gateway(start_gateway, raw, tmp_path)

    statuses, refused, theirs = asyncio.run(_held_then_other(gateway, released))
    # busy: told when to retry (before, the 503 said nothing)
    assert refused.json()["error"]["code"] == "backend_unavailable", refused.text
    assert refused.headers.get("retry-after") == "1", refused.headers
    assert theirs.status_code == 200, theirs.text
    assert statuses == [200, 503]


async def _held_then_other(
    gateway: Gateway, released: threading.Event
) -> tuple[list[int], httpx.Response, httpx.Response]:
    """`acme` opens POOL streams and reads none (the last one's answer read whole when it
    is a refusal), then `other` asks once; the streams' statuses, the last
    stream and `other`'s answer. `released` is set at the end, whatever happened."""
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as acme:
        held: list[httpx.Response] = []
        try:
            for _ in range(POOL):  # never read
                asked = _request(acme, TENANT_KEY, stream=True, max_tokens=3000)
                held.append(await acme.send(asked, stream=True))
            refused = held[-1]
            if refused.status_code != 200:  # a stream held open would be read to its end
                await refused.aread()
            async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as other:
                theirs = await other.send(_request(other, OTHER_KEY))
            return [response.status_code for response in held], refused, theirs
        finally:
            released.set()
            for response in held:
                await response.aclose()


def _provider(release: threading.Event) -> Answer:
    """Answers by the request's message: `whole` a whole answer, `stream` a short stream,
    `fail` a 500; `held` a stream that goes on (a token every 50 ms, 10 s at most) until
    the gateway closes it; `silent` nothing, until `release`."""

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        asked = json.loads(post.body)["messages"][0]["content"]
        if asked == "whole":
            writer.write(completion_response("ok"))
        elif asked == "fail":
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n")
        elif asked == "silent":
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 30)
        else:
            writer.write(sse_head())
            rounds = 2 if asked == "stream" else 200
            for n in range(rounds):
                chunk = {"id": "s", "object": "chat.completion.chunk", "created": 1}
                chunk |= {"model": "m", "choices": [{"index": 0, "delta": {"content": f"{n}"}}]}
                writer.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                try:
                    await writer.drain()
                except ConnectionError:
                    return False
                if asked == "held":
                    await asyncio.sleep(0.05)
            writer.write(b"data: [DONE]\n\n")
        await writer.drain()
        return False

    return answer


ROUNDS = 3  # each way a call ends, this many times: one leak leaves `acme` busy


def test_every_way_a_hosted_call_ends_gives_the_tenants_share_back(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """With a share of one call, `acme`'s calls end every way a call can, ROUNDS times
    each: answered whole, a stream read to its end, the provider failing (500), the
    client gone mid-stream, the client gone before the first byte (the call cancelled
    while LiteLLM waits for the provider). After each, `acme` holds nothing, and its next
    call is served."""
    release = threading.Event()
    raw = start_raw(_provider(release))
    gateway = _hosted_gateway(start_gateway, raw, tmp_path)
    calls = gateway.app.registry.backends["hosted"].calls
    assert calls is not None and calls.cap == 1

    def held() -> int:
        return calls.held("acme")

    async def gone_before_the_first_byte(acme: httpx.AsyncClient) -> None:
        posted = len(raw.posts)
        sent = asyncio.ensure_future(acme.send(_request(acme, TENANT_KEY, "silent")))
        try:
            await until_async(lambda: len(raw.posts) > posted, "the call at the provider")
            await until_async(lambda: held() == 1, "the call counted")
        finally:
            sent.cancel()  # the client's connection closes
            await asyncio.gather(sent, return_exceptions=True)

    async def gone_mid_stream(acme: httpx.AsyncClient) -> None:
        asked = _request(acme, TENANT_KEY, "held", stream=True)
        response = await acme.send(asked, stream=True)
        assert response.status_code == 200
        async for _ in response.aiter_bytes():
            break  # one chunk, then the client leaves
        await response.aclose()

    async def asked(acme: httpx.AsyncClient, content: str, stream: bool, status: int) -> None:
        request = _request(acme, TENANT_KEY, content, stream=stream)
        response = await acme.send(request)
        assert response.status_code == status, (content, response.text)

    async def run() -> None:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as acme:
            for _ in range(ROUNDS):
                for end in (
                    partial(asked, acme, "whole", False, 200),
                    partial(asked, acme, "stream", True, 200),
                    partial(asked, acme, "fail", False, 503),
                    partial(gone_mid_stream, acme),
                    partial(gone_before_the_first_byte, acme),
                ):
                    await end()
                    what = f"acme's share given back after {end.func.__name__}{end.args[1:]}"
                    await until_async(lambda: held() == 0, what)
            await asked(acme, "whole", False, 200)

    try:
        asyncio.run(run())
    finally:
        release.set()
    until(lambda: held() == 0, "nothing held")


def test_the_share_is_of_the_calls_litellm_makes_at_once(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`max_connections_per_backend` larger than LiteLLM's connections per host (here 8
    and POOL, as 1,024 and 500 would be): a share of the configured 8 let `acme` hold 4
    calls, and its POOL unread streams held every connection to the provider, `other`'s
    call waiting until the first-byte timeout (504). The share is of the POOL calls
    LiteLLM makes at once (`hosted_calls`): `acme`'s second stream is `busy` (503) and
    `other` is served."""
    load_litellm()
    handler = sys.modules["litellm.llms.custom_httpx.http_handler"]
    monkeypatch.setattr(handler, "AIOHTTP_CONNECTOR_LIMIT_PER_HOST", POOL)
    monkeypatch.setenv("AIOHTTP_CONNECTOR_LIMIT_PER_HOST", str(POOL))  # where LiteLLM reads it
    released = threading.Event()
    raw = start_raw(paced(released))
    policy = HOSTED_ONLY_POLICY.replace("tenants: [acme]", "tenants: [acme, other]")
    (tmp_path / "policy.yaml").write_text(policy)
    gateway = start_gateway(
        [hosted_backend("hosted", raw.url + "/v1", "m")],
        policy={"paths": [str(tmp_path)]},
        environ={"HOSTED_KEY": "test-key"},
        tenants=TWO_TENANTS,
        limits={"max_connections_per_backend": 4 * POOL, "first_byte_timeout_s": 3.0},
    )

    statuses, _, theirs = asyncio.run(_held_then_other(gateway, released))
    assert theirs.status_code == 200, theirs.text
    assert statuses == [200, 503]


def test_hosted_calls_has_litellms_defaults() -> None:
    """`hosted_calls` reads LiteLLM's connector limits as LiteLLM does, its defaults too."""
    load_litellm()
    constants = sys.modules["litellm.constants"]
    per_host, in_all = constants.AIOHTTP_CONNECTOR_LIMIT_PER_HOST, constants.AIOHTTP_CONNECTOR_LIMIT
    assert hosted_calls(10**6, {"AIOHTTP_CONNECTOR_LIMIT": "0"}) == per_host
    assert hosted_calls(10**6, {"AIOHTTP_CONNECTOR_LIMIT_PER_HOST": "0"}) == in_all
