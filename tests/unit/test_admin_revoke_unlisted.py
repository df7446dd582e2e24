"""DELETE /admin/v1/keys/{digest} when this host's revoked keys list cannot take the
revocation (it holds its 200,000 digests already; it cannot be written): the
key is refused here, but a process started on this host while Redis is down would accept
it again (gateway.yaml, or a rolled-back keys file, still lists it). Before, the answer
was 200 as for a revocation the list holds, and only one log line said otherwise; now it
is 202 `listed: false` naming the list, and the state's status counts it."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.app import create_app
from gateway.config import GatewaySettings
from gateway.state.revocation_list import MAX_DIGESTS, read_revocations, render_revocations
from gateway.tenants import hash_api_key
from tests.helpers.admin_revoke import record_outcomes, revoke
from tests.helpers.gateways import backend

TOKEN = "og-admin-revoke-unlisted-token"
KEY = "og-revoke-unlisted-key"


def full_list(directory: Path) -> None:
    path = directory / "revoked-keys"
    path.write_bytes(render_revocations(f"sha256:{n:064x}" for n in range(MAX_DIGESTS)))


def unwritable_directory(directory: Path) -> None:
    (directory / "revoked-keys").mkdir()  # the list's place: no file can be renamed there


@pytest.mark.parametrize("prepare", [full_list, unwritable_directory])
def test_a_revocation_the_hosts_list_cannot_take_is_answered_202(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prepare: Callable[[Path], None]
) -> None:
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
        "admin": {"token_hashes": ["sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()]},
    }
    gateway = create_app(GatewaySettings.model_validate(config), config_dir=tmp_path)
    prepare(tmp_path)  # after the start: the list read then was absent, or held 200,000
    record_outcomes(monkeypatch)

    answer = revoke(gateway, KEY, TOKEN)
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert body["listed"] is False and body["propagated"] is True
    assert "revoked keys list" in body["detail"] and "restart" in body["detail"]
    assert gateway.state.is_revoked(hash_api_key(KEY))  # refused here all the same
    status = gateway.state.status()
    assert status.unlisted_revocations == 1
    assert status.detail()["unlisted_revocations"] == 1


def test_a_listed_revocation_is_answered_200(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
        "admin": {"token_hashes": ["sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()]},
    }
    gateway = create_app(GatewaySettings.model_validate(config), config_dir=tmp_path)
    record_outcomes(monkeypatch)

    answer = revoke(gateway, KEY, TOKEN)
    assert answer.status_code == 200, answer.text
    assert answer.json()["listed"] is True and answer.json()["detail"] is None
    assert read_revocations(tmp_path / "revoked-keys") == {hash_api_key(KEY)}
    assert gateway.state.status().unlisted_revocations == 0
