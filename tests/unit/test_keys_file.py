"""The keys file `owngate keys new` and `keys revoke` rewrite: each rewrite keeps the
file's mode, so a gateway running as another user (the image's uid 10001) can still read
the file after a new key, or a revocation, is written."""

from __future__ import annotations

import stat
from pathlib import Path

from gateway.tenants import add_key_hash, hash_api_key, read_keys_file, remove_key_hash


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_keys_file_is_private(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    add_key_hash(keys, "team", hash_api_key("og-one"))
    assert _mode(keys) == 0o600


def test_rewriting_the_keys_file_keeps_its_mode(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    add_key_hash(keys, "team", hash_api_key("og-one"))
    keys.chmod(0o644)  # as docs/deploy.md has the operator do, once
    add_key_hash(keys, "team", hash_api_key("og-two"))
    assert _mode(keys) == 0o644
    assert remove_key_hash(keys, hash_api_key("og-one")) == "team"
    assert _mode(keys) == 0o644  # a revocation the running gateway can still read
    assert read_keys_file(keys) == {"team": [hash_api_key("og-two")]}
    assert [p.name for p in tmp_path.iterdir()] == ["keys.yaml"]  # no temporary left
