"""A canary in prompts and keys never shows up in the gateway's logs, metrics or output."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.routing.router import Router
from gateway.tenants import hash_api_key
from tests.helpers.gateways import TENANT_KEY, Gateway, Sim, backend
from tests.helpers.log_capture import rendered_logs
from tests.helpers.net import free_port
from tests.helpers.processes import GatewayProcess

CANARY = "CANARY-7f3e9b1c-do-not-log"
KEY = "og-canary-key-" + "k" * 24


def test_canary_appears_nowhere(start_sim: Callable[..., Sim], tmp_path: Path) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    port = free_port()
    config = {
        "listen": {"host": "127.0.0.1", "port": port},
        "logging": {"format": "json", "level": "debug", "access_log": True},
        "backends": [
            {
                "id": "gpu",
                "kind": "vllm",
                "base_url": sim.url,
                "models": [{"name": "m"}],
                "region": "eu",
                "owner": "t",
            }
        ],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
    }
    gateway = GatewayProcess(config, tmp_path, env={"NO_COLOR": "1"})
    try:
        gateway.start()
        url = gateway.url
        auth = {"authorization": f"Bearer {KEY}"}
        prompt = [{"role": "user", "content": f"my secret is {CANARY}"}]
        calls = [
            ("/v1/chat/completions", {"model": "m", "messages": prompt}, auth),
            ("/v1/chat/completions", {"model": "m", "messages": prompt, "stream": True}, auth),
            ("/v1/completions", {"model": "m", "prompt": CANARY}, auth),
            ("/v1/embeddings", {"model": "m", "input": CANARY}, auth),
            (
                "/v1/chat/completions",
                {"model": "m", "messages": prompt},
                {"authorization": f"Bearer og-{CANARY}"},
            ),  # an unknown key that is the canary
            ("/v1/chat/completions", {"messages": prompt}, auth),  # missing model
            ("/v1/chat/completions", {"model": CANARY, "messages": prompt}, auth),  # unknown
            (
                "/v1/chat/completions",
                {"model": "m", "messages": prompt},
                {**auth, "x-data-class": CANARY},
            ),  # a label no policy defines
        ]
        statuses = [
            httpx.post(f"{url}{path}", json=body, headers=headers, timeout=10).status_code
            for path, body, headers in calls
        ]
        assert statuses == [200, 200, 200, 200, 401, 400, 404, 400], gateway.output()
        bad_json = httpx.post(
            f"{url}/v1/chat/completions",
            headers=auth,
            timeout=10,
            content=b'{"model": "m", "x": "' + CANARY.encode(),
        )
        assert bad_json.status_code == 400
        assert CANARY not in bad_json.text
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert "owngate_requests_total" in metrics
        assert CANARY not in metrics
    finally:
        gateway.stop()
    err = gateway.stderr()
    output = gateway.stdout() + err
    assert CANARY not in output
    assert KEY not in output
    # The logs are really there: one JSON access line per request, with metadata only.
    access = [
        json.loads(line)
        for line in err.splitlines()
        if line.startswith("{") and '"event":"request"' in line
    ]
    assert len(access) == 9
    assert {entry["status"] for entry in access} == {200, 401, 400, 404}
    assert all(entry["model"] in ("m", "-", "<unknown>") for entry in access)
    assert {entry["data_class"] for entry in access} == {None, "<unknown>"}


def test_an_unexpected_error_is_logged_without_the_request_it_quotes(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fault of the gateway's own whose exception quotes the request (here a lookup by
    the prompt: `KeyError('<the prompt>')`) is logged with its traceback, the stack only:
    the message was written into the log, escaped but whole."""

    async def failing(_router: Router, _model: str, _decision: Any, doc: Any, _at: float) -> Any:
        return {}[doc["messages"][0]["content"]]

    monkeypatch.setattr(Router, "plan", failing)
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    with rendered_logs() as logs:
        gateway = start_gateway([backend("gpu", sim.url, "m")])
        response = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": f"secret {CANARY}"}]},
            headers={"authorization": f"Bearer {TENANT_KEY}"},
            timeout=10,
        )
    assert response.status_code == 500, response.text
    assert response.json()["error"]["code"] == "internal_error"
    lines = [json.loads(line) for line in logs.getvalue().splitlines()]
    crash = next(line for line in lines if line["event"] == "unhandled error")
    assert "in failing" in crash["exception"]  # where it happened is kept
    said = len(str(KeyError(f"secret {CANARY}")))
    assert crash["exception"].endswith(f"KeyError: [message withheld: {said} characters]")
    assert CANARY not in logs.getvalue()
