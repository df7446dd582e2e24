"""The whole answers a gateway process holds at once are bounded across requests
(`limits.max_held_answer_bytes`, gateway/api/answer_reads.py): a backend (or several)
answering large while others are held makes the next answer wait (429, `retry-after`),
never grows the process past the budget; the budget is given back whatever way a
request ends, and a slow reader holds its share until it has taken its answer.

Each gateway runs in front of a scripted raw backend (tests/helpers/raw_backend.py) with
the provenance log on: the completion record says what the client got.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest

from gateway.api.app import GatewayApp
from gateway.tenants import hash_api_key
from tests.helpers.gateways import (
    LITELLM_WARNINGS,
    OTHER_KEY,
    TENANT_KEY,
    Gateway,
    Sim,
    logged_private_gateway,
)
from tests.helpers.log_truth import hosted_gateway
from tests.helpers.provenance import completion_record, records
from tests.helpers.raw_backend import Answer, Post, RawBackend
from tests.helpers.raw_socket import WAIT_S, connect, parse
from tests.helpers.waiting import until, until_async

pytestmark = LITELLM_WARNINGS  # one test's answer comes from a hosted backend

BUDGET = 100_000
HELD = 60_000  # the answer held open mid-read
FIRST = 1_000  # what of it the backend sends before it waits (declared length)
OTHER = 50_000  # HELD + OTHER > BUDGET >= each alone
ORIGIN = "gw.answer-budget.test/log"
# One failure would open the breaker for a minute: a refusal must not count as one.
BREAKER = {"breaker": {"failure_threshold": 1, "cooldown_s": 60, "max_cooldown_s": 60}}

Framing = Literal["length", "chunked"]


def _json(size: int) -> bytes:
    """A JSON answer of exactly `size` bytes."""
    return b'{"x":"' + b"a" * (size - 8) + b'"}'


def _chat(word: str) -> dict[str, Any]:
    # The script word rides in the prompt: a private backend gets `user` as the tenant's
    # digest (gateway/upstream/tenant_ids.py), never as the client wrote it.
    return {"model": "m", "messages": [{"role": "user", "content": word}]}


def _head(framing: Framing, size: int) -> bytes:
    field = b"content-length: %d" % size if framing == "length" else b"transfer-encoding: chunked"
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + field + b"\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


class Script:
    """The backend: `hold` answers `HELD` bytes and waits for `go` midway; `error` answers
    500 with a 10 KB body, `bad` 400 with one; `big` answers `big` bytes; anything else
    answers `OTHER` bytes whole, framed `framing`."""

    def __init__(self, framing: Framing) -> None:
        self.framing = framing
        self.go = threading.Event()
        self.big = 0  # `big` answers `big` bytes (content-length), for the slow reader

    async def __call__(self, writer: asyncio.StreamWriter, post: Post) -> bool:
        word = json.loads(post.body)["messages"][0]["content"]
        if word == "hold":
            await self._held(writer)
        elif word == "error":
            body = b'{"error": {"message": "' + b"e" * 10_000 + b'"}}'
            head = b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
            writer.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)
        elif word == "bad":
            body = b'{"error": {"message": "too long' + b" e" * 5_000 + b'"}}'
            head = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
            writer.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)
        elif word == "big":
            writer.write(_head("length", self.big) + _json(self.big))
        else:
            data = _json(OTHER)
            framed = data if self.framing == "length" else _chunk(data) + b"0\r\n\r\n"
            writer.write(_head(self.framing, OTHER) + framed)
        await writer.drain()
        return False

    async def _held(self, writer: asyncio.StreamWriter) -> None:
        data = _json(HELD)
        if self.framing == "length":
            writer.write(_head("length", HELD) + data[:FIRST])
            rest = data[FIRST:]
        else:  # counted as it arrives: all but the end before the wait
            writer.write(_head("chunked", HELD) + _chunk(data[:-FIRST]))
            rest = _chunk(data[-FIRST:]) + b"0\r\n\r\n"
        await writer.drain()
        await until_async(self.go.is_set, "the test lets the held answer end", timeout=60)
        writer.write(rest)
        await writer.drain()


def _held_mid_read(script: Script) -> int:
    """What the held answer holds of the budget while its backend waits."""
    return HELD if script.framing == "length" else HELD - FIRST


@pytest.fixture(params=["length", "chunked"])
def script(request: pytest.FixtureRequest) -> Iterator[Script]:
    script = Script(request.param)
    yield script
    script.go.set()  # a failed test must not leave the backend waiting


@pytest.fixture
def gateway(
    script: Script,
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> Gateway:
    raw = start_raw(script)
    limits = {"max_response_bytes": BUDGET, "max_held_answer_bytes": BUDGET}
    return logged_private_gateway(
        start_gateway, tmp_path, raw.url, ORIGIN, limits=limits, routing=BREAKER
    )


def _post(gateway: Gateway, word: str, key: str = TENANT_KEY) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json=_chat(word),
        headers={"authorization": f"Bearer {key}"},
        timeout=WAIT_S,
    )


def _held(app: GatewayApp, size: int) -> None:
    until(lambda: app.answers.held == size, f"the gateway holds {size} answer bytes")


def test_a_second_answer_past_the_budget_is_refused_while_the_first_is_held(
    gateway: Gateway, script: Script, tmp_path: Path
) -> None:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(_post, gateway, "hold")
        _held(gateway.app, _held_mid_read(script))
        refused = _post(gateway, "other")
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "rate_limit_exceeded"
        assert "limits.max_held_answer_bytes" in error["message"]
        assert refused.headers["retry-after"] == "1"
        assert gateway.app.answers.held == _held_mid_read(script)  # the refusal kept nothing
        # The signed log says what the client got: 429, no answer committed to.
        record = completion_record(tmp_path / "log", refused.headers["x-request-id"])
        assert record["status"] == 429
        assert record["error"] == "rate_limit_exceeded"
        assert record["response_commitment"] is None
        script.go.set()
        served = first.result(timeout=WAIT_S)
    assert served.status_code == 200, served.text
    assert served.content == _json(HELD)
    _held(gateway.app, 0)  # given back when its request ended
    # The refusal was the gateway's, not the backend's: its breaker (opened by one
    # failure) let this through, and the budget now has room.
    again = _post(gateway, "other")
    assert again.status_code == 200, again.text
    assert again.content == _json(OTHER)
    _held(gateway.app, 0)


@pytest.mark.parametrize("script", ["length"], indirect=True)
def test_one_tenants_held_answers_leave_the_other_tenants_room(
    script: Script,
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """`acme` asks for two large answers and reads neither (here: their backend holds
    them mid-read). They took the whole budget, and `other`, whose key is its own, got
    429 for every whole answer meanwhile. Now one tenant's answers hold at most its part
    of the budget (half by default): `acme`'s second is refused, and `other` is served."""
    raw = start_raw(script)
    limits = {"max_response_bytes": HELD, "max_held_answer_bytes": 2 * HELD}
    tenants = [
        {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["m"]},
        {"id": "other", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["m"]},
    ]
    gateway = logged_private_gateway(
        start_gateway, tmp_path, raw.url, ORIGIN, limits=limits, tenants=tenants, routing=BREAKER
    )
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(_post, gateway, "hold")
        _held(gateway.app, HELD)
        second = pool.submit(_post, gateway, "hold")
        until(
            lambda: second.done() or gateway.app.answers.held == 2 * HELD,
            "acme's second answer held or refused",
        )
        served = _post(gateway, "other", OTHER_KEY)
        assert served.status_code == 200, served.text
        assert served.content == _json(OTHER)
        refused = second.result(timeout=WAIT_S)
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "rate_limit_exceeded"
        assert "limits.max_held_answer_bytes_per_tenant" in error["message"]
        assert refused.headers["retry-after"] == "1"
        record = completion_record(tmp_path / "log", refused.headers["x-request-id"])
        assert (record["status"], record["response_commitment"]) == (429, None)
        script.go.set()
        assert first.result(timeout=WAIT_S).content == _json(HELD)
    _held(gateway.app, 0)
    assert gateway.app.answers.by_tenant == {}


def test_an_error_answer_gives_its_bytes_back(gateway: Gateway, tmp_path: Path) -> None:
    failed = _post(gateway, "error")
    assert failed.status_code >= 500, failed.text
    record = completion_record(tmp_path / "log", failed.headers["x-request-id"])
    assert record["status"] == failed.status_code
    _held(gateway.app, 0)


@pytest.mark.parametrize("script", ["length"], indirect=True)
def test_an_error_body_past_the_budget_is_dropped_and_its_status_answers(
    gateway: Gateway, tmp_path: Path
) -> None:
    # Other requests' answers, held now (taken while the gateway serves nothing).
    others = gateway.app.answers.hold(BUDGET)
    others.cover(BUDGET - 100)
    try:
        dropped = _post(gateway, "bad")
        assert dropped.status_code == 400, dropped.text
        error = dropped.json()["error"]
        assert error["code"] == "upstream_bad_request"
        assert error["message"] == "the backend rejected the request"  # the status alone
        record = completion_record(tmp_path / "log", dropped.headers["x-request-id"])
        assert record["status"] == 400
        assert gateway.app.answers.held == BUDGET - 100
    finally:
        others.release()
    read = _post(gateway, "bad")  # room again: its message is read
    assert read.status_code == 400, read.text
    assert read.json()["error"]["message"].startswith("the backend rejected the request: too long")
    _held(gateway.app, 0)


def test_a_client_that_leaves_mid_read_gives_the_bytes_back(
    gateway: Gateway, script: Script, tmp_path: Path
) -> None:
    body = json.dumps(_chat("hold")).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer " + TENANT_KEY.encode() + b"\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    )
    with connect(gateway.server) as client:
        client.sendall(head + body)
        _held(gateway.app, _held_mid_read(script))
    _held(gateway.app, 0)  # the client left: its request ended, the backend was dropped
    assert [r["status"] for r in _completions(tmp_path / "log")] == [499]


def _completions(log_dir: Path) -> list[dict[str, Any]]:
    """The signed completion records of the log in `log_dir`, once one is covered."""
    found: list[dict[str, Any]] = []

    def completed() -> bool:
        found[:] = [r for r in records(log_dir) if r["type"] == "completion"]
        return bool(found)

    until(completed, "a signed completion record")
    return found


@pytest.mark.parametrize("script", ["length"], indirect=True)
def test_a_slow_reader_holds_its_answer_until_it_has_taken_it(
    script: Script,
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    # More than the kernel's socket buffers take (4 MiB to send, a small receive buffer):
    # the rest stays in the client connection's write buffer.
    script.big = 12 * 1024 * 1024
    raw = start_raw(script)
    limits = {"max_response_bytes": 16 * 1024 * 1024, "max_held_answer_bytes": 16 * 1024 * 1024}
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN, limits=limits)
    body = json.dumps(_chat("big")).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer " + TENANT_KEY.encode() + b"\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    )
    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        client.settimeout(WAIT_S)
        client.connect((gateway.server.host, gateway.server.port))
        client.sendall(head + body)
        # The answer went to the connection: the client has read none of it, so the
        # gateway still holds it, and records no answer yet: most of it is still in the
        # gateway's write buffer, which a crash would lose
        # (tests/integration/test_log_truth_killed_unread.py).
        until(lambda: gateway.app.answers.held == script.big, "the answer held", timeout=WAIT_S)
        assert not [r for r in records(tmp_path / "log") if r["type"] == "completion"]
        raw_answer = b""
        while b"\r\n\r\n" not in raw_answer:
            raw_answer += client.recv(1 << 20)
        status, headers, got = parse(raw_answer)
        assert status == 200
        while len(got) < int(headers["content-length"]):
            chunk = client.recv(1 << 20)
            assert chunk, "closed inside the answer"
            got += chunk
        assert got == _json(script.big)
        _held(gateway.app, 0)  # taken: given back
        assert [r["status"] for r in _completions(tmp_path / "log")] == [200]  # and recorded


def test_a_hosted_answer_past_the_budget_is_refused(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    hosted = start_sim("vllm", models=("f",), zero_latency=True)
    limits = {"max_response_bytes": BUDGET, "max_held_answer_bytes": BUDGET}
    gateway = hosted_gateway(start_gateway, tmp_path, f"{hosted.url}/v1", "f", limits=limits)
    url = f"{gateway.url}/v1/chat/completions"
    ask = {"model": "f", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    # Other requests' answers, held now: no hosted answer (over 100 bytes) fits beside
    # them. Taken while the gateway serves nothing, so its loop does not touch the count.
    others = gateway.app.answers.hold(BUDGET)
    others.cover(BUDGET - 100)
    try:
        refused = httpx.post(url, json=ask, headers=gateway.headers, timeout=60)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert refused.headers["retry-after"] == "1"
        record = completion_record(tmp_path / "log", refused.headers["x-request-id"])
        assert record["status"] == 429 and record["response_commitment"] is None
        assert gateway.app.answers.held == BUDGET - 100  # the refusal kept nothing
    finally:
        others.release()
    served = httpx.post(url, json=ask, headers=gateway.headers, timeout=60)
    assert served.status_code == 200, served.text
    _held(gateway.app, 0)
