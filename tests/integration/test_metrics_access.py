"""What `/metrics` on the public listener tells a tenant, or a client with no key, about
other tenants, and `listen.metrics: admin`, which keeps it for holders of an admin token.

`/metrics` counts policy decisions and refusals by rule id (`owngate_policy_decisions_total`),
and a rule id names its policy and data class (`acme/data_classes.phi/backends`): any
client of the public listener, another tenant among them, read which policies and data
classes each tenant has and, scrape by scrape, when and how often a tenant sent requests
of each class. With `listen.metrics: admin` the public `/metrics` answers a
full-access or `operator` admin token (or, with `admin.allow_loopback`, a loopback
client) only (docs/security.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.tenants import hash_api_key
from tests.helpers.gateways import (
    ADMIN,
    ADMIN_HEADERS,
    OTHER_KEY,
    TENANT_KEY,
    Gateway,
    Sim,
    backend,
)

POLICIES = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: acme}
spec:
  tenants: [acme]
  residency: {allow: ["*"]}
  retention: {max_days: any, training: true}
  data_classes:
    phi: {backends: {deny: [spare]}}
  fallback: {mode: never}
---
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: other}
spec:
  tenants: [other]
  residency: {allow: ["*"]}
  retention: {max_days: any, training: true}
  fallback: {mode: never}
"""
# Each role's token is its name (`admin.tokens`): an operator reads the metrics, as it
# reads /admin/status; the others' roles do not include them.
ROLES = ("operator", "security", "auditor")
CHAT = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def _gateway(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    metrics: str | None,
) -> Gateway:
    sims = [start_sim("vllm", models=("m",), zero_latency=True) for _ in range(2)]
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(POLICIES)
    listen = {} if metrics is None else {"listen": {"metrics": metrics}}
    admin = {**ADMIN, "tokens": [{"hash": hash_api_key(role), "role": role} for role in ROLES]}
    gateway = start_gateway(
        [backend("gpu", sims[0].url, "m"), backend("spare", sims[1].url, "m")],
        policy={"paths": [str(tmp_path / "policies")]},
        tenants=[
            {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["m"]},
            {"id": "other", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["m"]},
        ],
        admin=admin,
        **listen,
    )
    headers = {"authorization": f"Bearer {TENANT_KEY}", "x-data-class": "phi"}
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, headers=headers)
    assert response.status_code == 200, response.text
    return gateway


@pytest.mark.parametrize("metrics", [None, "open"])
def test_the_open_metrics_name_another_tenants_policy_and_data_class(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    metrics: str | None,
) -> None:
    """The default (`open`): what a scraper without a token reads, `other` too, is what
    docs/security.md says it is: acme's policy id, its class `phi`, and a count of its
    requests of that class."""
    gateway = _gateway(start_sim, start_gateway, tmp_path, metrics)
    for headers in ({}, {"authorization": f"Bearer {OTHER_KEY}"}):
        response = httpx.get(f"{gateway.url}/metrics", headers=headers)
        assert response.status_code == 200, response.text
        assert 'rule="acme/data_classes.phi/backends"} 1.0' in response.text


def test_admin_metrics_are_for_an_admin_token_only(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    """`listen.metrics: admin`: another tenant's key, a wrong token or none is refused
    with the admin surface's error and reads no sample, and so is the token of a role
    that is not `operator`; a full-access or operator token reads them all (a scraper
    needs no token that may reload, drain or mint keys)."""
    gateway = _gateway(start_sim, start_gateway, tmp_path, "admin")
    url = f"{gateway.url}/metrics"
    for headers in (
        {},
        {"authorization": f"Bearer {OTHER_KEY}"},
        {"authorization": f"Bearer {TENANT_KEY}"},
    ):
        response = httpx.get(url, headers=headers)
        assert response.status_code == 401, response.text
        assert response.json()["error"]["code"] in ("missing_api_key", "invalid_api_key")
        assert "owngate_" not in response.text and "phi" not in response.text
    for role in ("security", "auditor"):
        response = httpx.get(url, headers={"authorization": f"Bearer {role}"})
        assert response.status_code == 401, (role, response.text)
        assert "owngate_" not in response.text
    for headers in (ADMIN_HEADERS, {"authorization": "Bearer operator"}):
        response = httpx.get(url, headers=headers)
        assert response.status_code == 200, response.text
        assert 'rule="acme/data_classes.phi/backends"} 1.0' in response.text
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert httpx.post(url, headers=ADMIN_HEADERS).status_code == 405
