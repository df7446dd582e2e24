"""A body with a name repeated in one of its objects reaches no backend, on any endpoint,
private or hosted (gateway/api/body_names.py): `{"store": true, "store": null}` passed the
hosted rule (the gateway read the last copy, `null`) on its way to a `kind: openai`
router, which in Go keeps `true` (a `null` leaves a plain bool as it was)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.helpers.gateways import LITELLM_WARNINGS, Gateway, Sim, backend, logged_gateway
from tests.helpers.log_truth import hosted_gateway
from tests.helpers.provenance import assert_never_logged

pytestmark = LITELLM_WARNINGS

BODIES = {
    "/v1/chat/completions": (
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
        b'"store": true, "store": null}'
    ),
    "/v1/completions": b'{"model": "m", "prompt": "hi", "store": true, "store": null}',
    "/v1/embeddings": b'{"model": "m", "input": "hi", "metadata": {"tags": ["a"], "tags": null}}',
}
PARAMS = {"/v1/embeddings": "metadata.tags"}


def post(gateway: Gateway, path: str, body: bytes) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}{path}",
        content=body,
        headers={**gateway.headers, "content-type": "application/json"},
        timeout=60,
    )


def refused_unsent(gateway: Gateway, sim: Sim, log: Path, path: str) -> None:
    refused = post(gateway, path, BODIES[path])
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", PARAMS.get(path, "store"))
    assert "repeats" in error["message"]
    assert sim.app.captured(path) == []
    ok = post(
        gateway,
        path,
        BODIES[path]
        .replace(b', "store": null', b"")
        .replace(b', "tags": null', b"")
        # an embedding's `metadata.tags` is refused for a router (tag routing): another key
        .replace(b'"tags": ["a"]', b'"topic": "a"')
        .replace(b'"store": true', b'"store": false'),
    )
    assert ok.status_code == 200, ok.text
    assert_never_logged(log, refused.headers["x-request-id"], ok.headers["x-request-id"])


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("kind", ["openai", "vllm"])
def test_a_repeated_name_reaches_no_private_backend(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    path: str,
    kind: str,
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    gpu = backend("gpu", sim.url, "m", kind=kind)
    gateway = logged_gateway(start_gateway, tmp_path, [gpu], "example.com/names")
    refused_unsent(gateway, sim, tmp_path / "log", path)


def test_a_repeated_name_reaches_no_hosted_provider(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    provider = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = hosted_gateway(start_gateway, tmp_path, f"{provider.url}/v1", "m")
    refused_unsent(gateway, provider, tmp_path / "log", "/v1/chat/completions")
