"""A hosted provider that is down is taken out by its circuit breaker, as a private
backend is; a client's malformed requests never count against it.

Two hosted fallbacks serve `m`, in the policy's order: `flaky`, a scripted raw backend
reached through LiteLLM (it answers 503 while `Flaky.down`, an OpenAI chat completion
otherwise), then `backup`, a simulator. Two tenants share them, so breakers tell tenants
apart (gateway/routing/tenant_breakers.py): the shared breaker opens on a run of
failures from two tenants. Nothing leaves loopback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.api.recorder import Recorder
from gateway.provenance import write_signing_key
from gateway.tenants import hash_api_key
from tests.helpers.clock import FakeClock
from tests.helpers.gateways import (
    LITELLM_WARNINGS,
    OTHER_KEY,
    TENANT_KEY,
    Gateway,
    Sim,
    admin_status,
    hosted_backend,
    served,
)
from tests.helpers.net import free_port
from tests.helpers.provenance import request_records
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head
from tests.helpers.waiting import until, until_async

pytestmark = LITELLM_WARNINGS

ORIGIN = "owngate.test/hosted-breaker"

POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: eu, version: "1"}
spec:
  tenants: [acme, globex]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback:
    mode: when_private_unavailable
    to: [{backend: flaky}, {backend: backup}]
"""
ACME = {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["*"]}
GLOBEX = {"id": "globex", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["*"]}
ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-flaky",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "from flaky"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
)
CHUNK = orjson.dumps(
    {
        "id": "chatcmpl-flaky",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "half"}}],
    }
)
LAST = orjson.dumps(
    {
        "id": "chatcmpl-flaky",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": " from flaky"}, "finish_reason": "stop"}],
    }
)
DOWN = b'{"error": {"message": "unavailable", "type": "server_error"}}'
INVALID = b'{"error": {"message": "bad request", "type": "invalid_request_error"}}'


RATE_LIMITED = b'{"error": {"message": "slow down", "type": "rate_limit_error"}}'


@dataclass
class Flaky:
    """What the scripted provider answers: 503 while `down`, 400 while `invalid`, 429
    while `limited`; a stream (two chunks), or its first chunk alone while `breaks_off`;
    nothing yet while `held`."""

    down: bool = False
    invalid: bool = False
    limited: bool = False
    breaks_off: bool = False  # a stream: its first chunk, then the connection closes
    held: bool = False  # answers wait until the test lets them go

    async def __call__(self, writer: asyncio.StreamWriter, post: Post) -> bool:
        await until_async(lambda: not self.held, "the test to let flaky answer")
        if orjson.loads(post.body).get("stream") and not (
            self.down or self.invalid or self.limited
        ):
            end = b"" if self.breaks_off else b"data: " + LAST + b"\n\ndata: [DONE]\n\n"
            writer.write(sse_head() + b"data: " + CHUNK + b"\n\n" + end)
            await writer.drain()
            return False
        if self.down:
            head, body = b"HTTP/1.1 503 Service Unavailable", DOWN
        elif self.invalid:
            head, body = b"HTTP/1.1 400 Bad Request", INVALID
        elif self.limited:
            head, body = b"HTTP/1.1 429 Too Many Requests", RATE_LIMITED
        else:
            head, body = b"HTTP/1.1 200 OK", ANSWER
        writer.write(
            head + b"\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n" % len(body) + body
        )
        await writer.drain()
        return False


@dataclass
class Setup:
    gateway: Gateway
    flaky: Flaky
    raw: RawBackend
    backup: Sim
    clock: FakeClock


Start = Callable[..., Setup]


@pytest.fixture
def start(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> Start:
    def build(flaky_url: str | None = None, provenance: bool = False) -> Setup:
        """`flaky_url`: where `flaky` is instead of the scripted raw backend;
        `provenance`: the log on in `tmp_path / "log"`."""
        flaky = Flaky()
        raw = start_raw(flaky)
        backup = start_sim("vllm", models=("m",), zero_latency=True)
        policies = tmp_path / "policies"
        policies.mkdir()
        (policies / "policy.yaml").write_text(POLICY)
        clock = FakeClock()
        log: dict[str, Any] = {}
        if provenance:
            write_signing_key(tmp_path / "log.key", ORIGIN)
            log["provenance"] = {
                "dir": str(tmp_path / "log"),
                "origin": ORIGIN,
                "signing_key_file": str(tmp_path / "log.key"),
                "checkpoint_interval_ms": 20,
            }
        gateway = start_gateway(
            [
                hosted_backend("flaky", flaky_url or f"{raw.url}/v1", "m"),
                hosted_backend("backup", f"{backup.url}/v1", "m"),
            ],
            policy={"paths": [str(policies)]},
            environ={"HOSTED_KEY": "k"},
            tenants=[ACME, GLOBEX],
            clock=clock,
            routing={"breaker": {"failure_threshold": 3, "cooldown_s": 60, "max_cooldown_s": 60}},
            **log,
        )
        return Setup(gateway, flaky, raw, backup, clock)

    return build


@pytest.fixture
def setup(start: Start) -> Setup:
    return start()


def chat(gateway: Gateway, key: str, **fields: Any) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields},
        headers={"authorization": f"Bearer {key}"},
        timeout=120,  # the first hosted request imports LiteLLM
    )


def breaker(gateway: Gateway, backend_id: str) -> dict[str, Any]:
    [status] = [b for b in admin_status(gateway.url)["backends"] if b["id"] == backend_id]
    return {"available": status["available"], **status["breaker"]}


def metric_lines(gateway: Gateway, name: str) -> list[str]:
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    return [line for line in text.splitlines() if line.startswith(name)]


def fail_from_two_tenants(s: Setup) -> None:
    """The provider is down: three requests in a row, from acme and globex, each fall
    back to `backup`."""
    s.flaky.down = True
    for key in (TENANT_KEY, OTHER_KEY, TENANT_KEY):  # failure_threshold: 3
        response = chat(s.gateway, key)
        assert response.status_code == 200, response.text
        assert response.json()["id"] != "chatcmpl-flaky"  # the backup's answer
    assert len(s.raw.posts) == 3 and served(s.backup) == 3


def test_a_provider_down_for_two_tenants_opens_its_breaker(setup: Setup) -> None:
    fail_from_two_tenants(setup)
    gateway = setup.gateway
    state = breaker(gateway, "flaky")
    assert (state["state"], state["available"]) == ("open", False)
    assert "503" in state["last_error"]
    # The next request goes straight to the next backend: the provider sees nothing.
    response = chat(gateway, OTHER_KEY)
    assert response.status_code == 200, response.text
    assert len(setup.raw.posts) == 3 and served(setup.backup) == 4
    lines = metric_lines(gateway, "owngate_backend_breaker_")
    assert 'owngate_backend_breaker_state{backend="flaky",state="open"} 1.0' in lines
    assert 'owngate_backend_breaker_opens_total{backend="flaky"} 1.0' in lines
    assert 'owngate_backend_breaker_state{backend="backup",state="closed"} 1.0' in lines


def test_a_failed_probe_of_one_tenant_does_not_reopen_it_and_a_good_one_closes_it(
    setup: Setup,
) -> None:
    fail_from_two_tenants(setup)
    gateway, clock = setup.gateway, setup.clock
    clock.now += 61  # past the cooldown: the next request is the half-open probe
    assert chat(gateway, TENANT_KEY).status_code == 200  # probed flaky, failed: backup
    assert len(setup.raw.posts) == 4
    state = breaker(gateway, "flaky")
    assert (state["state"], state["available"]) == ("half_open", True)  # handed on
    setup.flaky.down = False  # the provider is back
    response = chat(gateway, OTHER_KEY)
    assert (response.status_code, response.json()["id"]) == (200, "chatcmpl-flaky")
    assert len(setup.raw.posts) == 5
    state = breaker(gateway, "flaky")
    assert (state["state"], state["failures"], state["last_error"]) == ("closed", 0, None)
    response = chat(gateway, OTHER_KEY)  # closed: flaky serves again
    assert (response.status_code, response.json()["id"]) == (200, "chatcmpl-flaky")


def test_one_tenants_malformed_requests_never_open_it(setup: Setup) -> None:
    gateway = setup.gateway
    for _ in range(4):  # past failure_threshold: refused before LiteLLM, nothing sent
        response = chat(gateway, TENANT_KEY, tool_choice=7)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "tool_choice"
    setup.flaky.invalid = True  # the provider refuses them itself
    for _ in range(4):
        response = chat(gateway, TENANT_KEY)
        assert response.status_code == 400, response.text
    assert len(setup.raw.posts) == 4 and served(setup.backup) == 0  # no failover on a 400
    state = breaker(gateway, "flaky")
    assert (state["state"], state["failures"], state["tenants"]) == ("closed", 0, [])
    # The provider's error count holds none of the client's mistakes.
    assert not [
        line
        for line in metric_lines(gateway, "owngate_upstream_errors_total")
        if 'backend="flaky"' in line
    ]
    setup.flaky.invalid = False
    response = chat(gateway, OTHER_KEY)
    assert (response.status_code, response.json()["id"]) == (200, "chatcmpl-flaky")


def test_a_provider_that_refuses_connections_opens_it_for_two_tenants(start: Start) -> None:
    """A refused connection opens the breaker of the tenant that met it, and the
    provider's once two tenants met it (an adapter's fetch of a client's content URL
    can fail so too: one tenant alone cannot take the provider away)."""
    s = start(flaky_url=f"http://127.0.0.1:{free_port()}/v1")
    for _ in range(3):
        response = chat(s.gateway, TENANT_KEY)
        assert response.status_code == 200, response.text  # the backup's answer
    state = breaker(s.gateway, "flaky")
    assert (state["state"], state["failures"]) == ("closed", 3)
    assert [(t["tenant"], t["state"]) for t in state["tenants"]] == [("acme", "open")]
    assert chat(s.gateway, OTHER_KEY).status_code == 200  # globex still tries flaky
    state = breaker(s.gateway, "flaky")
    assert (state["state"], state["last_error"]) == ("open", "connect: could not connect to openai")
    assert chat(s.gateway, OTHER_KEY).status_code == 200
    assert served(s.backup) == 5
    assert breaker(s.gateway, "flaky")["state"] == "open"


def test_a_rate_limiting_provider_is_not_taken_out(setup: Setup) -> None:
    """A 429 fails the request over but is no verdict: the provider is up."""
    setup.flaky.limited = True
    for key in (TENANT_KEY, OTHER_KEY) * 2:  # past failure_threshold, from two tenants
        response = chat(setup.gateway, key)
        assert response.status_code == 200, response.text  # the backup's answer
    assert len(setup.raw.posts) == 4 and served(setup.backup) == 4
    state = breaker(setup.gateway, "flaky")
    assert (state["state"], state["failures"], state["tenants"]) == ("closed", 0, [])
    setup.flaky.limited = False
    response = chat(setup.gateway, OTHER_KEY)
    assert (response.status_code, response.json()["id"]) == (200, "chatcmpl-flaky")


def test_streams_that_break_off_for_two_tenants_open_it(setup: Setup) -> None:
    """A stream the provider breaks off after its first chunk is its failure (the client
    got an error event): three in a row, from two tenants, open the breaker; a stream
    that ends whole is a success."""
    gateway = setup.gateway
    setup.flaky.breaks_off = True
    for key in (TENANT_KEY, OTHER_KEY, TENANT_KEY):
        response = chat(gateway, key, stream=True)
        assert response.status_code == 200, response.text
        assert b'"error"' in response.content  # ended with an error event
    state = breaker(gateway, "flaky")
    assert (state["state"], state["last_error"]) == ("open", "stream broke off: protocol")
    response = chat(gateway, OTHER_KEY, stream=True)  # straight to the backup
    assert response.status_code == 200 and b'"error"' not in response.content
    assert (len(setup.raw.posts), served(setup.backup)) == (3, 1)
    setup.flaky.breaks_off = False  # the provider is back: a whole stream closes it
    setup.clock.now += 61
    response = chat(gateway, TENANT_KEY, stream=True)
    assert response.status_code == 200 and b'"error"' not in response.content
    assert b"from flaky" in response.content and len(setup.raw.posts) == 4
    assert breaker(gateway, "flaky")["state"] == "closed"


def test_a_half_open_provider_refused_to_a_request_is_skipped_with_no_dispatch_record(
    start: Start, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two requests reach the hosted pass while `flaky`'s breaker is half-open: the first
    holds its one probe; the second skips `flaky` (no dispatch record to it, so the log
    never says a prompt went where nothing was sent) and `backup` serves it. The first
    request's dispatch record is held until the second's is being written, so both are
    in the hosted pass at once, and `flaky` answers the probe only once `backup` served
    the other one."""
    s, log = start(provenance=True), tmp_path / "log"
    fail_from_two_tenants(s)
    s.flaky.down = False  # back: the probe succeeds
    s.clock.now += 61  # past the cooldown: half-open, one probe
    dispatched: list[str] = []
    original = Recorder.dispatch

    async def dispatch(self: Recorder, *args: Any, **kwargs: Any) -> None:
        dispatched.append(args[3].id)  # (exchange, trail, decision, backend)
        if len(dispatched) == 1:  # the first request's: held until the second's starts
            await until_async(lambda: len(dispatched) > 1, "the second request's dispatch")
        await original(self, *args, **kwargs)

    monkeypatch.setattr(Recorder, "dispatch", dispatch)
    s.flaky.held = True  # the probe stays out until the other request is served
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(chat, s.gateway, OTHER_KEY)
        until(lambda: len(dispatched) == 1, "the first request's dispatch record")
        second = pool.submit(chat, s.gateway, TENANT_KEY)
        until(lambda: served(s.backup) == 4, "the request flaky did not admit, served")
        s.flaky.held = False
        responses = [first.result(), second.result()]
    assert [r.status_code for r in responses] == [200, 200], [r.text for r in responses]
    answers = ["flaky" if r.json()["id"] == "chatcmpl-flaky" else "backup" for r in responses]
    ids = [r.headers["x-request-id"] for r in responses]
    # Each request's dispatch records name only the backend that answered it: the refused
    # admission was a skip, not a dispatch to a provider that received nothing.
    dispatches = [[d["backend"]["id"] for d in request_records(log, i, "dispatch")] for i in ids]
    assert dispatches == [[answer] for answer in answers]
    assert answers == ["flaky", "backup"]  # the first held the probe: it closed the breaker
    assert len(s.raw.posts) == 4 and served(s.backup) == 4
    assert breaker(s.gateway, "flaky")["state"] == "closed"
