"""Backends that quote the request back in their errors: a canary in the prompt, a header
and the body's fields reaches none of the gateway's output (its logs, the access log, the
OpenTelemetry spans it prints with `OTEL_TRACES_EXPORTER=console`, the provenance log,
`/metrics`), whichever way the backend fails. A private backend answering 400, 422, 500
or 503, or a stream that breaks off, with the request in its text; a hosted provider (the
OpenAI adapter) answering 400, 500, or 200 with an error object, quoting it too; requests
a hosted adapter cannot translate. What the client itself gets back is its own request's
business (docs/api.md), and is not checked here."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson

from gateway.provenance import write_signing_key
from gateway.tenants import hash_api_key
from tests.helpers.gateways import HOSTED_ONLY_POLICY, LITELLM_WARNINGS
from tests.helpers.net import free_port
from tests.helpers.processes import GatewayProcess
from tests.helpers.raw_backend import Answer, Post, RawBackend

pytestmark = LITELLM_WARNINGS

CANARY = "CANARY-7f3a-echoed"
SAID = CANARY + '\x1b[31m\n{"json":"injection"}\u202e'
KEY = "og-echo-tenant-key-" + "e" * 24
EU = {"region": "eu", "retention": {"days": 0, "zero_data_retention": True, "training": False}}


def _reply(status: int, body: bytes) -> bytes:
    head = b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    return head % (status, len(body)) + body


def _echoing(answers: dict[str, Callable[[str], bytes]]) -> Answer:
    """A backend answering by the body's `model`, each answer quoting the whole request."""

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        echo = (post.head + post.body).decode("utf-8", "replace")
        writer.write(answers[json.loads(post.body)["model"]](echo))
        await writer.drain()
        return False

    return answer


def _error(status: int, kind: str = "server_error") -> Callable[[str], bytes]:
    return lambda echo: _reply(
        status, orjson.dumps({"error": {"message": f"refused: {echo}", "type": kind}})
    )


PRIVATE = {
    "e400": _error(400),
    "e422": lambda echo: _reply(422, orjson.dumps({"detail": [{"msg": echo}]})),
    "e500": lambda echo: _reply(500, b"internal: " + echo.encode()),
    "e503": _error(503),
    "broken": lambda echo: (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 99999\r\n\r\n"
        + b"data: {}\n\n"
        + echo.encode()
    ),
}
HOSTED = {
    "h400": _error(400, "invalid_request_error"),
    "h500": _error(500),
    "hin200": lambda echo: _reply(200, orjson.dumps({"error": {"message": echo, "code": 500}})),
}


def _config(private: RawBackend, hosted: RawBackend, port: int) -> dict[str, Any]:
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "logging": {"format": "json", "level": "debug", "access_log": True},
        "backends": [
            {
                "id": "gpu",
                "kind": "vllm",
                "base_url": private.url,
                "models": [{"name": name} for name in PRIVATE if name != "broken"],
                "owner": "t",
                **EU,
            },
            {  # the same server, its own breaker: the others' failures do not close it
                "id": "gpu-b",
                "kind": "vllm",
                "base_url": private.url,
                "models": [{"name": "broken"}],
                "owner": "t",
                **EU,
            },
            {
                "id": "hosted",
                "kind": "hosted",
                "provider": "openai",
                "base_url": hosted.url + "/v1",
                "api_key_env": "HOSTED_KEY",
                "owner": "provider",
                "models": [{"name": n, "provider_model": f"openai/{n}"} for n in HOSTED],
                **EU,
            },
        ],
        "policy": {"paths": ["policies"]},
        "provenance": {
            "dir": "log",
            "origin": "echo.test/log",
            "signing_key_file": "log.key",
            "checkpoint_interval_ms": 50,
        },
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
    }


def test_what_a_backend_quotes_of_the_request_is_logged_nowhere(
    start_raw: Callable[[Answer], RawBackend], tmp_path: Path
) -> None:
    private, hosted = start_raw(_echoing(PRIVATE)), start_raw(_echoing(HOSTED))
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "echo.yaml").write_text(HOSTED_ONLY_POLICY)
    write_signing_key(tmp_path / "log.key", "echo.test/log")
    env = {"NO_COLOR": "1", "HOSTED_KEY": "test-key", "OTEL_TRACES_EXPORTER": "console"}
    gateway = GatewayProcess(_config(private, hosted, free_port()), tmp_path, env=env)
    prompt = [{"role": "user", "content": SAID}]
    headers = {"authorization": f"Bearer {KEY}", "x-request-id": CANARY, "user-agent": CANARY}
    asks: list[tuple[str, dict[str, Any]]] = [
        *((name, {"model": name, "messages": prompt}) for name in PRIVATE),
        ("broken", {"model": "broken", "messages": prompt, "stream": True}),
        # the adapter cannot translate these: refused before sending, quoting nothing
        ("h400", {"model": "h400", "messages": [{"role": CANARY, "content": {CANARY: SAID}}]}),
        ("h400", {"model": "h400", "messages": SAID}),
        *((name, {"model": name, "messages": prompt, "user": SAID}) for name in HOSTED),
    ]
    try:
        gateway.start()
        statuses = []
        for _name, body in asks:
            response = httpx.post(
                f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=30
            )
            statuses.append(response.status_code)
        metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    finally:
        assert gateway.stop() == 0
    # each failed as it should: the backends' errors, not a gateway fault
    assert 500 not in statuses, statuses
    # `broken` asked for a whole answer streams back: the wrong shape, a 502 before any byte
    assert statuses[: len(PRIVATE)] == [400, 400, 502, 503, 502]
    assert len(private.posts) >= len(PRIVATE) + 1 and len(hosted.posts) >= len(HOSTED), statuses
    assert all(CANARY in post.body.decode() for post in private.posts)  # they did quote it
    assert CANARY not in metrics
    written = gateway.written()
    assert len(written) > 2  # stdout, stderr and the provenance log's files
    assert b'"event":"request"' in written[1]  # the access log is on
    assert b"gen_ai.operation.name" in written[0]  # so are the spans
    for data in written:
        assert CANARY.encode() not in data
        assert b"injection" not in data
