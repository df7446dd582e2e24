"""What a tenant learns when no backend served its request: nothing of the operator's
backends (ids, addresses, probe or connect failures), on a real `owngate serve`.

The 503 used to name them (`private pool unavailable: gpu-secret-7: ...`,
`no compliant backend could take the request ... (gpu-secret-7: connect)`); which backends
failed, and why, is on `/admin/status` only (docs/security.md)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from gateway.api.refusal import UNSERVED_CHARS
from gateway.tenants import hash_api_key
from tests.helpers.gateways import TENANT_KEY, Sim, backend, hosted_backend
from tests.helpers.net import free_port
from tests.helpers.processes import GatewayProcess

SECRET_ID = "gpu-secret-7"
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def sim(start_sim: Callable[..., Sim]) -> Sim:
    return start_sim("vllm", models=("sim-model",), zero_latency=True)


@pytest.fixture
def gateway(sim: Sim, tmp_path: Path) -> Iterator[GatewayProcess]:
    """`owngate serve` with one private backend, `SECRET_ID`, and no hosted fallback."""
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "error", "access_log": False},
        "backends": [backend(SECRET_ID, sim.url, "sim-model")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["*"]}],
    }
    process = GatewayProcess(config, tmp_path).start()
    yield process
    process.stop()


def test_a_503_names_no_backend_nor_its_failure(sim: Sim, gateway: GatewayProcess) -> None:
    """The only backend goes away: each request's 503 (the failed attempt's
    `backend_unavailable`, then, once the backend is taken out, the refusal's
    `no_compliant_backend`) says neither the backend's id, its address nor how it failed,
    and names the request's id."""
    port = sim.url.rsplit(":", 1)[1]
    sim.server.stop()
    codes: set[str] = set()
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        for _ in range(20):  # the breaker opens after a few failed attempts
            response = client.post(
                "/v1/chat/completions",
                json=CHAT,
                headers={"authorization": f"Bearer {TENANT_KEY}"},
            )
            assert response.status_code == 503, response.text
            error = response.json()["error"]
            message = error["message"]
            for secret in (SECRET_ID, port, "127.0.0.1", "connect", "failed", "health"):
                assert secret not in message, (secret, message)
            assert response.headers["x-request-id"] in message
            codes.add(error["code"])
            if error["code"] == "no_compliant_backend":
                break
    assert codes == {"backend_unavailable", "no_compliant_backend"}, codes


def test_the_operator_access_line_says_which_backend_failed_and_why(tmp_path: Path) -> None:
    """What the client no longer reads is the operator's, per request: the access line of
    a 503 (`unserved`) names the dead backend and how it failed; the client's body names
    neither. A served request's line has no `unserved` field (the line's cost)."""
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "info", "access_log": True},
        "backends": [backend(SECRET_ID, f"http://127.0.0.1:{free_port()}", "sim-model")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["*"]}],
    }
    process = GatewayProcess(config, tmp_path).start()
    try:
        with httpx.Client(base_url=process.url, timeout=30) as client:
            response = client.post(
                "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {TENANT_KEY}"}
            )
    finally:
        process.stop()
    assert response.status_code == 503, response.text
    assert SECRET_ID not in response.text
    request_id = response.headers["x-request-id"]
    lines = [json.loads(line) for line in process.output().splitlines() if line.startswith("{")]
    (line,) = [x for x in lines if x.get("event") == "request" and x["request_id"] == request_id]
    assert line["status"] == 503
    unserved = line["unserved"]
    assert unserved.startswith(f"{SECRET_ID}: "), unserved
    assert "connect" in unserved, unserved
    assert len(unserved) <= UNSERVED_CHARS


def test_a_served_request_has_no_unserved_field(sim: Sim, tmp_path: Path) -> None:
    """The field is only on requests that no backend served."""
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "info", "access_log": True},
        "backends": [backend(SECRET_ID, sim.url, "sim-model")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["*"]}],
    }
    process = GatewayProcess(config, tmp_path).start()
    try:
        with httpx.Client(base_url=process.url, timeout=30) as client:
            response = client.post(
                "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {TENANT_KEY}"}
            )
    finally:
        process.stop()
    assert response.status_code == 200, response.text
    lines = [json.loads(line) for line in process.output().splitlines() if line.startswith("{")]
    (line,) = [x for x in lines if x.get("event") == "request"]
    assert line["backend"] == SECRET_ID
    assert "unserved" not in line


# Three tenants, each refused by another section of its own policy's data class `x` (so
# the model is in the tenant's `/v1/models`, and the 403 is its answer; a model the
# tenant cannot see gets a 404, test_model_enumeration.py): the reason each exclusion has
# names the backend's id, its region or its provider model.
_REFUSING_POLICIES = {
    "residency": "residency: {allow: [eu]}",
    "backends": "backends: {deny: ['gpu-secret-*']}",
    "models": "models: {deny: ['gpt-secret*']}",
}
_FALLBACK = {
    "residency": "fallback: {mode: never}",
    "backends": "fallback: {mode: never}",
    "models": "fallback:\n    mode: when_private_unavailable\n    to: [{backend: cloud-secret-9}]",
}


def test_a_403_names_the_rule_not_the_backends_it_judged(tmp_path: Path) -> None:
    """A policy refusal (403 `policy_denied`) tells the tenant which rule of its policy
    refused, never what that rule found out about the operator's backends: their ids,
    regions, providers or the models a hosted provider is sent. It used to end in the
    exclusion's reason (`(region 'us-east-1' is outside residency.allow [eu])`, `(backend
    'gpu-secret-7' matches backends.deny entry ...)`, `(provider model
    'openai/gpt-secret-4o' ...)`), which the 503s stopped saying."""
    policies = tmp_path / "policies"
    policies.mkdir()
    keys = {name: f"og-{name}-" + "k" * 32 for name in _REFUSING_POLICIES}
    for name, sections in _REFUSING_POLICIES.items():
        (policies / f"{name}.yaml").write_text(
            "apiVersion: policy.owngate.dev/v1\nkind: Policy\n"
            f"metadata: {{id: p-{name}, version: '1'}}\n"
            f"spec:\n  tenants: [t-{name}]\n  residency: {{allow: ['*']}}\n"
            f"  retention: {{max_days: any}}\n  {_FALLBACK[name]}\n"
            f"  data_classes:\n    x: {{{sections}}}\n"
        )
    dead = f"http://127.0.0.1:{free_port()}"  # nothing is dispatched: no server needed
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "error", "access_log": False},
        "policy": {"paths": [str(policies)]},
        "backends": [
            backend(SECRET_ID, dead, "sim-model", region="us-east-1", owner="secret-owner"),
            hosted_backend("cloud-secret-9", f"{dead}/v1", "hm")
            | {"models": [{"name": "hm", "provider_model": "openai/gpt-secret-4o"}]},
        ],
        "tenants": [
            {"id": f"t-{name}", "api_key_hashes": [hash_api_key(key)], "models": ["*"]}
            for name, key in keys.items()
        ],
    }
    process = GatewayProcess(config, tmp_path, env={"HOSTED_KEY": "sk-test"}).start()
    asked = {"residency": "sim-model", "backends": "sim-model", "models": "hm"}
    try:
        with httpx.Client(base_url=process.url, timeout=30) as client:
            answers = {
                name: client.post(
                    "/v1/chat/completions",
                    json={**CHAT, "model": asked[name]},
                    headers={"authorization": f"Bearer {keys[name]}", "x-data-class": "x"},
                )
                for name in keys
            }
    finally:
        process.stop()
    secrets = (SECRET_ID, "us-east-1", "secret-owner", "cloud-secret-9", "gpt-secret", "openai")
    for name, response in answers.items():
        assert response.status_code == 403, (name, response.text)
        error = response.json()["error"]
        assert error["code"] == "policy_denied"
        rule = f"p-{name}/data_classes.x/{name}"
        assert error["message"].startswith(f"policy {rule}: "), error["message"]
        for secret in secrets:
            assert secret not in error["message"], (name, secret, error["message"])
