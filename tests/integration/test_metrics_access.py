"""What `/metrics` on the public listener tells a tenant, or a client with no key, about
other tenants, and `listen.metrics: admin`, which keeps it for holders of an admin token.

`/metrics` counts policy decisions and refusals by rule id (`owngate_policy_decisions_total`),
and a rule id names its policy and data class (`acme/data_classes.phi/backends`): any
client of the public listener, another tenant among them, read which policies and data
classes each tenant has and, scrape by scrape, when and how often a tenant sent requests
of each class. With `listen.metrics: admin`, the default, the public `/metrics` answers a
full-access or `operator` admin token (or, with `admin.allow_loopback`, a loopback
client) only, and with no admin token configured at all, a loopback client only: the
socket's peer, never one a header names (docs/security.md). The test gateways of
tests/helpers set `open`; the tests of the default here build their config without it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest

from gateway.api.admin import authorize_metrics
from gateway.app import create_app
from gateway.config.admin import AdminSettings, AdminTokenSettings
from gateway.config.schema import GatewaySettings
from gateway.errors import GatewayError
from gateway.serving import ServerThread
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
    metrics: str,
) -> Gateway:
    sims = [start_sim("vllm", models=("m",), zero_latency=True) for _ in range(2)]
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(POLICIES)
    admin = {**ADMIN, "tokens": [{"hash": hash_api_key(role), "role": role} for role in ROLES]}
    gateway = start_gateway(
        [backend("gpu", sims[0].url, "m"), backend("spare", sims[1].url, "m")],
        policy={"paths": [str(tmp_path / "policies")]},
        tenants=[
            {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["m"]},
            {"id": "other", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["m"]},
        ],
        admin=admin,
        listen={"metrics": metrics},
    )
    headers = {"authorization": f"Bearer {TENANT_KEY}", "x-data-class": "phi"}
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, headers=headers)
    assert response.status_code == 200, response.text
    return gateway


def test_the_open_metrics_name_another_tenants_policy_and_data_class(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    """`open`: what a scraper without a token reads, `other` too, is what docs/security.md
    says it is: acme's policy id, its class `phi`, and a count of its requests of that
    class."""
    gateway = _gateway(start_sim, start_gateway, tmp_path, "open")
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


def test_admin_metrics_have_no_other_door(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    """The same samples by another spelling of the request are refused too: HEAD, a query
    string, a percent-encoded path (the server decodes it to `/metrics`, which is checked);
    `/metrics/` and `//metrics` are other paths (404), and none shows a sample."""
    gateway = _gateway(start_sim, start_gateway, tmp_path, "admin")
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        for method, path, status in (
            ("HEAD", "/metrics", 401),
            ("GET", "/metrics?format=prometheus", 401),
            ("GET", "/%6detrics", 401),
            ("GET", "/metrics%3F", 404),
            ("GET", "/metrics/", 404),
            ("GET", "//metrics", 404),
        ):
            response = client.request(method, path)
            assert response.status_code == status, (method, path, response.text)
            assert "owngate_" not in response.text and "phi" not in response.text
        response = client.head("/metrics", headers=ADMIN_HEADERS)
        assert response.status_code == 200


def _plain_config(sim: Sim, admin: dict[str, Any]) -> GatewaySettings:
    """A config that sets no `listen.metrics` (the helpers' gateways set `open`)."""
    return GatewaySettings.model_validate(
        {
            "logging": {"format": "json", "level": "warning"},
            "backends": [backend("gpu", sim.url, "m")],
            "tenants": [
                {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["m"]}
            ],
            "admin": admin,
        }
    )


@pytest.fixture
def plain_gateway(start_sim: Callable[..., Sim]) -> Iterator[Callable[[dict[str, Any]], str]]:
    """Start a gateway whose config leaves `listen.metrics` to its default; its URL."""
    started: list[ServerThread] = []

    def start(admin: dict[str, Any]) -> str:
        sim = start_sim("vllm", models=("m",), zero_latency=True)
        config = _plain_config(sim, admin)
        assert config.listen.metrics == "admin"
        server = ServerThread(create_app(config, environ={})).start()
        started.append(server)
        chat = httpx.post(
            f"{server.url}/v1/chat/completions",
            json=CHAT,
            headers={"authorization": f"Bearer {TENANT_KEY}"},
            timeout=10,
        )
        assert chat.status_code == 200, chat.text
        return server.url

    yield start
    for server in started:
        server.stop()


def test_by_default_a_tokenless_scrape_reads_nothing_where_admin_tokens_exist(
    plain_gateway: Callable[[dict[str, Any]], str],
) -> None:
    """The default is `admin`: with admin tokens configured, a scrape without one (from
    loopback too) or with a tenant's key is 401 and reads no sample; an operator token
    reads them."""
    operator = "og-admin-operator-token-for-metrics"
    url = plain_gateway({**ADMIN, "tokens": [{"hash": hash_api_key(operator), "role": "operator"}]})
    for headers in ({}, {"authorization": f"Bearer {TENANT_KEY}"}):
        response = httpx.get(f"{url}/metrics", headers=headers, timeout=10)
        assert response.status_code == 401, response.text
        assert "owngate_" not in response.text
    response = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {operator}"})
    assert response.status_code == 200 and "owngate_requests_total" in response.text


def test_with_no_admin_access_only_a_loopback_peer_reads_the_default_metrics(
    plain_gateway: Callable[[dict[str, Any]], str],
) -> None:
    """No admin token and no `allow_loopback` (the README's quickstart, a local
    Prometheus): a loopback client reads `/metrics` (127.0.0.1 or any 127.0.0.0/8
    source), but a request a proxy on this host forwarded (a forwarding header) or a web
    page of another origin sent (a rebound DNS name in `Host`, a cross-site `Origin`) is
    403 naming `listen.metrics`, with no sample."""
    url = plain_gateway({"listen": None})
    response = httpx.get(f"{url}/metrics", timeout=10)
    assert response.status_code == 200 and "owngate_requests_total" in response.text
    transport = httpx.HTTPTransport(local_address="127.0.0.5")
    with httpx.Client(transport=transport, timeout=10) as client:
        assert client.get(f"{url}/metrics").status_code == 200
    for headers in (
        {"x-forwarded-for": "203.0.113.9"},
        {"forwarded": "for=203.0.113.9"},
        {"host": "attacker.example"},
        {"origin": "http://attacker.example"},
    ):
        response = httpx.get(f"{url}/metrics", headers=headers, timeout=10)
        assert response.status_code == 403, (headers, response.text)
        assert "listen.metrics" in response.json()["error"]["message"]
        assert "owngate_" not in response.text


def _scope(client: tuple[str, int], headers: dict[str, str]) -> dict[str, Any]:
    encoded = [(k.encode(), v.encode()) for k, v in headers.items()]
    return {"type": "http", "method": "GET", "client": client, "headers": encoded}


@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": f"Bearer {TENANT_KEY}"}, {"authorization": "Bearer operator"}],
)
@pytest.mark.parametrize("client", [("203.0.113.9", 40000), ("2001:db8::9", 40000)])
def test_with_no_admin_access_a_remote_peer_is_refused_naming_the_setting(
    client: tuple[str, int], headers: dict[str, str]
) -> None:
    """A client that is not on a loopback address, whatever it sends, is 403 naming
    `listen.metrics` when no admin access is configured; a loopback peer, IPv6 too, is
    let in."""
    with pytest.raises(GatewayError) as caught:
        authorize_metrics(_scope(client, headers), AdminSettings())
    assert caught.value.status == 403
    assert "listen.metrics" in str(caught.value)
    authorize_metrics(_scope(("::1", 40000), {}), AdminSettings())  # does not raise


@pytest.mark.parametrize("role", ["auditor", "security"])
@pytest.mark.parametrize(
    "headers", [{}, {"host": "127.0.0.1:8080"}, {"authorization": f"Bearer {TENANT_KEY}"}]
)
def test_admin_tokens_of_other_roles_only_admit_no_loopback_client(
    role: Literal["auditor", "security"], headers: dict[str, str]
) -> None:
    """With admin tokens configured, none of which reads /metrics (an `auditor` or
    `security` token for the admin API), a loopback client, a tenant's key holder among
    them, reads nothing: a configured token means the source address admits no one
    (behind a mesh sidecar every client connects from 127.0.0.6). 403 naming
    `listen.metrics`. Before, the loopback door stayed open and every tenant behind a
    sidecar read every tenant's policy ids and counts."""
    settings = AdminSettings(tokens=(AdminTokenSettings(hash=hash_api_key(role), role=role),))
    for client in (("127.0.0.1", 40000), ("127.0.0.6", 40000), ("::1", 40000)):
        with pytest.raises(GatewayError) as caught:
            authorize_metrics(_scope(client, headers), settings)
        assert caught.value.status == 403, client
        assert "listen.metrics" in str(caught.value)
        assert "operator" in str(caught.value)


@pytest.mark.parametrize("peer", ["::ffff:127.0.0.1", "::ffff:127.0.0.5"])
def test_an_ipv4_loopback_client_of_a_dual_stack_listener_is_a_loopback_client(
    peer: str,
) -> None:
    """A listener on `::` sees an IPv4 client of 127.0.0.1 as `::ffff:127.0.0.1`: a
    loopback peer (Python 3.11's `is_loopback` says no to it), so with no admin access
    configured it reads /metrics; an IPv4-mapped address that is not loopback does not."""
    authorize_metrics(_scope((peer, 40000), {"host": "127.0.0.1:8080"}), AdminSettings())
    authorize_metrics(_scope((peer, 40000), {"host": "[::ffff:127.0.0.1]:8080"}), AdminSettings())
    with pytest.raises(GatewayError) as caught:
        authorize_metrics(_scope(("::ffff:203.0.113.9", 40000), {}), AdminSettings())
    assert caught.value.status == 403


def test_a_dual_stack_listener_answers_its_ipv4_loopback_client(
    start_sim: Callable[..., Sim],
) -> None:
    """Over real sockets: `listen.host: "::"` (dual stack), no admin access configured; a
    curl of http://127.0.0.1:PORT/metrics is a loopback client and reads the metrics
    (before: 403 saying /metrics answers loopback clients only, which it was)."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    config = _plain_config(sim, {})
    try:
        server = ServerThread(create_app(config, environ={}), host="::").start()
    except OSError as exc:  # a host without IPv6
        pytest.skip(f"no dual-stack listener here: {exc}")
    try:
        for url in (f"http://127.0.0.1:{server.port}", f"http://[::1]:{server.port}"):
            response = httpx.get(f"{url}/metrics", timeout=10)
            assert response.status_code == 200, (url, response.text)
            assert "owngate_requests_total" in response.text
    finally:
        server.stop()


def test_a_forwarded_loopback_request_is_no_loopback_client_under_allow_loopback() -> None:
    """`admin.allow_loopback` admits a loopback peer to /metrics without a token, but not
    one that names a client in a forwarding header (a proxy on this host sent it) nor one
    a web page of another origin sent: 401, as `/admin/status`."""
    settings = AdminSettings(allow_loopback=True)
    authorize_metrics(_scope(("127.0.0.1", 40000), {"host": "127.0.0.1:8080"}), settings)
    for headers in (
        {"x-forwarded-for": "203.0.113.9"},
        {"x-real-ip": "203.0.113.9"},
        {"host": "rebound.attacker.example"},
        {"sec-fetch-site": "cross-site"},
    ):
        with pytest.raises(GatewayError) as caught:
            authorize_metrics(_scope(("127.0.0.1", 40000), headers), settings)
        assert caught.value.status in (401, 403), headers


def test_admin_answers_on_the_public_listener_are_never_stored_or_sniffed(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    """`/metrics` under `listen.metrics: admin` and `/admin/status` answer an admin token
    on the public listener, the one apps, proxies and caches in front of the gateway see:
    each says `Cache-Control: no-store` and `X-Content-Type-Options: nosniff`, as every
    answer of the admin listener does (docs/admin-api.md). Without them a cache (a
    browser's, a proxy's heuristic freshness) could keep what names each tenant's policy,
    data classes and backends, and show it to the next caller of the same URL."""
    gateway = _gateway(start_sim, start_gateway, tmp_path, "admin")
    for path in ("/metrics", "/admin/status"):
        for method in ("GET", "HEAD"):
            if (path, method) == ("/admin/status", "HEAD"):
                continue  # GET only (405 otherwise)
            response = httpx.request(method, f"{gateway.url}{path}", headers=ADMIN_HEADERS)
            assert response.status_code == 200, (path, method, response.text)
            assert response.headers.get("cache-control") == "no-store", (path, method)
            assert response.headers.get("x-content-type-options") == "nosniff", (path, method)
