"""The keys file (tenants' API key digests): each rewrite by `owngate keys new` or
`keys revoke` keeps the file's mode, so a gateway running as another user (the image's
uid 10001) can still read it after a new key or a revocation; a keys file that cannot be
read, is huge or is not text is a config error naming it, never a crash or its bytes."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml

from gateway.cli.main import main
from gateway.config.loader import ConfigError, load_config
from gateway.tenants import add_key_hash, hash_api_key, read_keys_file, remove_key_hash
from tests.helpers.gateways import backend


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


def _config(tmp_path: Path, keys_file: str) -> Path:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
                "tenants": [{"id": "team", "models": ["*"]}],
                "keys_file": keys_file,
            }
        )
    )
    return config


def test_a_keys_file_that_cannot_be_read_is_a_config_error(tmp_path: Path) -> None:
    """A ConfigError, not a bare OSError: the reloader keeps the running config on one,
    while an OSError ended its watch task (no later change was ever picked up)."""
    (tmp_path / "keys.yaml").mkdir()  # unreadable as a file, even for root
    with pytest.raises(ConfigError, match=r"keys\.yaml:.*not a regular file"):
        load_config(_config(tmp_path, "keys.yaml"))


def test_a_huge_keys_file_is_refused_unread(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    with keys.open("wb") as handle:
        handle.truncate(64 * 1024 * 1024)  # sparse: no disk used
    with pytest.raises(ConfigError, match="larger than"):
        load_config(_config(tmp_path, "keys.yaml"))


def test_a_keys_file_that_is_not_text_is_refused_without_its_bytes(tmp_path: Path) -> None:
    (tmp_path / "keys.yaml").write_bytes(b"tenants: {team: [\xc3\x28]}\n")
    with pytest.raises(ConfigError) as info:
        load_config(_config(tmp_path, "keys.yaml"))
    assert "not UTF-8 text" in str(info.value)
    assert "0xc3" not in str(info.value)


@pytest.mark.parametrize(
    ("tenants", "expected"),
    [({"\x1b[2J\rteam": []}, "\\x1b[2J\\x0dteam"), ({"team\u202e": "x"}, "team\\u202e")],
)
def test_the_cli_prints_a_keys_file_problem_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tenants: dict[str, object], expected: str
) -> None:
    """A tenant named in the keys file (unknown to the config, or with no list of digests)
    is quoted in the config error, which `owngate keys` prints escaped (`shown`)."""
    (tmp_path / "keys.yaml").write_text(yaml.safe_dump({"tenants": tenants}))
    config = str(_config(tmp_path, "keys.yaml"))
    assert main(["keys", "revoke", hash_api_key("og-one"), "--config", config]) == 1
    err = capsys.readouterr().err
    assert "keys.yaml" in err
    assert [c for line in err.split("\n") for c in line if not c.isprintable()] == []
    assert expected in err
