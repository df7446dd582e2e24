"""A gateway.yaml or keys file the reload watcher could not read (an OSError: out of file
descriptors under load, an I/O error) is read again at the next settled look, though the
file did not change. Before, the failed reload kept the file's new stamp and the watcher
waited for the next change: a key revoked in the keys file stayed valid in that process,
for good (under `serve --workers N`, in the one worker that failed to read it, while the
others refused it). What a file says when it can be read (invalid content) is not retried:
it waits for the next change, as before."""

from __future__ import annotations

import asyncio
import errno
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from gateway import tenants as tenants_module
from gateway import tls_files
from gateway.app import create_app
from gateway.config import ConfigError, load_config
from gateway.pki import make_ca
from gateway.small_files import read_small_file
from gateway.tenants import hash_api_key
from tests.helpers.gateways import backend, gateway_config

KEY = "og-unreadable-test-key-0123456789"


def _write(path: Path, text: str, mtime_ns: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(mtime_ns, mtime_ns))  # each write its own stamp, whatever the clock


def _keys(*keys: str) -> str:
    return yaml.safe_dump({"tenants": {"acme": [hash_api_key(k) for k in keys]}})


def _gateway_yaml(tmp_path: Path) -> Path:
    data = gateway_config([backend("gpu", "http://127.0.0.1:9", "m")]).model_dump(
        mode="json", exclude_none=True
    )
    data["tenants"][0]["api_key_hashes"] = []
    data["keys_file"] = "keys.yaml"
    path = tmp_path / "gateway.yaml"
    _write(path, yaml.safe_dump(data), 1_000_000_000)
    return path


def test_a_keys_file_that_could_not_be_read_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _gateway_yaml(tmp_path)
    _write(tmp_path / "keys.yaml", _keys(KEY), 1_000_000_000)
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    reloader = app.reloader
    assert reloader is not None
    assert hash_api_key(KEY) in app.parts.config.tenants[0].api_key_hashes

    _write(tmp_path / "keys.yaml", _keys(), 2_000_000_000)  # `owngate keys revoke`
    real = tenants_module.read_keys_file
    reads: list[Path] = []

    def out_of_descriptors_once(keys_path: Path) -> dict[str, list[str]]:
        reads.append(keys_path)
        if len(reads) == 1:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(keys_path)

    monkeypatch.setattr(tenants_module, "read_keys_file", out_of_descriptors_once)

    async def looks() -> None:
        for _ in range(6):  # bounded: a change settles in two looks
            await reloader.poll()

    asyncio.run(looks())
    assert reloader.reload_failures == 1
    assert len(reads) == 2  # read again, and only once more
    assert hash_api_key(KEY) not in app.parts.config.tenants[0].api_key_hashes
    assert reloader.last_error is None


def test_a_keys_file_that_says_something_invalid_waits_for_a_change(tmp_path: Path) -> None:
    path = _gateway_yaml(tmp_path)
    _write(tmp_path / "keys.yaml", _keys(KEY), 1_000_000_000)
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    reloader = app.reloader
    assert reloader is not None
    _write(tmp_path / "keys.yaml", "tenants: [not, a, mapping]\n", 2_000_000_000)

    async def looks() -> None:
        for _ in range(6):
            await reloader.poll()

    asyncio.run(looks())
    assert reloader.reload_failures == 1  # refused once, not again every look


def test_the_loader_says_which_files_could_not_be_read(tmp_path: Path) -> None:
    path = _gateway_yaml(tmp_path)
    (tmp_path / "keys.yaml").mkdir()  # read() fails: EISDIR
    with pytest.raises(ConfigError) as unreadable:
        load_config(path)
    assert unreadable.value.unreadable
    (tmp_path / "keys.yaml").rmdir()
    (tmp_path / "keys.yaml").write_text("tenants: [not, a, mapping]\n")
    with pytest.raises(ConfigError) as invalid:
        load_config(path)
    assert not invalid.value.unreadable
    with pytest.raises(ConfigError) as missing:
        load_config(tmp_path / "nowhere.yaml")
    assert missing.value.unreadable


def test_a_keys_file_that_stays_unreadable_is_retried_ever_less_often(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keys file that cannot be read for as long as it stays as it is (its permission
    taken away: a chmod changes neither its mtime nor its size, the watcher's stamp). Each
    retry re-reads gateway.yaml and logs an error: at every other look (every 2 s, for
    good) that was a log flood. Retried after 2, 4, 8, ... looks, it still gets read once
    it can be, the change seen within a bounded number of looks."""
    path = _gateway_yaml(tmp_path)
    _write(tmp_path / "keys.yaml", _keys(KEY), 1_000_000_000)
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    reloader = app.reloader
    assert reloader is not None
    _write(tmp_path / "keys.yaml", _keys(), 2_000_000_000)  # `owngate keys revoke`
    real = tenants_module.read_keys_file
    reads: list[Path] = []
    permitted = False

    def not_permitted(keys_path: Path) -> dict[str, list[str]]:
        reads.append(keys_path)
        if not permitted:
            raise OSError(errno.EACCES, os.strerror(errno.EACCES))
        return real(keys_path)

    monkeypatch.setattr(tenants_module, "read_keys_file", not_permitted)

    async def looks(count: int) -> int:
        """Poll up to `count` times; the looks it took to reload (count if none did)."""
        for look in range(1, count + 1):
            if await reloader.poll():
                return look
        return count

    asyncio.run(looks(64))
    assert len(reads) == reloader.reload_failures
    assert 3 <= reloader.reload_failures <= 6, reads  # was 32: every other look
    assert hash_api_key(KEY) in app.parts.config.tenants[0].api_key_hashes
    permitted = True  # `chmod` back: the stamp is as it was
    taken = asyncio.run(looks(200))
    assert taken <= 65  # bounded: at most 64 looks between two retries
    assert hash_api_key(KEY) not in app.parts.config.tenants[0].api_key_hashes
    assert reloader.last_error is None


WORKER_ENV = {"OWNGATE_WORKERS": "2", "OWNGATE_WORKER_INDEX": "1"}


@pytest.mark.parametrize("worker", [True, False])
def test_a_worker_that_could_not_read_a_revocation_is_stale_until_a_read_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, worker: bool
) -> None:
    """A worker of `serve --workers N` whose read of a changed keys file failed holds an
    older key index than its siblings (a revoked key valid here only): it is `stale`
    (refusing, not ready) until a read succeeds, read again at every look; a read in
    between that finds invalid content leaves it stale. Before, it kept serving the
    revoked key for up to 64 looks. One process is never stale, as before."""
    path = _gateway_yaml(tmp_path)
    _write(tmp_path / "keys.yaml", _keys(KEY), 1_000_000_000)
    environ = {**WORKER_ENV, "OWNGATE_WORKER_RUNTIME_DIR": str(tmp_path)} if worker else {}
    app = create_app(load_config(path), environ=environ, config_dir=tmp_path, config_file=path)
    reloader = app.reloader
    assert reloader is not None and reloader.among_workers is worker
    _write(tmp_path / "keys.yaml", _keys(), 2_000_000_000)  # `owngate keys revoke`
    real = tenants_module.read_keys_file
    reads: list[Path] = []

    def out_of_descriptors_twice(keys_path: Path) -> dict[str, list[str]]:
        reads.append(keys_path)
        if len(reads) <= 2:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(keys_path)

    monkeypatch.setattr(tenants_module, "read_keys_file", out_of_descriptors_twice)

    async def look() -> bool:
        return await reloader.poll()

    asyncio.run(look())  # the change seen
    asyncio.run(look())  # settled: read, and the read fails
    assert len(reads) == 1 and reloader.stale is worker
    asyncio.run(look())
    # a worker reads again at the next look (and fails again); one process waits 2 looks
    assert len(reads) == (2 if worker else 1) and reloader.stale is worker
    monkeypatch.undo()
    _write(tmp_path / "keys.yaml", "tenants: [not, a, mapping]\n", 3_000_000_000)  # a typo
    for _ in range(2):
        asyncio.run(look())
    assert reloader.last_error is not None and "cannot read" not in reloader.last_error
    assert reloader.stale is worker  # before: cleared, if it had been set at all
    assert hash_api_key(KEY) in app.parts.config.tenants[0].api_key_hashes
    _write(tmp_path / "keys.yaml", _keys(), 4_000_000_000)  # fixed
    for _ in range(4):
        asyncio.run(look())
    assert hash_api_key(KEY) not in app.parts.config.tenants[0].api_key_hashes
    assert not reloader.stale


def test_a_backend_ca_file_that_could_not_be_read_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A CA withdrawn by replacing ca.pem, whose reload could not read the new file (out of
    # descriptors): the reload failed and, with the file's new stamp taken, was not tried
    # again until the next change, the withdrawn CA trusted meanwhile. It is read again.
    now = datetime(2026, 1, 1, tzinfo=UTC)
    _write(tmp_path / "ca.pem", make_ca("old", now=now).cert_pem.decode(), 1_000_000_000)
    gpu = {**backend("gpu", "https://127.0.0.1:9", "m"), "tls": {"ca_file": "ca.pem"}}
    data = gateway_config([backend("gpu", "http://127.0.0.1:9", "m")]).model_dump(
        mode="json", exclude_none=True
    )
    data["backends"] = [gpu]
    path = tmp_path / "gateway.yaml"
    _write(path, yaml.safe_dump(data), 1_000_000_000)
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    reloader = app.reloader
    assert reloader is not None
    first = app.parts.registry

    _write(tmp_path / "ca.pem", make_ca("new", now=now).cert_pem.decode(), 2_000_000_000)
    reads: list[Path] = []

    def out_of_descriptors_once(file: Path, limit: int) -> bytes:
        reads.append(file)
        if len(reads) == 2:  # the first read tells the file changed; the second builds
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return read_small_file(file, limit)

    monkeypatch.setattr(tls_files, "read_small_file", out_of_descriptors_once)

    async def looks() -> None:
        for _ in range(8):  # bounded: a change settles in two looks, a retry in two more
            await reloader.poll()

    asyncio.run(looks())
    assert reloader.reload_failures == 1
    assert reloader.last_error is None  # read again, and built under the new CA
    assert app.parts.registry is not first
    assert not app.parts.registry.tls_changed()
