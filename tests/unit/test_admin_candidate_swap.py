"""A candidate config's file swapped for a link to a host file between the check of its
path (`gateway.admin.candidate_files.outside_files`) and the read that follows is not
read: every file validation opens is checked on the descriptor it is read from
(`gateway.confined_reads`).

The swap happens in the check itself (the test wraps `outside_files`: the real check,
then the swap), so it always falls between check and read, with no timing luck. Before,
the link was followed and the host file read, its contents quoted in the answer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.admin import candidate_files
from gateway.admin.control import AdminControl
from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from gateway.config.issues import ConfigIssue
from gateway.provenance.keys import load_signer, write_signing_key
from gateway.small_files import read_small_file
from tests.helpers.gateways import backend
from tests.helpers.reload_files import versioned_policy

SECRET = "SECRET-OF-THE-HOST"
BASE: dict[str, object] = {
    "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
    "tenants": [{"id": "acme", "models": ["*"]}],
}
SWAPPED = "outside the files this gateway reads (a link swapped in after the check?)"
UNKNOWN = "which file was opened cannot be told without /proc/self/fd"
LOG = {"dir": "log", "origin": "example.com/log", "signing_key_file": "log.key"}


def _swap_after_check(monkeypatch: pytest.MonkeyPatch, swaps: dict[Path, Path]) -> list[int]:
    """Make `outside_files` swap each key of `swaps` for a link to its value once it has
    checked the paths; the list counts the checks that swapped."""
    real: Callable[..., list[ConfigIssue]] = candidate_files.outside_files
    done: list[int] = []

    def check_then_swap(*args: object) -> list[ConfigIssue]:
        issues = real(*args)
        for checked, host in swaps.items():
            checked.unlink(missing_ok=True)  # a high-water file may be absent: created later
            checked.symlink_to(host)
        done.append(len(swaps))
        return issues

    monkeypatch.setattr(candidate_files, "outside_files", check_then_swap)
    return done


def _validate(config_dir: Path, candidate: dict[str, object]) -> list[str]:
    app = create_app(GatewaySettings.model_validate(BASE), config_dir=config_dir)
    control: AdminControl = admin_app(app).state.control
    return control.validate(json.dumps(candidate))


def _dirs(tmp_path: Path) -> tuple[Path, Path]:
    host, config_dir = tmp_path / "host", tmp_path / "config"
    host.mkdir()
    config_dir.mkdir()
    return host, config_dir


def _key(path: Path, name: str) -> Path:
    write_signing_key(path, name)
    return path


def _cases(host: Path, config: Path) -> dict[str, tuple[dict[str, object], dict[Path, Path]]]:
    """Each case: a candidate, and which of its checked files becomes a link to which
    host file (each host file holds SECRET where a problem would quote it)."""
    (config / "policies").mkdir()
    (config / "policies" / "p.yaml").write_text(versioned_policy("1", "eu"))
    (host / "manifest.yaml").write_text(f"apiVersion: {SECRET}\nkind: Secret\n")
    (config / "p.yaml").write_text(versioned_policy("1", "eu"))
    (config / "keys.yaml").write_text("tenants: {acme: []}\n")
    (host / "keys.yaml").write_text(f"tenants: {{{SECRET}: [x]}}\n")
    _key(config / "log.key", "example.com/log")
    _key(host / "host.key", "example.com/log")  # the host's own key: valid, not ours
    (host / "hw").write_text(f"{SECRET}\n1\n{'A' * 43}=\n")
    (config / "log").mkdir()
    return {
        "policy-directory-file": (
            {**BASE, "policy": {"paths": ["policies"]}},
            {config / "policies" / "p.yaml": host / "manifest.yaml"},
        ),
        "policy-file": (
            {**BASE, "policy": {"paths": ["p.yaml"]}},
            {config / "p.yaml": host / "manifest.yaml"},
        ),
        "keys-file": (
            {**BASE, "keys_file": "keys.yaml"},
            {config / "keys.yaml": host / "keys.yaml"},
        ),
        "signing-key": ({**BASE, "provenance": LOG}, {config / "log.key": host / "host.key"}),
        "high-water-file": (
            {**BASE, "provenance": {**LOG, "high_water_file": "hw"}},
            {config / "hw": host / "hw"},
        ),
    }


CASES = ["policy-directory-file", "policy-file", "keys-file", "signing-key", "high-water-file"]


@pytest.mark.parametrize("case", CASES)
def test_a_file_swapped_for_a_link_after_its_check_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    host, config_dir = _dirs(tmp_path)
    candidate, swaps = _cases(host, config_dir)[case]
    swapped = _swap_after_check(monkeypatch, swaps)
    problems = _validate(config_dir, candidate)
    assert swapped == [1], "the check ran once, and swapped"
    assert all(os.path.islink(link) for link in swaps)
    assert not any(SECRET in problem for problem in problems), problems
    assert any(SWAPPED in problem for problem in problems), problems


@pytest.mark.parametrize("case", CASES)
def test_without_a_swap_the_same_files_are_read(tmp_path: Path, case: str) -> None:
    """The check on the descriptor refuses nothing under the roots: the same candidates,
    unswapped, validate as before."""
    host, config_dir = _dirs(tmp_path)
    candidate, _swaps = _cases(host, config_dir)[case]
    assert _validate(config_dir, candidate) == []


def test_a_link_to_a_file_the_running_config_reads_is_still_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A link swapped in to a file under a root (the config's directory) is read: only a
    file outside every root is refused."""
    _host, config_dir = _dirs(tmp_path)
    (config_dir / "p.yaml").write_text(versioned_policy("1", "eu"))
    (config_dir / "other.yaml").write_text("apiVersion: nope-4\nkind: Policy\n")
    _swap_after_check(monkeypatch, {config_dir / "p.yaml": config_dir / "other.yaml"})
    problems = _validate(config_dir, {**BASE, "policy": {"paths": ["p.yaml"]}})
    assert any("nope-4" in problem for problem in problems), problems
    assert not any(SWAPPED in problem for problem in problems), problems


def _without_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    """`/proc/self/fd/N` unreadable, as where no /proc is mounted (other links resolve)."""
    real = os.readlink

    def readlink(path: str, *args: object, **kwargs: object) -> str:
        if str(path).startswith("/proc/self/fd/"):
            raise FileNotFoundError(2, "No such file or directory", path)
        return real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "readlink", readlink)


@pytest.mark.parametrize("case", CASES)
def test_without_proc_a_candidates_files_are_refused_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    # Before: refused as "outside the files this gateway reads (a link swapped in after
    # the check?)", of a file inside them that nobody swapped.
    host, config_dir = _dirs(tmp_path)
    candidate, _swaps = _cases(host, config_dir)[case]
    _without_proc(monkeypatch)
    problems = _validate(config_dir, candidate)
    assert any(UNKNOWN in problem for problem in problems), problems
    assert not any(SWAPPED in problem for problem in problems), problems


def test_without_proc_the_gateway_reads_its_own_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a validation's reads are confined: outside one (serving, the CLI) nothing is
    checked, so a start or reload reads its files without /proc."""
    _host, config_dir = _dirs(tmp_path)
    key = _key(config_dir / "log.key", "example.com/log")
    (config_dir / "p.yaml").write_text(versioned_policy("1", "eu"))
    _without_proc(monkeypatch)
    assert load_signer(key).name == "example.com/log"
    assert read_small_file(config_dir / "p.yaml", 1 << 20).startswith(b"apiVersion")
