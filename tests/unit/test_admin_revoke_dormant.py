"""DELETE /admin/v1/keys/{digest} of a digest the keys file lists for a tenant gateway.yaml
no longer has (taken out of it to cut it off: its digests authenticate no one, with a
warning, gateway/config/tenant_keys.py).

Found by review: the admin API looked the digest up in the running config's tenants only,
so it answered 404 "no tenant has this key" and left the digest in the keys file; a tenant
added again by that id (the same customer back, or another given the freed id) was
given the old keys back, a leaked one included, and the security role had no way to
revoke it through the API. It is now revoked as any key is: taken out of the keys file,
refused in the state, recorded under the tenant the file named."""

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

TOKEN = "og-admin-revoke-dormant-token"
KEY = "og-revoke-dormant-acme-key"
GONE = "og-revoke-dormant-key-of-beta"


def test_a_key_of_a_tenant_taken_out_of_the_config_is_revoked_and_stays_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = tmp_path / "keys.yaml"
    stored = {"acme": [hash_api_key(KEY)], "beta": [hash_api_key(GONE)]}
    stage_keys_file(keys, stored).replace(keys)
    tenants: list[dict[str, object]] = [{"id": "acme", "models": ["*"]}]  # beta taken out
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "keys_file": "keys.yaml",
        "tenants": tenants,
        "admin": {"token_hashes": ["sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()]},
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    gateway = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    outcomes = record_outcomes(monkeypatch)

    answer = revoke(gateway, GONE, TOKEN)
    assert answer.status_code == 200, answer.text
    assert outcomes == ["done"]
    assert read_keys_file(keys) == {"acme": [hash_api_key(KEY)], "beta": []}
    assert gateway.state.is_revoked(hash_api_key(GONE))
    # beta added again: the digest the revocation took out is not given back to it
    tenants.append({"id": "beta", "models": ["*"]})
    path.write_text(yaml.safe_dump(config))
    held = {t.id: t.api_key_hashes for t in load_config(path).tenants}
    assert held == {"acme": (hash_api_key(KEY),), "beta": ()}
    # a digest no tenant and no keys file entry has is still 404
    assert revoke(gateway, "og-never-made", TOKEN).status_code == 404
