"""A backend reporting absurd usage (2**53 tokens) is charged only what the request
justifies: the tenant is not locked out of its tokens-per-minute budget for the ledger's
30 days, the signed completion record keeps the usage as the backend reported it with the
bound charged instead (`usage_bound`), and the metric names the configured backend."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import httpx

from gateway.api.usage_bound import COMPLETION_ALLOWANCE, PROMPT_ALLOWANCE
from gateway.tenants import hash_api_key
from tests.helpers.gateways import TENANT_KEY, Gateway, logged_private_gateway
from tests.helpers.provenance import completion_record
from tests.helpers.raw_backend import Answer, Post, RawBackend, json_answer, sse_head
from tests.helpers.waiting import until

HUGE = {"prompt_tokens": 2**53, "completion_tokens": 2**53, "total_tokens": 2**53}
TENANTS = [
    {
        "id": "acme",
        "api_key_hashes": [hash_api_key(TENANT_KEY)],
        "models": ["*"],
        "limits": {"tokens_per_minute": 1_000_000},
    }
]


def _post(gateway: Gateway, body: bytes) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions",
        content=body,
        headers={**gateway.headers, "content-type": "application/json"},
        timeout=30,
    )


def _over_bound(gateway: Gateway) -> str:
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    return next(
        (line for line in metrics.splitlines() if line.startswith("owngate_usage_over_bound_")),
        "",
    )


def test_an_absurd_whole_answer_usage_is_charged_the_request_s_bound(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    answer = json.dumps(
        {"id": "x", "object": "chat.completion", "choices": [], "usage": HUGE}
    ).encode()
    raw = start_raw(json_answer(answer))
    gateway = logged_private_gateway(
        start_gateway, tmp_path, raw.url, "example.test/usage", tenants=TENANTS
    )
    ask = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    body = json.dumps(ask).encode()
    first = _post(gateway, body)
    assert first.status_code == 200
    # Charged the bound, not 2**53 tokens: the tenant's next request is admitted.
    second = _post(gateway, body)
    assert second.status_code == 200, second.text
    record = completion_record(tmp_path / "log", first.headers["x-request-id"])
    assert record["usage"] == HUGE  # as the backend reported it
    assert record["usage_bound"] == len(body) + PROMPT_ALLOWANCE + len(answer) + 5
    until(
        lambda: _over_bound(gateway) == 'owngate_usage_over_bound_total{backend="gpu"} 2.0',
        "both answers counted over their bound",
    )


def test_an_absurd_stream_usage_is_charged_the_request_s_bound(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    delta = {"id": "x", "choices": [{"index": 0, "delta": {"content": "hi"}}]}
    events = [
        b"data: " + json.dumps(delta).encode() + b"\n\n",
        b"data: " + json.dumps({"id": "x", "choices": [], "usage": HUGE}).encode() + b"\n\n",
        b"data: [DONE]\n\n",
    ]

    async def stream(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(sse_head() + b"".join(events))
        await writer.drain()
        return False

    raw = start_raw(stream)
    gateway = logged_private_gateway(
        start_gateway, tmp_path, raw.url, "example.test/usage", tenants=TENANTS
    )
    ask = {
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}],
    }
    body = json.dumps(ask).encode()
    first = _post(gateway, body)
    assert first.status_code == 200 and b"[DONE]" in first.content
    second = _post(gateway, body)
    assert second.status_code == 200, second.text
    record = completion_record(tmp_path / "log", first.headers["x-request-id"])
    assert record["usage"] == HUGE
    relayed = sum(len(event) for event in events)  # no limit set: the bytes relayed
    assert record["usage_bound"] == len(body) + PROMPT_ALLOWANCE + relayed + COMPLETION_ALLOWANCE


def test_a_limit_llamacpp_reads_over_max_tokens_is_charged_in_full(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    # llama.cpp reads `n_predict` over `max_tokens`; a `logit_bias` forcing a control token
    # makes every one of its 100,000 tokens leave no text. Its honest usage was cut to
    # the bound of one output token: charged about 4,300 tokens, and signed as over the
    # bound. The tenant's budget is 100,000 a minute: what its `n_predict` alone asks for
    # (more would be refused before dispatch, gateway/api/reservation.py).
    usage = {"prompt_tokens": 9, "completion_tokens": 100_000, "total_tokens": 100_009}
    answer = json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}}],
            "usage": usage,
        }
    ).encode()
    raw = start_raw(json_answer(answer))
    tenants = [{**TENANTS[0], "limits": {"tokens_per_minute": 100_000}}]
    gateway = logged_private_gateway(
        start_gateway, tmp_path, raw.url, "example.test/usage", tenants=tenants
    )
    ask = {
        "model": "m",
        "max_tokens": 1,
        "n_predict": 100_000,
        "logit_bias": {"151644": 100},
        "messages": [{"role": "user", "content": "hi"}],
    }
    first = _post(gateway, json.dumps(ask).encode())
    assert first.status_code == 200, first.text
    record = completion_record(tmp_path / "log", first.headers["x-request-id"])
    assert record["usage"] == usage
    assert "usage_bound" not in record  # within what the request allows: not cut
    # Charged the 100,009 tokens: the tenant is in debt until its budget refills.
    second = _post(gateway, json.dumps(ask).encode())
    assert second.status_code == 429, second.text
    assert second.json()["error"]["type"] == "tokens"
