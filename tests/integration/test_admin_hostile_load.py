"""A backend's `/metrics` cannot blind the admin views: `/admin/v1/status` and
`/admin/v1/timeline/backends` (the console's operator page) show counts as integers, and
a running or waiting count no server could report (0.5 requests, 1e19, two series of
1e308 whose total overflows to infinity) made each of them a 500 `internal_error` for
every backend, the timeline for as long as the sample stayed in its window. Such a count
is now unknown (`gateway/routing/signals.py` `_count`), as a negative one already was,
and both views answer."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import httpx
import pytest

from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from gateway.routing.prometheus import parse_metrics
from gateway.routing.signals import BackendLoad, load_from_metrics
from gateway.serving import ServerThread
from tests.helpers.gateways import backend

MAX_COUNT = 2**53  # signals.py: past it a float is not one integer
TOKEN = "og-admin-operator-token-0123456789"
HOSTILE = [
    "vllm:num_requests_running 0\nvllm:num_requests_waiting 0.5\n",
    "vllm:num_requests_running 1e19\nvllm:num_requests_waiting 0\n",
    'vllm:num_requests_running 0\nvllm:num_requests_waiting{engine="0"} 1e308\n'
    'vllm:num_requests_waiting{engine="1"} 1e308\n',
]


def _metrics_backend(text: str) -> Any:
    """An ASGI app answering `/metrics` with `text` and anything else with `{}`."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # uvicorn's lifespan: nothing to start
            return
        body = text.encode() if scope["path"] == "/metrics" else b"{}"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    return app


def _views(url: str) -> tuple[httpx.Response, httpx.Response]:
    """Scrape the backend at `url` once, take a timeline sample, and read both views."""
    config = {
        "backends": [backend("gpu", url, "m")],
        "tenants": [{"id": "acme", "api_key_hashes": ["sha256:" + "cd" * 32], "models": ["*"]}],
        "admin": {"tokens": [{"role": "operator", "hash": _digest(TOKEN)}]},
    }
    gateway = create_app(GatewaySettings.model_validate(config))
    app = admin_app(gateway)

    async def run() -> tuple[httpx.Response, httpx.Response]:
        try:
            await gateway.parts.scraper.scrape_once()
        finally:
            await gateway.parts.scraper.close()  # its connection to the backend
        app.state.timeline.sample()
        # a fault of the app is answered as the server would (500), not raised here
        transport = httpx.ASGITransport(app, raise_app_exceptions=False, client=("10.0.0.1", 1))
        headers = {"authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://admin.test", headers=headers
        ) as http:
            return await http.get("/admin/v1/status"), await http.get("/admin/v1/timeline/backends")

    return asyncio.run(run())


def _digest(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


@pytest.mark.parametrize("text", HOSTILE)
def test_an_impossible_count_leaves_the_operator_views_answering(text: str) -> None:
    with ServerThread(_metrics_backend(text)) as server:
        status, timeline = _views(server.url)
    assert status.status_code == 200, status.text
    assert timeline.status_code == 200, timeline.text
    (shown,) = status.json()["backends"]
    assert shown["metrics_error"] is None  # the scrape was read: the count alone is unknown
    assert None in (shown["running"], shown["waiting"])
    (sample,) = timeline.json()["samples"]
    assert None in (sample["backends"]["gpu"]["running"], sample["backends"]["gpu"]["waiting"])


def test_what_a_real_server_says_is_still_shown() -> None:
    text = 'vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_running{engine="1"} 4\n'
    with ServerThread(_metrics_backend(text + "vllm:num_requests_waiting 2.0\n")) as server:
        status, timeline = _views(server.url)
    (shown,) = status.json()["backends"]
    assert (shown["running"], shown["waiting"]) == (7, 2)
    assert timeline.json()["samples"][0]["backends"]["gpu"]["waiting"] == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("vllm:num_requests_waiting 0.5", BackendLoad(None, None, None, None)),
        (f"vllm:num_requests_running {MAX_COUNT * 2}", BackendLoad(None, None, None, None)),
        (f"vllm:num_requests_running {MAX_COUNT}", BackendLoad(MAX_COUNT, None, None, None)),
        (
            'vllm:kv_cache_usage_perc{engine="0"} 1e308\n'
            'vllm:kv_cache_usage_perc{engine="1"} 1e308',
            BackendLoad(None, None, None, None),
        ),
    ],
)
def test_a_count_is_a_whole_number_and_a_total_is_finite(text: str, expected: BackendLoad) -> None:
    assert load_from_metrics("vllm", parse_metrics(text)) == expected
