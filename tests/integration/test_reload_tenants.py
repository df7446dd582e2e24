"""A gateway.yaml reload binds the tenant of a request whose body was still arriving.

The head (with the API key) is read, authenticated and admitted before the body; a body
may take `listen.body_timeout_s` to come. The decision and the plan are made with the
config active once the body is in (tests/integration/test_config_reload.py), and so is the
tenant: a key the reload removed, a model it took from the tenant, is refused, not served
by the config that was active at the head.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.api import tenant_auth
from gateway.app import create_app
from gateway.asgi import header_values
from gateway.config import load_config
from gateway.serving import ServerThread
from gateway.tenants import hash_api_key
from tests.helpers.gateways import TENANT_KEY, Sim, backend, gateway_config
from tests.helpers.waiting import until

ACME = {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["*"]}
OTHER_KEY_HASH = hash_api_key("og-test-a-new-key-for-acme-0123")


def write_config(path: Path, url: str, tenants: list[dict[str, Any]], **extra: Any) -> None:
    config = gateway_config([backend("gpu", url, "m", "n")], tenants=tenants, **extra).model_dump(
        mode="json", exclude_none=True
    )
    path.with_suffix(".tmp").write_text(yaml.safe_dump(config))
    path.with_suffix(".tmp").replace(path)  # atomic, as a deploy tool would write it


def across(app: Any, server: ServerThread, change: Callable[[], None]) -> tuple[int, str]:
    """Send a chat request whose head is read (authenticated, admitted) before `change`
    runs and whose body completes after it; the status and error code it gets."""
    body = json.dumps(
        {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"
        f"authorization: Bearer {TENANT_KEY}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((server.host, server.port), timeout=30) as sock:
        sock.sendall(head + body[:10])
        # Authenticated and admitted: its body is being read (the declared length is
        # reserved in the body budget once the head passed).
        until(lambda: app.bodies.held > 0, "the head read and authenticated")
        change()
        sock.sendall(body[10:])
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head_bytes, _, payload = answer.partition(b"\r\n\r\n")
    status = int(head_bytes.split(b" ", 2)[1])
    error = json.loads(payload).get("error") if status >= 400 else None
    return status, "" if error is None else error["code"]


@pytest.mark.parametrize(
    ("after", "code"),
    [
        # The key was rotated out (leaked, say): its request must not be served.
        ([{**ACME, "api_key_hashes": [OTHER_KEY_HASH]}], (401, "invalid_api_key")),
        # The tenant may no longer use `m`.
        ([{**ACME, "models": ["n"]}], (404, "model_not_found")),
        # The key is another tenant's now: the rate limits admitted it as acme's.
        (
            [{**ACME, "api_key_hashes": [OTHER_KEY_HASH]}, {**ACME, "id": "beta"}],
            (401, "invalid_api_key"),
        ),
    ],
    ids=["key-removed", "model-taken-away", "key-moved"],
)
def test_a_reload_while_the_body_arrives_binds_the_requests_tenant(
    start_sim: Callable[..., Sim],
    tmp_path: Path,
    after: list[dict[str, Any]],
    code: tuple[int, str],
) -> None:
    sim = start_sim("vllm", models=("m", "n"), zero_latency=True)
    path = tmp_path / "gateway.yaml"
    write_config(path, sim.url, [ACME])
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    server = ServerThread(app).start()

    def reload() -> None:
        arrival = app.parts
        write_config(path, sim.url, after)
        until(lambda: app.parts is not arrival, "the reload", timeout=30.0)

    try:
        assert across(app, server, reload) == code
    finally:
        server.stop()
    assert sim.app.captured("/v1/chat/completions") == []


def test_a_key_revoked_while_the_body_arrives_is_refused(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=("m", "n"), zero_latency=True)
    app = create_app(gateway_config([backend("gpu", sim.url, "m")]), environ={})
    server = ServerThread(app).start()

    def revoke() -> None:  # `owngate keys revoke` / the admin API: the state's set
        assert asyncio.run(app.parts.state.revoke_key(hash_api_key(TENANT_KEY)))

    try:
        assert across(app, server, revoke) == (401, "invalid_api_key")
    finally:
        server.stop()
    assert sim.app.captured("/v1/chat/completions") == []


def test_the_key_is_read_and_hashed_once_looked_up_twice(
    start_sim: Callable[..., Sim], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Hot path: the check once the body is in looks the head's key digest up again (the
    # tests above), without parsing the header and hashing the key a second time.
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    app = create_app(gateway_config([backend("gpu", sim.url, "m")]), environ={})
    read: list[bytes] = []
    looked_up: list[str] = []
    is_revoked = app.parts.state.is_revoked

    def reading(scope: Any, name: bytes) -> list[bytes]:
        read.extend([name] if name == b"authorization" else [])
        return header_values(scope, name)

    def looking_up(digest: str) -> bool:
        looked_up.append(digest)
        return is_revoked(digest)

    monkeypatch.setattr(tenant_auth, "header_values", reading)
    monkeypatch.setattr(app.parts.state, "is_revoked", looking_up)
    server = ServerThread(app).start()
    try:
        assert across(app, server, lambda: None) == (200, "")
    finally:
        server.stop()
    assert read == [b"authorization"]
    assert looked_up == [hash_api_key(TENANT_KEY)] * 2


def test_a_tenant_taken_out_of_the_config_loses_the_keys_its_keys_file_still_lists(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    """An operator cuts a tenant off by taking it out of gateway.yaml; its digests are
    still in the keys file (`owngate keys new` put them there). The keys file listing a
    tenant the config does not have was an error: the reload failed, the running config
    was kept, and the tenant taken out kept being served with its keys (the next start
    failed). Now its digests authenticate no one (a warning says so) and the reload
    takes effect: its key is 401, the other tenant's still served."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    path = tmp_path / "gateway.yaml"
    beta_key = "og-test-beta-key-from-the-keys-file-0123"
    keys = {"tenants": {"beta": [hash_api_key(beta_key)]}}
    (tmp_path / "keys.yaml").write_text(yaml.safe_dump(keys))
    beta = {"id": "beta", "models": ["*"]}
    write_config(path, sim.url, [ACME, beta], keys_file="keys.yaml")
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    server = ServerThread(app).start()
    url = f"http://{server.host}:{server.port}/v1/chat/completions"
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}

    def status(key: str) -> int:
        headers = {"authorization": f"Bearer {key}"}
        return httpx.post(url, json=body, headers=headers, timeout=30).status_code

    try:
        assert status(beta_key) == 200
        arrival = app.parts
        write_config(path, sim.url, [ACME], keys_file="keys.yaml")
        reloader = app.reloader
        assert reloader is not None
        until(lambda: app.parts is not arrival or reloader.reload_failures > 0, "the reload")
        assert (status(beta_key), status(TENANT_KEY)) == (401, 200), reloader.last_error
        assert reloader.last_error is None
    finally:
        server.stop()


def test_a_model_taken_off_its_backend_is_no_longer_served_though_a_tenant_lists_it(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    """An operator stops serving model `n` by taking it off the backend's `models`; tenant
    `acme` still lists it under `models:`. A tenant listing a model no backend serves was
    a config error: the reload failed, the running config was kept, and `n` went on
    being served (and the next start failed). Now the name is refused as any unknown
    model is (a warning names it) and the reload takes effect."""
    sim = start_sim("vllm", models=("m", "n"), zero_latency=True)
    path = tmp_path / "gateway.yaml"
    tenant = {**ACME, "models": ["m", "n"]}
    write_config(path, sim.url, [tenant])
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    server = ServerThread(app).start()
    url = f"http://{server.host}:{server.port}/v1/chat/completions"

    def status(model: str) -> int:
        body = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
        headers = {"authorization": f"Bearer {TENANT_KEY}"}
        return httpx.post(url, json=body, headers=headers, timeout=30).status_code

    try:
        assert (status("m"), status("n")) == (200, 200)
        arrival = app.parts
        narrowed = yaml.safe_load(path.read_text())
        narrowed["backends"][0]["models"] = [{"name": "m"}]  # `n` taken off; acme lists it
        path.with_suffix(".tmp").write_text(yaml.safe_dump(narrowed))
        path.with_suffix(".tmp").replace(path)
        reloader = app.reloader
        assert reloader is not None
        until(lambda: app.parts is not arrival or reloader.reload_failures > 0, "the reload")
        assert reloader.last_error is None
        assert (status("m"), status("n")) == (200, 404)
    finally:
        server.stop()
