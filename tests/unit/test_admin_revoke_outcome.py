"""DELETE /admin/v1/keys/{digest} when Redis fails during the revocation itself (it was
healthy when the admin record was written, which therefore said "done"): the answer is
the 202 `propagated: false`, and a second admin record says "local", so the signed log
ends on what happened. (Redis seen down before the call: tests/integration/
test_admin_revoke_redis.py, on a real redis-server.)"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gateway.app import create_app
from gateway.config import GatewaySettings
from gateway.tenants import hash_api_key
from tests.helpers.admin_revoke import record_outcomes, revoke
from tests.helpers.gateways import backend

TOKEN = "og-admin-revoke-outcome-token"
KEY = "og-revoke-outcome-key"


def test_redis_failing_during_the_revocation_is_answered_and_recorded_local(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
        "admin": {"token_hashes": ["sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()]},
    }
    gateway = create_app(GatewaySettings.model_validate(config), config_dir=tmp_path)
    state = gateway.state
    assert state.healthy  # as Redis was when the record was written
    shares: list[bool] = []

    async def failing(key_hash: str, *, share: bool = True) -> bool:
        shares.append(share)
        await type(state).revoke_key(state, key_hash, share=share)
        return False  # what RedisState answers when the call to Redis fails

    monkeypatch.setattr(state, "revoke_key", failing)
    outcomes = record_outcomes(monkeypatch)

    answer = revoke(gateway, KEY, TOKEN)
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert body["propagated"] is False and "revoked on this replica" in body["detail"]
    assert shares == [True] and outcomes == ["done", "local"]
    assert body["log_index"] == 2  # the record that says what happened
    assert state.is_revoked(hash_api_key(KEY))
