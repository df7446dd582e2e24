"""A policy file the policy watcher could not read (an OSError: out of file descriptors
under load, an I/O error) is read again though it did not change: after 2 looks, then 4,
8, ... at most 64 while it keeps failing. Before, the failed read kept the files' new stamp
and the watcher waited for their next change: a narrowed policy stayed unenforced in that
process, for good (under `serve --workers N`, in the one worker that failed to read it,
while the others enforced it). What a file says when it can be read (invalid content) is
not retried: it waits for the next change, as before."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from gateway import small_files
from gateway.api.fleet import merge_expositions
from gateway.api.metrics import GatewayMetrics
from gateway.policy import PolicyError, PolicyIssue, loader, source
from gateway.policy_set import TrustPolicies
from tests.helpers.gateways import backend, gateway_config
from tests.helpers.reload_files import versioned_policy, write

STALE = "owngate_policy_stale "


def _trust(tmp_path: Path, paths: list[str]) -> TrustPolicies:
    (tmp_path / "policies").mkdir()
    write(tmp_path / "policies" / "p.yaml", versioned_policy("1", '"*"'), 1_000_000_000)
    config = gateway_config([backend("gpu", "http://127.0.0.1:9", "m")], policy={"paths": paths})
    trust = TrustPolicies(config, tmp_path)
    assert trust.current.compiled("p").version == "1"
    return trust


def _failing_reads(monkeypatch: pytest.MonkeyPatch, failures: int) -> list[Path]:
    """The policy loader's reads, the first `failures` of them out of file descriptors."""
    real = small_files.read_small_file
    reads: list[Path] = []

    def read(path: Path, limit: int) -> bytes:
        reads.append(path)
        if len(reads) <= failures:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(path, limit)

    monkeypatch.setattr(loader, "read_small_file", read)
    return reads


@pytest.mark.parametrize("paths", [["policies"], ["policies/p.yaml"]])
def test_a_narrowed_policy_that_could_not_be_read_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, paths: list[str]
) -> None:
    trust = _trust(tmp_path, paths)
    write(tmp_path / "policies" / "p.yaml", versioned_policy("2", "ap"), 2_000_000_000)  # narrowed
    reads = _failing_reads(monkeypatch, failures=1)
    for _ in range(6):  # bounded: a change settles in two looks, the retry 2 looks later
        trust.poll()
    assert len(reads) == 2  # read again, and only once more
    assert trust.reload_failures == 1
    assert trust.current.compiled("p").version == "2"
    assert trust.last_error is None


def test_a_directory_that_could_not_be_listed_is_listed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trust = _trust(tmp_path, ["policies"])
    write(tmp_path / "policies" / "p.yaml", versioned_policy("2", "ap"), 2_000_000_000)
    listings: list[list[Path]] = []

    def discover(paths: Iterable[Path]) -> tuple[list[Path], list[PolicyIssue]]:
        listings.append(list(paths))
        if len(listings) == 1:  # scandir out of file descriptors
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return source.discover(listings[-1])

    monkeypatch.setattr(loader, "discover", discover)
    for _ in range(6):
        trust.poll()  # before: the OSError escaped the poll, and its stamp was kept
    assert len(listings) == 2
    assert trust.reload_failures == 1
    assert trust.current.compiled("p").version == "2"


def test_a_file_that_keeps_failing_is_read_ever_less_often(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trust = _trust(tmp_path, ["policies"])
    write(tmp_path / "policies" / "p.yaml", versioned_policy("2", "ap"), 2_000_000_000)
    reads = _failing_reads(monkeypatch, failures=1_000)
    for _ in range(2 + 2 + 4 + 8 + 16):  # settles at the 2nd look; retries 2, 4, 8, 16 later
        trust.poll()
    assert len(reads) == 5
    assert trust.reload_failures == 5
    assert trust.current.compiled("p").version == "1"  # the last good set, reported
    assert trust.last_error is not None and "cannot read" in trust.last_error


def test_invalid_content_is_not_read_again_until_it_changes(tmp_path: Path) -> None:
    trust = _trust(tmp_path, ["policies"])
    write(tmp_path / "policies" / "p.yaml", "kind: [", 2_000_000_000)
    for _ in range(10):
        trust.poll()
    assert trust.reload_failures == 1
    assert trust.current.compiled("p").version == "1"


BETA = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: q, version: "1"}
spec:
  tenants: [beta]
  residency: {allow: ["*"]}
  retention: {max_days: any, training: true}
  fallback: {mode: never}
"""


def _unlistable(monkeypatch: pytest.MonkeyPatch, directory: Path) -> list[Path]:
    """`directory` cannot be listed (EACCES: a permission flip during a deploy; the
    tests run as root, which any mode lets list); the listings tried, returned."""
    real = os.scandir
    tried: list[Path] = []

    def scandir(path: Any = ".") -> Any:
        if Path(path) == directory:
            tried.append(directory)
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    return tried


def test_a_subdirectory_that_cannot_be_listed_fails_the_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, `Path.rglob` skipped it silently: the set compiled without its files."""
    (tmp_path / "policies" / "beta").mkdir(parents=True)
    write(tmp_path / "policies" / "p.yaml", versioned_policy("1", '"*"'), 1_000_000_000)
    write(tmp_path / "policies" / "beta" / "q.yaml", BETA, 1_000_000_000)
    tried = _unlistable(monkeypatch, tmp_path / "policies" / "beta")
    with pytest.raises(PolicyError) as caught:
        loader.load_policies([tmp_path / "policies"], [])
    assert tried
    assert caught.value.unreadable
    assert "cannot read" in str(caught.value)


def test_a_subdirectory_unlisted_at_a_reload_keeps_the_set_and_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trust = _trust(tmp_path, ["policies"])
    (tmp_path / "policies" / "beta").mkdir()
    write(tmp_path / "policies" / "beta" / "q.yaml", BETA, 2_000_000_000)
    for _ in range(2):  # the new file settles and is loaded
        trust.poll()
    assert trust.current.compiled("q") is not None
    whole = trust.current.digest
    # Its directory turns unlistable: its file is gone from the stamps, a change.
    with monkeypatch.context() as patch:
        _unlistable(patch, tmp_path / "policies" / "beta")
        for _ in range(2):
            trust.poll()
        assert trust.current.digest == whole  # before: compiled without beta's policy
        assert trust.reload_failures == 1
    for _ in range(6):  # listable again: its file is back, and read (whole)
        trust.poll()
    assert trust.current.digest == whole
    assert trust.last_error is None


def test_a_worker_that_could_not_read_a_change_is_stale_until_it_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker of `serve --workers N` (`among_workers`): while its last read failed its
    set may be older than its siblings' (they read the narrowed file): it is `stale` (not
    ready, refusing requests) and reads the files again at every look, not after 2, 4, 8
    ... (before: it served its older set, and was ready, for up to 64 looks)."""
    trust = _trust(tmp_path, ["policies/p.yaml"])
    trust.among_workers = True
    write(tmp_path / "policies" / "p.yaml", versioned_policy("2", "ap"), 2_000_000_000)
    reads = _failing_reads(monkeypatch, failures=2)
    trust.poll()  # the change seen
    assert not trust.stale
    trust.poll()  # settled: read, and the read fails
    assert len(reads) == 1 and trust.stale
    assert trust.current.compiled("p").version == "1"
    trust.poll()  # read again at the next look, and fails again
    assert len(reads) == 2 and trust.stale
    trust.poll()
    assert len(reads) == 3 and not trust.stale
    assert trust.current.compiled("p").version == "2"


def _stale_gauge(text: str) -> list[float]:
    return [float(line.split()[-1]) for line in text.splitlines() if line.startswith(STALE)]


def test_the_stale_workers_are_counted_in_the_merged_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trust = _trust(tmp_path, ["policies/p.yaml"])
    trust.among_workers = True
    metrics = GatewayMetrics()
    metrics.watch_policies(trust)
    fresh = metrics.render().decode()
    assert _stale_gauge(fresh) == [0.0]
    write(tmp_path / "policies" / "p.yaml", versioned_policy("2", "ap"), 2_000_000_000)
    _failing_reads(monkeypatch, failures=1)
    for _ in range(2):
        trust.poll()
    stale = metrics.render().decode()
    assert _stale_gauge(stale) == [1.0]
    merged = merge_expositions([fresh, stale, stale]).decode()
    assert _stale_gauge(merged) == [2.0]  # two of three workers


def test_one_process_that_could_not_read_a_change_keeps_its_set_and_is_not_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process has no sibling to disagree with: its failed read keeps the last good
    set active, ready, retried after 2 looks, as before."""
    trust = _trust(tmp_path, ["policies/p.yaml"])
    write(tmp_path / "policies" / "p.yaml", versioned_policy("2", "ap"), 2_000_000_000)
    reads = _failing_reads(monkeypatch, failures=1)
    for _ in range(3):
        trust.poll()
    assert len(reads) == 1 and not trust.stale  # the retry is 2 looks away
    trust.poll()
    assert len(reads) == 2 and trust.current.compiled("p").version == "2"


@pytest.mark.parametrize("then", ["invalid", "changed while read"])
def test_a_stale_worker_stays_stale_until_a_read_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    """A worker that could not read a narrowed file, whose next read fails otherwise (the
    file rewritten invalid, or changing while read): it still holds the older set its
    siblings left (they read the narrowed one), so it stays stale. Before, that read
    cleared the flag: the worker turned ready and served under the older, looser set."""
    trust = _trust(tmp_path, ["policies/p.yaml"])
    trust.among_workers = True
    policy = tmp_path / "policies" / "p.yaml"
    write(policy, versioned_policy("2", "ap"), 2_000_000_000)  # narrowed
    with monkeypatch.context() as patch:
        _failing_reads(patch, failures=1)
        for _ in range(2):  # the change settles; its read fails
            trust.poll()
    assert trust.stale and trust.current.compiled("p").version == "1"
    if then == "invalid":
        write(policy, "kind: [", 3_000_000_000)
    else:
        real = small_files.read_small_file

        def rewritten_while_read(path: Path, limit: int) -> bytes:
            text = real(path, limit)
            write(policy, versioned_policy("3", "ap"), 3_000_000_000)
            return text

        monkeypatch.setattr(loader, "read_small_file", rewritten_while_read)
        write(policy, versioned_policy("2", "ap"), 2_500_000_000)
    for _ in range(2):  # settles and is read: it fails, readable
        trust.poll()
    assert trust.reload_failures == 2
    why = "changed while they were read" if then != "invalid" else "not valid YAML"
    assert trust.last_error is not None and why in trust.last_error, trust.last_error
    assert trust.current.compiled("p").version == "1"
    assert trust.stale  # before: False, serving version 1 beside siblings on version 2
    monkeypatch.undo()
    write(policy, versioned_policy("4", "ap"), 4_000_000_000)
    for _ in range(6):  # bounded: settles, then read
        trust.poll()
    assert trust.current.compiled("p").version == "4"
    assert not trust.stale


def test_one_process_whose_reads_fail_is_never_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process (not `among_workers`): an unreadable read then an invalid one keep
    its last good set serving, as always."""
    trust = _trust(tmp_path, ["policies/p.yaml"])
    policy = tmp_path / "policies" / "p.yaml"
    write(policy, versioned_policy("2", "ap"), 2_000_000_000)
    with monkeypatch.context() as patch:
        _failing_reads(patch, failures=1)
        for _ in range(2):
            trust.poll()
    assert not trust.stale
    write(policy, "kind: [", 3_000_000_000)
    for _ in range(2):
        trust.poll()
    assert trust.reload_failures == 2 and not trust.stale
    assert trust.current.compiled("p").version == "1"
