"""`when_private_unavailable` over real sockets: a hosted provider gets the request only
once every eligible private backend was unavailable for it, and the fallback's dispatch
record says what each came to (docs/policies.md, "What unavailable means").

Private backends are scripted raw backends (their `/health` answers 200, so they are up);
the hosted one is a simulator reached through LiteLLM, so nothing leaves loopback.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.gateways import (
    EU_FALLBACK_POLICY,
    EU_ZERO,
    LITELLM_WARNINGS,
    Gateway,
    Sim,
    backend,
    hosted_backend,
    logged_gateway,
    served,
)
from tests.helpers.log_truth import CHAT, ORIGIN
from tests.helpers.provenance import records
from tests.helpers.raw_backend import (
    ERROR_BODY,
    Answer,
    Post,
    RawBackend,
    completion_body,
    json_answer,
)
from tests.helpers.waiting import until

pytestmark = LITELLM_WARNINGS

POLICY = EU_FALLBACK_POLICY


def status_answer(status: bytes) -> Answer:
    """Every completion gets `status` with an OpenAI error body."""
    return json_answer(ERROR_BODY, status)


Start = Callable[..., tuple[Gateway, Sim, list[RawBackend]]]


@pytest.fixture
def setup(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> Start:
    """(gateway, hosted sim, private raw backends a and b), round robin (a first)."""

    def build(a: Answer, b: Answer, **routing: Any) -> tuple[Gateway, Sim, list[RawBackend]]:
        raws = [start_raw(a), start_raw(b)]
        hosted = start_sim("vllm", models=("m",), zero_latency=True)
        policies = tmp_path / "policies"
        policies.mkdir()
        (policies / "policy.yaml").write_text(POLICY)
        backends = [
            backend("a", raws[0].url, "m", **EU_ZERO),
            backend("b", raws[1].url, "m", **EU_ZERO),
            hosted_backend("hosted", f"{hosted.url}/v1", "m"),
        ]
        gateway = logged_gateway(
            start_gateway,
            tmp_path,
            backends,
            ORIGIN,
            policy={"paths": [str(policies)]},
            routing={"default": {"strategy": "round_robin"}, **routing},
            environ={"HOSTED_KEY": "k"},
        )
        return gateway, hosted, raws

    return build


def post(gateway: Gateway) -> httpx.Response:
    """The chat, with a read timeout that only bounds a hang: the first request of a
    process that goes hosted waits for LiteLLM's import (seconds of CPU, tens of them on a
    busy machine), and a 30 s one read as a failure of the fallback."""
    url = f"{gateway.url}/v1/chat/completions"
    return httpx.post(url, json=CHAT, headers=gateway.headers, timeout=90)


def test_no_fallback_while_a_private_backend_was_never_tried(setup: Start) -> None:
    """max_attempts 1: a fails, b is up and untried; the data stays in."""
    gateway, hosted, raws = setup(
        status_answer(b"503 Service Unavailable"),
        status_answer(b"503 Service Unavailable"),
        failover={"max_attempts": 1},
    )
    response = post(gateway)
    assert response.status_code == 503, response.text
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert served(hosted) == 0
    assert [len(raw.posts) for raw in raws] == [1, 0]


def test_a_busy_private_backend_is_not_unavailable(setup: Start) -> None:
    """Both private backends answer 429: saturation, which this mode does not accept."""
    busy = status_answer(b"429 Too Many Requests")
    gateway, hosted, raws = setup(busy, busy)
    response = post(gateway)
    assert response.status_code == 503, response.text  # a private 429 reads as overloaded
    assert response.json()["error"]["code"] == "backend_unavailable"
    assert served(hosted) == 0
    assert [len(raw.posts) for raw in raws] == [1, 1]


def test_the_fallback_record_says_what_each_private_backend_came_to(
    setup: Start, tmp_path: Path
) -> None:
    failing = status_answer(b"503 Service Unavailable")
    gateway, hosted, _ = setup(failing, failing)
    response = post(gateway)
    assert response.status_code == 200, response.text
    assert served(hosted) == 1
    request_id = response.headers["x-request-id"]
    found: list[dict[str, Any]] = []

    def logged() -> bool:
        found[:] = [
            r
            for r in records(tmp_path / "log")
            if r["request_id"] == request_id and r["type"] == "dispatch"
        ]
        return len(found) == 3

    until(logged, "the three dispatch records signed")
    assert [(r["backend"]["id"], r["fallback"]) for r in found] == [
        ("a", None),
        ("b", None),
        ("hosted", "private_unavailable"),
    ]
    assert "fallback_basis" not in found[0] and "fallback_basis" not in found[1]
    assert found[2]["fallback_basis"] == [
        {"backend": "a", "state": "failed"},
        {"backend": "b", "state": "failed"},
    ]


def _private_then_hosted(
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    raw: RawBackend,
    hosted: Sim,
    **settings: Any,
) -> Gateway:
    """A gateway with the private backend `a` (`raw`) and `hosted` behind it, under
    `POLICY` (hosted only when the private one is unavailable), and `settings`."""
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "policy.yaml").write_text(POLICY)
    return start_gateway(
        [backend("a", raw.url, "m", **EU_ZERO), hosted_backend("hosted", f"{hosted.url}/v1", "m")],
        policy={"paths": [str(policies)]},
        environ={"HOSTED_KEY": "k"},
        **settings,
    )


def test_a_private_backend_the_failover_deadline_cut_short_is_not_unavailable(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """The private backend is up and would answer within its `first_byte_timeout_s`
    (120 s), but `routing.failover.deadline_s` (3 s) cuts its wait for the first byte
    short: a request whose deadline passed gets 504 (docs/configuration.md), and a backend
    the deadline left no time for "could still serve" (docs/policies.md). Before, the
    timeout the deadline caused made it "failed", and the hosted provider got the prompt:
    a client that spent the deadline first (a body sent slowly, a wait in the saturation
    queue) chose the hosted fallback while the private backend was serving."""
    release = threading.Event()
    raw = start_raw(json_answer(completion_body("private"), release=release))
    hosted = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = _private_then_hosted(
        start_gateway, tmp_path, raw, hosted, routing={"failover": {"deadline_s": 3}}
    )
    try:
        response = post(gateway)
    finally:
        release.set()
    assert served(hosted) == 0, response.text
    assert response.status_code == 504, response.text
    assert response.json()["error"]["code"] == "upstream_timeout"
    assert len(raw.posts) == 1


def held_answer(release: threading.Event) -> Answer:
    """Headers and half the body of a whole completion at once, then nothing until
    `release` (60 s at most): a backend that hangs mid-answer."""
    body = completion_body("private")

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        writer.write(head % len(body) + body[: len(body) // 2])
        await writer.drain()
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
        return False

    return answer


def test_a_backend_that_hangs_after_its_headers_is_unavailable_whatever_the_deadline(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """The deadline (60 s) is under the first-byte timeout (120 s), so the attempt's wait
    for its headers is cut short, but the headers come at once: the deadline took nothing
    from this attempt. Its whole answer then stops mid-body past `read_timeout_s` (1 s):
    the backend failed, which `when_private_unavailable` falls back from (the deadline has
    not passed). Before, any timeout of an attempt whose first-byte wait had been cut short
    came to "out of time" (504, no fallback, no breaker verdict), whatever timer fired."""
    release = threading.Event()
    raw = start_raw(held_answer(release))
    hosted = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = _private_then_hosted(
        start_gateway,
        tmp_path,
        raw,
        hosted,
        routing={"failover": {"deadline_s": 60}},
        limits={"read_timeout_s": 1.0},
    )
    url = f"{gateway.url}/v1/chat/completions"
    whole = {**CHAT, "stream": False}  # a whole answer: nothing reaches the client before its end
    try:
        response = httpx.post(url, json=whole, headers=gateway.headers, timeout=90)
    finally:
        release.set()
    assert len(raw.posts) == 1
    assert response.status_code == 200, response.text
    assert served(hosted) == 1, response.text
