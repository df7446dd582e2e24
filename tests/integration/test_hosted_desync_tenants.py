"""Two tenants through one hosted provider's pooled connections, the provider out of step
with its requests: no tenant reads a response the provider wrote after another tenant's
answer had ended (gateway/upstream/hosted_sockets.py).

Every tenant's hosted calls share the connections LiteLLM's cached client keeps for the
provider (one aiohttp connector). aiohttp parses what arrives on an idle pooled connection
and queues it as the answer to the next request sent on it: a provider (or whoever
answers at its URL) that wrote a second response after `acme`'s answer had `other`'s
next request answered with it, acme's content.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.tenants import hash_api_key
from tests.helpers.gateways import (
    HOSTED_ONLY_POLICY,
    LITELLM_WARNINGS,
    OTHER_KEY,
    TENANT_KEY,
    Gateway,
    hosted_backend,
)
from tests.helpers.raw_backend import Answer, Post, RawBackend, completion_response

pytestmark = LITELLM_WARNINGS

TWO_TENANTS = [
    {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["m"]},
    {"id": "other", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["m"]},
]
ACME, OTHER = "acme-secret-7f3a", "other-question-19c2"


def _provider(answered: threading.Event, forged: threading.Event, late: bytes) -> Answer:
    """Answers each request with its message's content; after acme's first answer, once
    acme's client has it, writes `late` on the same connection and keeps it open."""

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        asked: str = json.loads(post.body)["messages"][0]["content"]
        writer.write(completion_response(asked))
        await writer.drain()
        if asked == ACME and not forged.is_set():
            await asyncio.to_thread(answered.wait, 10)
            writer.write(late)
            await writer.drain()
            forged.set()
        return True

    return answer


def _ask(gateway: Gateway, key: str, content: str) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": content}]},
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )


@pytest.mark.parametrize(
    "late",
    [
        completion_response(f"for {ACME}"),
        # a head and part of a body: the next answer would be read as its rest
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 4000\r\n\r\n"
        + b'{"for": "'
        + ACME.encode(),
    ],
    ids=["second-response", "partial-response"],
)
def test_another_tenant_never_reads_a_response_written_after_acmes_answer(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    late: bytes,
) -> None:
    answered, forged = threading.Event(), threading.Event()
    raw = start_raw(_provider(answered, forged, late))
    policy = HOSTED_ONLY_POLICY.replace("tenants: [acme]", "tenants: [acme, other]")
    (tmp_path / "policy.yaml").write_text(policy)
    gateway = start_gateway(
        [hosted_backend("hosted", raw.url + "/v1", "m")],
        policy={"paths": [str(tmp_path)]},
        environ={"HOSTED_KEY": "test-key"},
        tenants=TWO_TENANTS,
    )
    first = _ask(gateway, TENANT_KEY, ACME)
    assert first.status_code == 200, first.text
    assert first.json()["choices"][0]["message"]["content"] == ACME
    answered.set()
    assert forged.wait(10)  # written, and on loopback in the gateway's socket
    second = _ask(gateway, OTHER_KEY, OTHER)
    assert ACME not in second.text
    assert second.status_code == 200, second.text
    assert second.json()["choices"][0]["message"]["content"] == OTHER


def test_a_response_still_unread_in_the_socket_never_answers_the_next_request(
    start_raw: Callable[[Answer], RawBackend],
) -> None:
    # The same desync, the second response still unread in the socket as the next request
    # takes the connection (the event loop busy with other requests meanwhile): aiohttp
    # would send on it and read that response as the answer. Held here by blocking the
    # loop while the provider writes it.
    from aiohttp import ClientSession  # loaded with LiteLLM in the gateway

    from gateway.upstream.hosted_sockets import CountedConnector

    answered, forged = threading.Event(), threading.Event()
    raw = start_raw(_provider(answered, forged, completion_response(f"for {ACME}")))

    async def two_calls() -> list[str]:
        contents = []
        async with ClientSession(connector=CountedConnector()) as session:
            for asked in (ACME, OTHER):
                body = {"messages": [{"role": "user", "content": asked}]}
                async with session.post(raw.url + "/v1/chat/completions", json=body) as answer:
                    contents.append((await answer.json())["choices"][0]["message"]["content"])
                answered.set()
                assert forged.wait(10)  # the loop held: the bytes wait unread in the socket
        return contents

    assert asyncio.run(two_calls()) == [ACME, OTHER]
    assert len({post.connection for post in raw.posts}) == 2  # the second on a new one
