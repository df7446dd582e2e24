"""The high-water file (`HighWater`) where `serve --workers N` keeps it, what it keeps of
the logs it recorded before (retired origins) and a high-water file that is a link.

Review C found: each worker's default file was `<dir>/worker-<i>.high-water`, inside the
configured log directory, so removing that directory removed the guards with the logs and
every worker forked its log silently; `--new-log-origin` let an earlier origin start over
from zero (the file remembered only the last origin); and a high-water file that was a
symbolic link was replaced by a regular file at the first checkpoint.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gateway.config.provenance import ProvenanceSettings
from gateway.provenance.errors import HighWaterFullError, LogForkError
from gateway.provenance.formats.checkpoint import Checkpoint, sign_checkpoint
from gateway.provenance.formats.merkle import leaf_hash
from gateway.provenance.formats.wal import encode_frame
from gateway.provenance.testing import seeded_signer
from gateway.provenance.writer.high_water import MAX_FILE, MAX_RETIRING, HighWater
from gateway.provenance.writer.store import LogStore
from gateway.worker_identity import WorkerIdentity, for_worker
from tests.helpers.gateways import backend, gateway_config

A, B, C = "gw.example/log/a", "gw.example/log/b", "gw.example/log/c"


def _fill(store: LogStore, count: int) -> None:
    entries = [f'{{"n":{store.size + n}}}'.encode() for n in range(count)]
    pairs = [(e, leaf_hash(e)) for e in entries]
    store.append_frames(pairs, b"".join(encode_frame(e, h) for e, h in pairs))


def _log(directory: Path, origin: str, high_water: HighWater, entries: int = 0) -> None:
    store = LogStore.open(directory, origin, [seeded_signer(origin)], high_water=high_water)
    _fill(store, entries)
    store.checkpoint()
    store.close()


def _worker(config_dir: Path | None, index: int = 1, **provenance: str) -> ProvenanceSettings:
    """Worker `index`'s provenance settings, as `serve` makes them from gateway.yaml in
    `config_dir` (None: not said, as a caller that has none)."""
    base = gateway_config(
        [backend("gpu", "http://127.0.0.1:9", "m")],
        provenance={"origin": "gw.example/log", "signing_key_file": "k"} | provenance,
    )
    identity = WorkerIdentity(index, Path("/nonexistent/run"))
    prepare = for_worker(identity) if config_dir is None else for_worker(identity, config_dir)
    config = prepare(base)
    assert config.provenance is not None
    return config.provenance


@pytest.mark.parametrize(
    ("directory", "expected"),
    [
        ("log", "log.high-water-worker-2"),
        ("log/", "log.high-water-worker-2"),
        ("a/../log", "log.high-water-worker-2"),
        ("state/log", "state/log.high-water-worker-2"),
        (".", "../{config}.high-water-worker-2"),  # the config's own directory
    ],
)
def test_a_workers_high_water_file_is_beside_the_configured_log_directory(
    tmp_path: Path, directory: str, expected: str
) -> None:
    config_dir = tmp_path / "config"
    # a relative directory with a name needs no config_dir; `.` is named by where it is
    settings = _worker(config_dir if directory == "." else None, 2, dir=directory)
    path = settings.high_water_path(config_dir)
    configured = Path(config_dir / directory).resolve()
    assert configured not in path.resolve().parents, path
    want = (config_dir / expected.format(config=config_dir.name)).resolve()
    assert path.resolve() == want
    # the single process's file, followed by -worker-<i>
    single = ProvenanceSettings(dir=directory, origin="o", signing_key_file="k")
    assert str(path.resolve()) == f"{single.high_water_path(config_dir).resolve()}-worker-2"


def test_a_workers_high_water_file_set_in_the_config_is_suffixed(tmp_path: Path) -> None:
    settings = _worker(tmp_path, 3, dir="/var/lib/og/log", high_water_file="/srv/hw/log.hw")
    assert settings.high_water_path(tmp_path) == Path("/srv/hw/log.hw-worker-3")
    absolute = _worker(tmp_path, 1, dir=str(tmp_path / "logs"))
    assert absolute.high_water_path(tmp_path) == tmp_path / "logs.high-water-worker-1"


def test_emptying_the_configured_log_directory_refuses_every_workers_log(
    tmp_path: Path,
) -> None:
    workers = [_worker(None, index, dir="log") for index in (1, 2)]  # relative: no dir needed
    for log in workers:
        _log(tmp_path / log.dir, log.origin, HighWater(log.high_water_path(tmp_path)), 50)
    # the operator's provenance.dir ("log") is emptied, lost, or restored from an empty copy
    shutil.rmtree(tmp_path / "log")
    for log in workers:
        high_water = HighWater(log.high_water_path(tmp_path))
        with pytest.raises(LogForkError, match="already signed a checkpoint of size 50"):
            LogStore.open(
                tmp_path / log.dir, log.origin, [seeded_signer(log.origin)], high_water=high_water
            )


def test_a_retired_origin_cannot_start_over_from_zero(tmp_path: Path) -> None:
    path, directory = tmp_path / "log.high-water", tmp_path / "log"
    _log(directory, A, HighWater(path), 7)
    shutil.rmtree(directory)
    _log(directory, B, HighWater(path, new_origin=True))  # A left behind, B begins
    shutil.rmtree(directory)
    # back to origin A (which signed size 7), with the flag still set: a second tree of A
    with pytest.raises(LogForkError, match=r"the retired log 'gw\.example/log/a' already signed"):
        _log(directory, A, HighWater(path, new_origin=True))
    assert [(c.origin, c.size) for c in HighWater(path).retired()] == [(A, 7)]
    _log(directory, C, HighWater(path, new_origin=True))  # an origin never used is fine
    current = HighWater(path).read()
    assert current is not None and (current.origin, current.size) == (C, 0)
    assert [(c.origin, c.size) for c in HighWater(path).retired()] == [(B, 0), (A, 7)]


def test_a_retired_origin_comes_back_only_with_its_whole_log(tmp_path: Path) -> None:
    path = tmp_path / "log.high-water"
    _log(tmp_path / "a", A, HighWater(path), 7)
    _log(tmp_path / "b", B, HighWater(path, new_origin=True), 3)
    with pytest.raises(LogForkError, match=r"records the log 'gw\.example/log/b'"):
        _log(tmp_path / "a", A, HighWater(path))  # changing origin is still said explicitly
    _log(tmp_path / "a", A, HighWater(path, new_origin=True), 2)  # A's directory, intact
    current = HighWater(path).read()
    assert current is not None and (current.origin, current.size) == (A, 9)
    assert [(c.origin, c.size) for c in HighWater(path).retired()] == [(B, 3)]


def test_a_file_written_before_retired_logs_were_kept_reads_the_same(tmp_path: Path) -> None:
    path, directory = tmp_path / "log.high-water", tmp_path / "log"
    _log(directory, A, HighWater(path), 5)
    one_note = path.read_bytes()  # one signed note: the format of the previous release
    assert Checkpoint.parse(one_note.decode().split("\n\n")[0] + "\n").size == 5
    path.write_bytes(one_note)
    shutil.rmtree(directory)
    with pytest.raises(LogForkError, match="size 5"):
        _log(directory, A, HighWater(path))


def _retired_notes(past: int) -> bytes:
    """Signed checkpoints of as many retired origins (each at size 0) as make just more
    than `past` bytes: what ~2,000 starts with --new-log-origin leave in the file."""
    notes: list[bytes] = []
    size = number = 0
    while size <= past:
        origin = f"gw.example/log/retired-{number}"
        note = sign_checkpoint(Checkpoint(origin, 0, leaf_hash(b"")), [seeded_signer(origin)])
        notes.append(note)
        size += len(note) + 1
        number += 1
    return b"\n".join(notes)


def test_a_file_past_its_bound_says_why_and_what_to_do(tmp_path: Path) -> None:
    """A file the retired logs grew past 1 MiB refused every start as an unreadable,
    `larger than a high-water file`, naming neither the cause nor the way on."""
    path, directory = tmp_path / "log.high-water", tmp_path / "log"
    _log(directory, A, HighWater(path))
    path.write_bytes(path.read_bytes() + b"\n" + _retired_notes(MAX_FILE))
    with pytest.raises(HighWaterFullError, match="left behind with --new-log-origin") as full:
        _log(directory, A, HighWater(path))
    assert "docs/provenance.md" in str(full.value)


def test_no_further_log_is_left_behind_past_the_retiring_bound(tmp_path: Path) -> None:
    """--new-log-origin is refused before anything is signed once the retired logs fill
    the file to MAX_RETIRING, so the file never grows past what it reads; going back to
    a retired origin (its note replaced, not added) and going on are not."""
    path = tmp_path / "log.high-water"
    _log(tmp_path / "a", A, HighWater(path), 3)
    _log(tmp_path / "b", B, HighWater(path, new_origin=True))  # A left behind: room still
    path.write_bytes(path.read_bytes() + b"\n" + _retired_notes(MAX_RETIRING))
    with pytest.raises(HighWaterFullError, match="leaves no further log behind"):
        _log(tmp_path / "c", C, HighWater(path, new_origin=True))
    refused = HighWater(path).read()
    assert refused is not None and refused.origin == B  # nothing of C was recorded
    assert not (tmp_path / "c" / "checkpoint").exists()  # nor signed
    _log(tmp_path / "b", B, HighWater(path), 2)  # the current log goes on
    _log(tmp_path / "a", A, HighWater(path, new_origin=True))  # a retired origin is back
    current = HighWater(path).read()
    assert current is not None and (current.origin, current.size) == (A, 3)
    assert path.stat().st_size <= MAX_FILE


def test_a_high_water_file_that_is_a_link_stays_a_link(tmp_path: Path) -> None:
    # Before: the first checkpoint replaced the link by a regular file (os.replace), so
    # the file on the other volume the operator linked to was never written again.
    target = tmp_path / "other-volume" / "log.high-water"
    target.parent.mkdir()
    link = tmp_path / "log.high-water"
    link.symlink_to(target)
    directory = tmp_path / "log"
    _log(directory, A, HighWater(link), 4)
    assert link.is_symlink() and link.resolve() == target
    recorded = HighWater(target).read()
    assert recorded is not None and recorded.size == 4
    _log(directory, A, HighWater(link), 2)
    assert link.is_symlink()
    recorded = HighWater(target).read()
    assert recorded is not None and recorded.size == 6
    shutil.rmtree(directory)
    with pytest.raises(LogForkError, match="size 6"):
        _log(directory, A, HighWater(link))
