"""A client that leaves while its tenant is charged never cancels the charge (issue 12).

The charge (`settle`: `Admission.release`, the state's `_release`, on Redis one script
call) runs just before an answer's end goes out, while the disconnect watch still runs:
a client that closes right after `[DONE]` (or while its whole answer's receipt header is
readied) lands inside it. Each test holds a real gateway (its own listener, on its own
loop) at one await of that path, closes the client's socket, waits until the listener
saw the loss, and lets it go on; then reads the tenant's ledger (the process's, and on
Redis the shared keys of a real redis-server started here): the tokens the backend
reported are charged, the concurrency slot is free, the request counted. A loop of
such requests never lets the tenant past its tokens-per-minute budget.

The backend reports far more tokens than the request reserved (its prompt at one token
per byte, which the usage bound allows), so a charge lost after the reservation shows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from gateway.state import Admission, TenantLimits
from gateway.state.ledger import request_interval_us, tokens_cost_us
from gateway.state.memory import MemoryState
from gateway.state.redis_limits import RedisLimits
from gateway.state.redis_state import RedisKeys
from gateway.tenants import hash_api_key
from tests.helpers.charge_race import Gate, leave_during_charge, lost_seen
from tests.helpers.gateways import TENANT_KEY, Gateway, backend
from tests.helpers.raw_backend import Answer, RawBackend, json_answer, sse_head
from tests.helpers.redis_server import RedisServer

TPM = 60_000  # 1,000 tokens a second
PROMPT = 40_000  # bytes of prompt: reserved at a quarter token each, reported at one each
USED = PROMPT + 1  # what the backend reports (prompt and one completion token)
# Eight requests a minute: a request counted on Redis stays 7.5 s in its key (it expires
# once the budget is whole again), and the six of the loop fit.
LIMITS = TenantLimits(requests_per_minute=8, tokens_per_minute=TPM, concurrent=1)
ASK: dict[str, Any] = {
    "model": "m",
    "max_tokens": 1,
    "messages": [{"role": "user", "content": "x" * PROMPT}],
}
_USAGE = {"prompt_tokens": PROMPT, "completion_tokens": 1, "total_tokens": USED}


def _release_call(this: RedisLimits, script: object, *_args: object) -> bool:
    return script is this._release_script  # the charge's call, not the admission's


def _unreleased(this: Admission, *_args: object) -> bool:
    return not this.released  # a second release is a no-op: not the charge


# Where the charge is held: (owner, method, only the calls it accepts, after it ran).
_POINTS: dict[str, tuple[type, str, Callable[..., bool], bool]] = {
    "admission-release": (Admission, "release", _unreleased, False),
    "memory-release": (MemoryState, "_release", lambda *_a: True, False),
    "redis-release": (RedisLimits, "_release", lambda *_a: True, False),
    "redis-call": (RedisLimits, "_call", _release_call, False),
    "redis-answered": (RedisLimits, "_call", _release_call, True),
}
_CASES = [
    ("memory", "admission-release"),
    ("memory", "memory-release"),
    ("redis", "admission-release"),
    ("redis", "redis-release"),
    ("redis", "redis-call"),
    ("redis", "redis-answered"),
]


def _answer(stream: bool) -> Answer:
    if not stream:
        doc = {"id": "c", "object": "chat.completion", "choices": [], "usage": _USAGE}
        return json_answer(json.dumps(doc).encode())
    event = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    usage = b"data: %s\n\n" % json.dumps({"id": "c", "choices": [], "usage": _USAGE}).encode()
    body = sse_head() + event + usage + b"data: [DONE]\n\n"

    async def answer(writer: Any, _post: Any) -> bool:
        writer.write(body)
        await writer.drain()
        return False

    return answer


def _gateway(
    start_gateway: Callable[..., Gateway],
    url: str,
    store: str,
    server: RedisServer | None,
    *,
    concurrent: bool = True,
) -> Gateway:
    limits = {"requests_per_minute": LIMITS.requests_per_minute, "tokens_per_minute": TPM}
    if concurrent:
        limits["concurrent_requests"] = LIMITS.concurrent
    tenants = [
        {
            "id": "acme",
            "api_key_hashes": [hash_api_key(TENANT_KEY)],
            "models": ["*"],
            "limits": limits,
        }
    ]
    extra: dict[str, Any] = {"tenants": tenants}
    if store == "redis":
        assert server is not None
        # Generous timeouts: a loaded machine must not fall back to local decisions.
        extra["state"] = {
            "backend": "redis",
            "url": server.url,
            "key_prefix": "test",
            "timeout_ms": 5000,
            "lease_ttl_s": 30,
        }
    return start_gateway([backend("a", url, "m")], **extra)


def _redis_now_us(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


class Ledger:
    """The tenant's ledger as the test reads it: the process's, and Redis's shared keys."""

    def __init__(self, gateway: Gateway, server: RedisServer | None) -> None:
        self.gateway = gateway
        self.client = None if server is None else redis.Redis.from_url(server.url)
        self.keys = RedisKeys("test")
        self.started = time.monotonic()
        self.started_us = 0 if self.client is None else _redis_now_us(self.client)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    def _tat(self, key: str) -> int:
        assert self.client is not None
        value = self.client.get(key)
        assert isinstance(value, bytes), (key, value)
        return int(value)

    def assert_settled(self, requests: int, tokens: int) -> None:
        """`requests` counted and at least `tokens` charged since the ledger was read
        first, no slot held, here or on Redis."""
        state = self.gateway.app.state
        if self.client is None:
            use = state.tenant_use("acme", LIMITS)
            # Replenished since the start: at most TPM / 60 tokens a second.
            replenished = (time.monotonic() - self.started) * TPM / 60 + 1
            assert use.tokens is not None and use.tokens >= tokens - replenished, (use, tokens)
            assert use.requests is not None and use.requests >= requests, use
            assert use.inflight == 0, use
            return
        status = state.status()
        assert status.healthy and status.fallbacks == 0, status  # the shared path served
        # The budget's TAT runs at least the tokens charged ahead of where it started.
        floor = self.started_us + tokens_cost_us(tokens, TPM) - 1
        assert self._tat(self.keys.tokens("acme")) >= floor, "tokens charged lost"
        interval = request_interval_us(LIMITS.requests_per_minute or 1)
        assert self._tat(self.keys.requests("acme")) >= self.started_us + requests * interval
        assert self.client.hlen(self.keys.slots("acme")) == 0  # no slot held on Redis
        assert self.client.hlen(self.keys.held("acme")) == 0
        assert state.tenant_use("acme", LIMITS).inflight == 0  # nor here


def _server(
    request: pytest.FixtureRequest, store: str
) -> tuple[RedisServer | None, Callable[..., Gateway]]:
    """The redis-server (None in process) and the gateway starter, the server first: the
    gateway is stopped before it is."""
    server: RedisServer | None = None
    if store == "redis":
        server = request.getfixturevalue("redis_server")
    starter: Callable[..., Gateway] = request.getfixturevalue("start_gateway")
    return server, starter


@pytest.mark.redis
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize(("store", "point"), _CASES)
def test_a_client_leaving_during_the_charge_leaves_it_whole(
    request: pytest.FixtureRequest,
    start_raw: Callable[[Answer], RawBackend],
    monkeypatch: pytest.MonkeyPatch,
    store: str,
    point: str,
    stream: bool,
) -> None:
    server, start_gateway = _server(request, store)
    owner, name, when, after = _POINTS[point]
    seen = lost_seen(monkeypatch)
    gate = Gate(monkeypatch, owner, name, when=when, after=after)
    gateway = _gateway(start_gateway, start_raw(_answer(stream)).url, store, server)
    ledger = Ledger(gateway, server)
    try:
        got = leave_during_charge(gateway, {**ASK, "stream": stream}, gate, seen)
        assert got.startswith(b"HTTP/1.1 200") if stream else got == b"", got[:200]
        assert gate.calls == 1
        ledger.assert_settled(requests=1, tokens=USED)
    finally:
        ledger.close()


@pytest.mark.redis
@pytest.mark.parametrize("store", ["memory", "redis"])
def test_clients_leaving_during_their_charges_stay_within_the_budget(
    request: pytest.FixtureRequest,
    start_raw: Callable[[Answer], RawBackend],
    monkeypatch: pytest.MonkeyPatch,
    store: str,
) -> None:
    """Six streams in a row, each client gone while its charge is held on Redis (or at
    the release, in process): each used 40,001 tokens, so at most two fit a 60,000
    budget (plus what it replenished meanwhile) before the tenant is refused."""
    server, start_gateway = _server(request, store)
    point = "redis-call" if store == "redis" else "admission-release"
    owner, name, when, after = _POINTS[point]
    seen = lost_seen(monkeypatch)
    gate = Gate(monkeypatch, owner, name, when=when, after=after)
    # No concurrency limit: a slot Redis still holds would refuse the next one for it.
    url = start_raw(_answer(True)).url
    gateway = _gateway(start_gateway, url, store, server, concurrent=False)
    started = time.monotonic()
    statuses = []
    for _ in range(6):
        got = leave_during_charge(gateway, {**ASK, "stream": True}, gate, seen)
        statuses.append(int(got[9:12]))
        assert statuses[-1] == 200 or b"tokens per min" in got, got
    elapsed = time.monotonic() - started
    admitted = statuses.count(200)
    assert admitted + statuses.count(429) == len(statuses), statuses
    assert admitted == gate.calls
    # GCRA: what the admitted used is at most the budget, what it replenished meanwhile,
    # and the overrun of the last one admitted (charged when it ended).
    assert admitted * USED <= TPM + elapsed * TPM / 60 + USED, (statuses, elapsed)
