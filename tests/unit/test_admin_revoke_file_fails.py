"""DELETE /admin/v1/keys/{digest} when the keys file's rename fails AFTER the admin record
was written and the key revoked in the state (the change was staged beside the file, so
every check before passed: a keys file bind-mounted on its own, say, is EBUSY to rename).

Found by review: the answer was the 503 "the keys file could not be changed, and nothing
was" while this replica already refused the key and the signed record said "done". The
answer now says what happened: revoked here (and whether in the shared state), the file
still lists the key, a retry removes it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from gateway.app import create_app
from gateway.config import load_config
from gateway.keys_file import read_keys_file, stage_keys_file
from gateway.tenants import hash_api_key
from tests.helpers.admin_revoke import record_outcomes, revoke
from tests.helpers.gateways import backend

TOKEN = "og-admin-revoke-file-token"
KEY = "og-revoke-file-key"


@pytest.mark.parametrize("redis_fails", [False, True])
def test_a_keys_file_rename_failing_after_the_revocation_is_answered_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_fails: bool
) -> None:
    keys = tmp_path / "keys.yaml"
    stage_keys_file(keys, {"acme": [hash_api_key(KEY)]}).replace(keys)
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "keys_file": "keys.yaml",
        "tenants": [{"id": "acme", "models": ["*"]}],
        "admin": {"token_hashes": ["sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()]},
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    gateway = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    state = gateway.state
    aside = tmp_path / "keys.aside"
    broken: list[bool] = []

    async def revoke_then_break_the_file(key_hash: str, *, share: bool = True) -> bool:
        shared = await type(state).revoke_key(state, key_hash, share=share)
        if not broken:  # the first call only: the file becomes a directory to rename onto
            broken.append(True)
            keys.replace(aside)
            keys.mkdir()
            (keys / "x").write_text("x")
            return shared and not redis_fails  # Redis failing during this call, or not
        return shared

    monkeypatch.setattr(state, "revoke_key", revoke_then_break_the_file)
    outcomes = record_outcomes(monkeypatch)

    answer = revoke(gateway, KEY, TOKEN)
    assert answer.status_code == 503, answer.text
    message = answer.json()["error"]["message"]
    assert "nothing was" not in message, message  # it was: the key is refused here
    assert "revoked on this replica" in message and "still lists" in message, message
    assert state.is_revoked(hash_api_key(KEY))
    assert ("not yet in the shared state" in message) is redis_fails, message
    first = ["done", "local"] if redis_fails else ["done"]
    assert outcomes == first  # the revocation the records name was taken

    (keys / "x").unlink()
    keys.rmdir()
    aside.replace(keys)
    again = revoke(gateway, KEY, TOKEN)  # the retry the answer asks for: the file loses it
    assert again.status_code == 200, again.text
    assert read_keys_file(keys) == {"acme": []}
    assert outcomes == [*first, "done"]
