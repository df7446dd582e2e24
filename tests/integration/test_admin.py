"""The admin surface is for admins: a token, or loopback only where the config opts in.

`/readyz` tells anyone only whether the gateway is ready; which backends exist, their
load and breakers, the policy digest and the shared state are on `/admin/status`, which
answers a client with the admin token (`admin.token_hashes`) or, with
`admin.allow_loopback` (the demo), a loopback client. A source address in 127.0.0.0/8
is not enough by default: a service-mesh sidecar forwards every client from 127.0.0.6.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from gateway.api.admin import authorize
from gateway.config import GatewaySettings
from gateway.config.schema import AdminSettings
from gateway.demo import demo_config
from gateway.demo.attested import PRIVATE, Sidecar
from gateway.errors import GatewayError
from gateway.provenance import generate_signing_key
from gateway.tenants import hash_api_key
from tests.helpers.gateways import ADMIN_HEADERS, ADMIN_TOKEN, TENANT_KEY, Gateway, Sim, backend

SIDECAR = "127.0.0.6"  # where Istio's sidecar (and others) connect from


@pytest.fixture
def start(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> Callable[..., Gateway]:
    def make(**admin: Any) -> Gateway:
        sim = start_sim("vllm", models=("m",), zero_latency=True)
        return start_gateway([backend("gpu-secret-name", sim.url, "m")], admin=admin)

    return make


@pytest.fixture
def sidecar() -> Iterator[httpx.Client]:
    """A client whose connections come from 127.0.0.6, as a mesh sidecar's do."""
    with httpx.Client(transport=httpx.HTTPTransport(local_address=SIDECAR), timeout=10) as c:
        yield c


def test_readyz_tells_anyone_only_the_status(start: Callable[..., Gateway]) -> None:
    gateway = start(token_hashes=[hash_api_key(ADMIN_TOKEN)])
    for headers in ({}, ADMIN_HEADERS):
        response = httpx.get(f"{gateway.url}/readyz", headers=headers, timeout=10)
        assert response.status_code == 200
        assert response.json() == {"status": "ready"}
        assert b"gpu-secret-name" not in response.content
    # The detail went to the admin surface.
    report = httpx.get(f"{gateway.url}/admin/status", headers=ADMIN_HEADERS, timeout=10).json()
    detail = report["readiness"]
    assert detail["status"] == "ready"
    assert list(detail["backends"]) == ["gpu-secret-name"]
    assert {"policy", "provenance", "state", "draining"} <= set(detail)


def test_a_sidecar_address_is_not_an_admin(
    start: Callable[..., Gateway], sidecar: httpx.Client
) -> None:
    gateway = start(token_hashes=[hash_api_key(ADMIN_TOKEN)])
    url = f"{gateway.url}/admin/status"
    anonymous = sidecar.get(url)
    assert anonymous.status_code == 401, anonymous.text
    assert anonymous.json()["error"]["code"] == "missing_api_key"
    assert b"gpu-secret-name" not in anonymous.content
    for wrong in ("og-admin-wrong", TENANT_KEY, ADMIN_TOKEN + "x"):
        refused = sidecar.get(url, headers={"authorization": f"Bearer {wrong}"})
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"
    admitted = sidecar.get(url, headers=ADMIN_HEADERS)
    assert admitted.status_code == 200
    assert [b["id"] for b in admitted.json()["backends"]] == ["gpu-secret-name"]


def test_without_admin_config_the_surface_is_off(
    start: Callable[..., Gateway], sidecar: httpx.Client
) -> None:
    gateway = start()
    url = f"{gateway.url}/admin/status"
    for answer in (httpx.get(url, timeout=10), sidecar.get(url)):
        assert answer.status_code == 403
        assert answer.json()["error"]["code"] == "permission_denied"
        assert "admin.token_hashes" in answer.json()["error"]["message"]


def test_loopback_is_an_explicit_opt_in(start: Callable[..., Gateway]) -> None:
    gateway = start(allow_loopback=True)
    report = httpx.get(f"{gateway.url}/admin/status", timeout=10)
    assert report.status_code == 200
    assert report.json()["readiness"]["status"] == "ready"
    # A token that is sent must still be right.
    wrong = httpx.get(f"{gateway.url}/admin/status", headers=ADMIN_HEADERS, timeout=10)
    assert wrong.status_code == 401


def test_the_demo_opts_in_to_loopback(tmp_path: Path) -> None:
    pin = "sha256//" + "A" * 43 + "="
    sidecars = {  # each sidecar its own key (one key for two backends is refused)
        backend: Sidecar(
            backend,
            "https://127.0.0.1:9",
            backend,
            pin,
            generate_signing_key(f"owngate-demo.internal/{backend}")[1],
            tmp_path,
        )
        for backend in PRIVATE
    }
    hashes = (hash_api_key("og-a"), hash_api_key("og-b"))
    roles = {"operator": "c", "security": "d", "auditor": "e"}
    config = demo_config(
        "http://127.0.0.1:9",
        sidecars,
        hashes,
        tmp_path,
        admin_port=0,
        admin_hashes={role: "sha256:" + digit * 64 for role, digit in roles.items()},
    )
    assert config.admin.allow_loopback is True
    assert config.admin.token_hashes == ()
    assert config.admin.listen is not None and config.admin.listen.port == 0
    assert {(t.role, t.hash[7]) for t in config.admin.tokens} == set(roles.items())


@pytest.mark.parametrize(
    ("client", "headers", "settings", "status"),
    [
        (("10.0.0.7", 1), (), AdminSettings(allow_loopback=True), 403),  # not loopback, no token
        (("10.0.0.7", 1), ADMIN_HEADERS, AdminSettings(allow_loopback=True), 401),  # not its token
        (("127.0.0.1", 1), (), AdminSettings(), 403),  # nothing configured: off
        (("10.0.0.7", 1), {"authorization": f"Basic {ADMIN_TOKEN}"}, AdminSettings(), 401),
        (("10.0.0.7", 1), {"authorization": "Bearer "}, AdminSettings(), 401),
    ],
)
def test_authorize_refuses(
    client: tuple[str, int], headers: Any, settings: AdminSettings, status: int
) -> None:
    scope = {"type": "http", "client": client, "headers": _headers(headers)}
    with pytest.raises(GatewayError) as caught:
        authorize(scope, settings)
    assert caught.value.status == status


def test_authorize_admits_any_of_several_tokens_for_a_rotation() -> None:
    settings = AdminSettings(token_hashes=(hash_api_key("og-admin-old"), hash_api_key(ADMIN_TOKEN)))
    for token in ("og-admin-old", ADMIN_TOKEN):
        scope = {
            "type": "http",
            "client": ("10.0.0.7", 1),
            "headers": _headers({"authorization": f"Bearer {token}"}),
        }
        authorize(scope, settings)  # does not raise


def test_admin_token_hashes_are_digests_never_tokens() -> None:
    base = {"backends": [backend("gpu", "http://127.0.0.1:9", "m")]}
    with pytest.raises(ValidationError, match="never raw tokens"):
        GatewaySettings.model_validate({**base, "admin": {"token_hashes": [ADMIN_TOKEN]}})
    with pytest.raises(ValidationError):
        GatewaySettings.model_validate({**base, "admin": {"token_list": ["x"]}})  # unknown key
    with pytest.raises(ValidationError, match="never a raw token"):  # the admin API's tokens
        GatewaySettings.model_validate(
            {**base, "admin": {"tokens": [{"hash": ADMIN_TOKEN, "role": "operator"}]}}
        )
    digest = "sha256:" + "0" * 64
    with pytest.raises(ValidationError):  # no such role
        GatewaySettings.model_validate(
            {**base, "admin": {"tokens": [{"hash": digest, "role": "root"}]}}
        )


def _headers(headers: Any) -> list[tuple[bytes, bytes]]:
    return [(k.encode(), v.encode()) for k, v in dict(headers).items()]


def test_keys_new_admin_prints_a_token_and_its_digest(capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli.main import main

    assert main(["keys", "new", "--admin"]) == 0
    out, err = capsys.readouterr()
    token = out.strip()
    assert token.startswith("og-admin-") and len(token) > 40
    assert f"admin token digest: {hash_api_key(token)}" in err
    assert token not in err


def test_owngate_status_says_when_the_gateway_is_not_ready() -> None:
    from gateway.cli.status import format_table

    assert "gateway:" not in format_table({"backends": [], "readiness": {"status": "ready"}})
    draining = {"backends": [], "readiness": {"status": "not ready", "draining": True}}
    assert format_table(draining).endswith("gateway: not ready (draining)")


def test_several_authorization_headers_are_refused_even_with_a_valid_first() -> None:
    # The first copy used to decide; a proxy in front may have read (or added) another.
    settings = AdminSettings(token_hashes=(hash_api_key(ADMIN_TOKEN),))
    good = (b"authorization", f"Bearer {ADMIN_TOKEN}".encode())
    scope = {
        "type": "http",
        "client": ("10.0.0.7", 1),
        "headers": [good, (b"authorization", b"Bearer og-other")],
    }
    with pytest.raises(GatewayError) as caught:
        authorize(scope, settings)
    assert caught.value.status == 401
