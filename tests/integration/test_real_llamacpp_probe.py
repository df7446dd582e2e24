"""The real llama.cpp server behaves the way the gateway assumes.

Runs against a real ``llama-server`` (the ``real_llamacpp`` fixture) and pins what
routing and pass-through rely on: the OpenAI-compatible endpoints (chat with and
without streaming, ``stream_options.include_usage``, completions, models), ``/health``,
the ``/metrics`` names the load signals read, ``/slots`` and ``/props``, and that
``requests_processing`` / ``requests_deferred`` really show a full server with a queue.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from gateway.routing.prometheus import parse_metrics
from gateway.routing.signals import BackendLoad, load_from_metrics, slots_total_from_props
from tests.helpers.real_backend.server import LlamaServer

pytestmark = pytest.mark.real_backend

SHORT = 8  # max_tokens for shape checks; the tiny model never stops early (EOS is banned)


@pytest.fixture
def client(real_llamacpp: LlamaServer) -> Iterator[httpx.Client]:
    # trust_env=False: loopback traffic must never go through a configured proxy.
    with httpx.Client(base_url=real_llamacpp.base_url, timeout=30.0, trust_env=False) as c:
        yield c


def chat_body(content: str, max_tokens: int = SHORT, **extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        **extra,
    }


def scrape_load(client: httpx.Client) -> BackendLoad:
    response = client.get("/metrics")
    response.raise_for_status()
    return load_from_metrics("llamacpp", parse_metrics(response.text))


def test_health_is_ok(client: httpx.Client) -> None:
    response = client.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_models_lists_the_alias(client: httpx.Client) -> None:
    response = client.get("/v1/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["tiny"]


def test_chat_completion_non_streaming(client: httpx.Client) -> None:
    response = client.post("/v1/chat/completions", json=chat_body("Say hello."))
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["completion_tokens"] == SHORT
    assert usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert "timings" in body  # llama.cpp's extension; clients ignore unknown fields


def test_chat_completion_stream_ends_with_usage_then_done(client: httpx.Client) -> None:
    body = chat_body("Count to three.", stream=True, stream_options={"include_usage": True})
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = [
            line.removeprefix("data: ")
            for line in response.iter_lines()
            if line.startswith("data:")
        ]
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == SHORT
    content = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1] if c["choices"]
    )
    assert content
    finish = [c["choices"][0]["finish_reason"] for c in chunks[:-1] if c["choices"]]
    assert finish[-1] == "length"


def test_completions_endpoint(client: httpx.Client) -> None:
    response = client.post(
        "/v1/completions", json={"model": "tiny", "prompt": "Once upon a time", "max_tokens": SHORT}
    )
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "text_completion"
    assert isinstance(body["choices"][0]["text"], str)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == SHORT


def test_metrics_parse_strictly_and_name_the_load_gauges(client: httpx.Client) -> None:
    response = client.get("/metrics")
    assert response.status_code == 200
    samples = parse_metrics(response.text)
    assert "llamacpp:requests_processing" in samples
    assert "llamacpp:requests_deferred" in samples
    load = load_from_metrics("llamacpp", samples)
    assert load.running is not None
    assert load.waiting is not None
    assert load.kv_usage is None  # current builds publish no KV-cache gauge


def test_slots_and_props_report_the_slot_count(
    client: httpx.Client,
    real_llamacpp: LlamaServer,
) -> None:
    slots = client.get("/slots").json()
    assert [s["id"] for s in slots] == list(range(real_llamacpp.slots))
    assert all(s["n_ctx"] == real_llamacpp.ctx_size // real_llamacpp.slots for s in slots)
    assert all(isinstance(s["is_processing"], bool) for s in slots)
    assert slots_total_from_props(client.get("/props").json()) == real_llamacpp.slots


def test_metrics_show_full_slots_and_a_queue_under_load(
    client: httpx.Client,
    real_llamacpp: LlamaServer,
) -> None:
    """6 long requests on 4 slots: at some point 4 run and at least 1 waits."""
    n_requests = real_llamacpp.slots + 2
    # ~900 tokens at a few hundred tokens/s per busy slot keeps every slot busy for
    # over a second on 2 CPU cores, many scrape intervals long.
    max_tokens = real_llamacpp.ctx_size // real_llamacpp.slots - 100
    seen: list[BackendLoad] = []
    with ThreadPoolExecutor(max_workers=n_requests) as pool:
        futures: list[Future[httpx.Response]] = [
            pool.submit(
                client.post,
                "/v1/chat/completions",
                json=chat_body(f"Tell story number {i}.", max_tokens=max_tokens),
                timeout=120.0,
            )
            for i in range(n_requests)
        ]
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline and len(seen) < 5000:
            load = scrape_load(client)
            seen.append(load)
            if load.running == real_llamacpp.slots and (load.waiting or 0) >= 1:
                break
            if all(f.done() for f in futures):
                break
            time.sleep(0.01)
        responses = [f.result(timeout=120.0) for f in futures]
    assert [r.status_code for r in responses] == [200] * n_requests
    assert all(r.json()["usage"]["completion_tokens"] == max_tokens for r in responses)
    assert seen, "no scrape completed"
    assert max(s.running or 0 for s in seen) == real_llamacpp.slots
    assert all((s.running or 0) <= real_llamacpp.slots for s in seen)
    assert any(s.running == real_llamacpp.slots and (s.waiting or 0) >= 1 for s in seen), (
        f"never saw a full server with a queue in {len(seen)} scrapes: {seen[-5:]}"
    )
    # Once everything has finished, the gauges go back to zero.
    assert _wait_for_idle(client) == BackendLoad(
        running=0.0, waiting=0.0, kv_usage=None, slots_total=None
    )


def _wait_for_idle(client: httpx.Client, timeout_s: float = 10.0) -> BackendLoad:
    deadline = time.monotonic() + timeout_s
    load = scrape_load(client)
    while (load.running or load.waiting) and time.monotonic() < deadline:
        time.sleep(0.05)
        load = scrape_load(client)
    return load
