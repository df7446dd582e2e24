"""The keys file (tenants' API key digests): each rewrite by `owngate keys new` or
`keys revoke` keeps the file's mode, so a gateway running as another user (the image's
uid 10001) can still read it after a new key or a revocation, and change it after root
did (the lock is the directory: no lock file of root's it could not open); a keys file
that cannot be read, is huge or is not text is a config error naming it, never a crash
or its bytes; two changes at once (the admin API's key endpoints, `owngate keys` beside
it) never undo one another."""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
import yaml

from gateway import keys_file
from gateway.admin.key_changes import KeysChange
from gateway.cli.main import main
from gateway.config import ConfigError, load_config
from gateway.tenants import add_key_hash, hash_api_key, read_keys_file, remove_key_hash
from tests.helpers.gateways import backend
from tests.helpers.log_capture import rendered_logs

NOBODY = 65534  # the gateway's user, where root runs `owngate keys`


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
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["keys.yaml"]  # no temporary left, and no lock file (the lock is the dir)


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


def test_a_revocation_during_another_change_is_never_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key created (admin API, `owngate keys new`) while a revocation runs: without one
    lock over each read-change-write, both read the file holding the revoked digest and
    the creation's rename writes it back, so the revoked key works again once the
    gateway restarts (the shared state's revocation is in memory with `state: memory`)."""
    keys = tmp_path / "keys.yaml"
    revoked, created = hash_api_key("og-revoked"), hash_api_key("og-created")
    add_key_hash(keys, "team", revoked)
    read = keys_file.read_keys_file
    revocation = threading.Thread(target=remove_key_hash, args=(keys, revoked))
    held: list[bool] = []

    def reading(path: Path) -> dict[str, list[str]]:
        stored = read(path)
        if not held:  # the creation, between its read and its write
            probe = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)  # the lock: the directory
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(False)  # anyone else may change the file now
            except BlockingIOError:
                held.append(True)
            finally:
                os.close(probe)
            revocation.start()  # waits for the lock, or reads the same file
        return stored

    monkeypatch.setattr(keys_file, "read_keys_file", reading)
    add_key_hash(keys, "team", created)
    revocation.join(timeout=30)
    assert not revocation.is_alive()
    assert held == [True], "the keys file was changed without holding its lock"
    assert read_keys_file(keys) == {"team": [created]}


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


@pytest.mark.parametrize("br", ["\u2028", "\x85", "\r"])
def test_a_keys_file_with_a_line_break_only_yaml_sees_is_a_config_error(
    tmp_path: Path, br: str
) -> None:
    """YAML breaks lines at NEL, U+2028 and a lone CR; a diff shows one line. A second
    digest after one, inside what a review shows as a comment, let a key nobody saw in."""
    seen, unseen = hash_api_key("og-laptop"), hash_api_key("og-unseen")
    (tmp_path / "keys.yaml").write_bytes(
        f"tenants:\n  team:\n    - {seen}  # laptop, rotated 2025-06{br}    - {unseen}\n".encode()
    )
    with pytest.raises(ConfigError, match=r"keys\.yaml:3:.*YAML reads a line break there"):
        load_config(_config(tmp_path, "keys.yaml"))


@pytest.mark.parametrize(
    ("tenants", "expected"),
    [({"\x1b[2J\rteam": "x"}, "\\x1b[2J\\x0dteam"), ({"team\u202e": "x"}, "team\\u202e")],
)
def test_the_cli_prints_a_keys_file_problem_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tenants: dict[str, object], expected: str
) -> None:
    """A tenant named in the keys file with no list of digests is quoted in the config
    error, which `owngate keys` prints escaped (`shown`). (One the config does not have
    is no error: its digests authenticate no one, and the warning saying so is escaped
    as every log line is, gateway/logs.py.)"""
    (tmp_path / "keys.yaml").write_text(yaml.safe_dump({"tenants": tenants}))
    config = str(_config(tmp_path, "keys.yaml"))
    assert main(["keys", "revoke", hash_api_key("og-one"), "--config", config]) == 1
    err = capsys.readouterr().err
    assert "keys.yaml" in err
    assert [c for line in err.split("\n") for c in line if not c.isprintable()] == []
    assert expected in err


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_a_tenant_the_config_lacks_holds_no_key_and_is_named_escaped(
    tmp_path: Path, fmt: Literal["json", "console"]
) -> None:
    """The keys file lists a tenant gateway.yaml does not have (taken out of it): the
    config loads (a reload takes effect, tests/integration/test_reload_tenants.py), no
    tenant holds its digests, and the warning names it escaped."""
    gone = hash_api_key("og-of-a-tenant-taken-out")
    keys = {"tenants": {"team": [hash_api_key("og-one")], "\x1b[2J\rgone": [gone]}}
    (tmp_path / "keys.yaml").write_text(yaml.safe_dump(keys))
    with rendered_logs(fmt) as logs:
        config = load_config(_config(tmp_path, "keys.yaml"))
    assert [(t.id, t.api_key_hashes) for t in config.tenants] == [
        ("team", (hash_api_key("og-one"),))
    ]
    text = logs.getvalue()
    assert "authenticate no one" in text
    assert "x1b[2J" in text
    assert [c for c in text if not c.isprintable() and c != "\n"] == []


def test_revoking_a_digest_the_file_lacks_takes_no_lock(tmp_path: Path) -> None:
    # A key inline in gateway.yaml, the keys file on a read-only mount (docs/deploy.md):
    # its revocation must not wait for a lock it would not need.
    keys = tmp_path / "keys.yaml"
    add_key_hash(keys, "team", hash_api_key("og-one"))
    holder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another change, stuck
    try:
        assert remove_key_hash(keys, hash_api_key("og-inline")) is None
    finally:
        os.close(holder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keys.yaml"]


@pytest.fixture
def gateway_dir() -> Iterator[Path]:
    """A directory the gateway's user (`NOBODY`) owns, which root may write too."""
    directory = Path(tempfile.mkdtemp(prefix="owngate-keys-"))
    try:
        directory.chmod(0o755)
        if os.geteuid() == 0:
            os.chown(directory, NOBODY, NOBODY)
        yield directory
    finally:
        shutil.rmtree(directory)


def _as_gateway_user(keys: Path, digest: str) -> tuple[int, str]:
    """Add a key as the gateway's user (`NOBODY`) would, in a forked child that drops
    root (`os.setuid`) first: its exit status, and its error if any."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            add_key_hash(keys, "team", digest)
            status = 0
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, then exit
            os.write(write, repr(exc).encode()[:4000])
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        error = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), error


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as two users")
def test_the_gateway_s_user_changes_keys_after_root_did(gateway_dir: Path) -> None:
    keys = gateway_dir / "keys.yaml"
    assert _as_gateway_user(keys, hash_api_key("og-gateway-1")) == (0, "")
    keys.chmod(0o644)  # as docs/deploy.md has the operator do, once
    add_key_hash(keys, "team", hash_api_key("og-root"))  # the operator: `owngate keys new`
    assert _as_gateway_user(keys, hash_api_key("og-gateway-2")) == (0, "")
    stored = read_keys_file(keys)["team"]
    assert stored == [hash_api_key(k) for k in ("og-gateway-1", "og-root", "og-gateway-2")]
    assert sorted(p.name for p in gateway_dir.iterdir()) == ["keys.yaml"]  # no lock file


def _durable_steps(monkeypatch: pytest.MonkeyPatch, keys: Path) -> list[str]:
    """The keys file's renames and its directory's fsyncs, in the order they happen."""
    steps: list[str] = []
    real_replace, real_fsync = os.replace, os.fsync

    def replace(src: object, dst: object) -> None:
        real_replace(src, dst)  # type: ignore[arg-type]
        if Path(str(dst)) == keys:
            steps.append("rename")

    def fsync(fd: int) -> None:
        real_fsync(fd)
        if stat.S_ISDIR(os.fstat(fd).st_mode) and os.fstat(fd).st_ino == keys.parent.stat().st_ino:
            steps.append("fsync directory")

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "fsync", fsync)
    return steps


def test_a_revocation_is_on_disk_once_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rename that drops a revoked digest is followed by an fsync of the directory: a
    crash after `keys revoke` returned must not bring the old file, digest and all, back."""
    keys = tmp_path / "keys.yaml"
    add_key_hash(keys, "acme", hash_api_key("sk-1"))
    add_key_hash(keys, "acme", hash_api_key("sk-2"))
    steps = _durable_steps(monkeypatch, keys)
    assert remove_key_hash(keys, hash_api_key("sk-1")) == "acme"
    add_key_hash(keys, "acme", hash_api_key("sk-3"))
    assert steps == ["rename", "fsync directory", "rename", "fsync directory"]


def test_an_admin_key_change_is_on_disk_once_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = tmp_path / "keys.yaml"
    add_key_hash(keys, "acme", hash_api_key("sk-1"))
    stored = read_keys_file(keys)
    stored["acme"] = []
    change = KeysChange(keys, keys_file.stage_keys_file(keys, stored))
    steps = _durable_steps(monkeypatch, keys)
    asyncio.run(change.commit())
    assert steps == ["rename", "fsync directory"]
    assert read_keys_file(keys) == {"acme": []}


def test_a_tenant_listed_twice_in_the_keys_file_is_a_config_error(tmp_path: Path) -> None:
    """PyYAML keeps the last copy of a key written twice: a tenant listed twice (two
    changes merged by hand) lost the digests of its first list unseen, and the next
    `owngate keys` change rewrote the file without them."""
    first, second = hash_api_key("og-first"), hash_api_key("og-second")
    (tmp_path / "keys.yaml").write_text(
        f"tenants:\n  team:\n    - {first}\n  team:\n    - {second}\n", encoding="utf-8"
    )
    with pytest.raises(ConfigError, match=r"keys\.yaml.*line 4.*written twice"):
        load_config(_config(tmp_path, "keys.yaml"))
    with pytest.raises(ValueError, match="written twice"):
        read_keys_file(tmp_path / "keys.yaml")


def test_a_tenant_merged_into_the_keys_file_is_a_config_error(tmp_path: Path) -> None:
    """A merge key (`<<: *listed`) is a tenant written twice too: PyYAML keeps the
    mapping's own copy over the merged one, so the merged digests were dropped unseen."""
    first, second = hash_api_key("og-first"), hash_api_key("og-second")
    (tmp_path / "keys.yaml").write_text(
        f"old: &old\n  team:\n    - {first}\ntenants:\n  <<: *old\n  team:\n    - {second}\n",
        encoding="utf-8",
    )
    with pytest.raises(ValueError, match=r"line 5.*merged into one"):
        read_keys_file(tmp_path / "keys.yaml")
