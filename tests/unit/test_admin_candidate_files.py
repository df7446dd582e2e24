"""A candidate config sent to the admin API (`POST /admin/v1/config/validate`) makes the
gateway read only files under the running config's directory and those the running
config reads (gateway/admin/candidate_files.py): a path elsewhere on the host is a
problem named before any file is read, never a walk of the host's directories or a
problem quoting what a host file holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.admin.control import AdminControl
from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from gateway.policy import PolicyIssue
from tests.helpers.gateways import backend
from tests.helpers.reload_files import versioned_policy

SECRET = "SECRET-OF-THE-HOST"
BASE: dict[str, object] = {
    "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
    "tenants": [{"id": "acme", "models": ["*"]}],
}


def _host_files(root: Path) -> Path:
    """A directory of the host's own YAML files, none of them the gateway's: a
    Kubernetes-like manifest whose apiVersion is the secret, a policy-shaped one whose
    kind and a key are, and a keys-file-shaped one whose tenant name is."""
    root.mkdir()
    (root / "manifest.yaml").write_text(f"apiVersion: {SECRET}\nkind: Secret\n")
    (root / "nested").mkdir()
    (root / "nested" / "policy.yaml").write_text(
        f"apiVersion: policy.owngate.dev/v1\nkind: {SECRET}\n"
    )
    (root / "spec.yaml").write_text(
        "apiVersion: policy.owngate.dev/v1\nkind: Policy\nmetadata: {id: p}\n"
        f"spec: {{{SECRET}: 1}}\n"
    )
    (root / "keys.yaml").write_text(f"tenants: {{{SECRET}: [x]}}\n")
    return root


def _control(config_dir: Path, data: dict[str, object] = BASE) -> AdminControl:
    app = create_app(GatewaySettings.model_validate(data), config_dir=config_dir)
    control: AdminControl = admin_app(app).state.control
    return control


@pytest.mark.parametrize(
    "named",
    [
        {"policy": {"paths": ["HOST"]}},
        {"policy": {"paths": ["HOST/manifest.yaml"]}},
        {"policy": {"paths": ["HOST/nested/policy.yaml"]}},
        {"policy": {"paths": ["HOST/spec.yaml"]}},
        {"keys_file": "HOST/keys.yaml"},
        {"policy": {"paths": ["../host"]}},  # relative, climbing out of the config's directory
    ],
)
def test_a_candidate_reads_no_file_of_the_host(tmp_path: Path, named: dict[str, object]) -> None:
    # Before: each was read, and its problem quoted the secret (an apiVersion, a kind,
    # a key name); a policy path of "/" walked the whole filesystem and answered a
    # problem per YAML file on the host (9,276 of them, 1.8 MB, in 40 s).
    host = _host_files(tmp_path / "host")
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    text = json.dumps({**BASE, **named}).replace("HOST", str(host))
    problems = _control(config_dir).validate(text)
    assert problems, text
    assert not any(SECRET in problem for problem in problems), problems
    assert all("is outside the files this gateway reads" in problem for problem in problems)


def test_every_file_setting_is_confined(tmp_path: Path) -> None:
    host = _host_files(tmp_path / "host")
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    outside = str(host / "manifest.yaml")
    gpu = {
        **backend("gpu", "https://127.0.0.1:9", "m"),
        "tls": {"ca_file": outside, "client_cert_file": outside, "client_key_file": outside},
    }
    candidate = {
        **BASE,
        "backends": [gpu],
        "provenance": {
            "dir": str(host),
            "origin": "example.com/log",
            "signing_key_file": outside,
            "previous_signing_key_files": [outside],
            "high_water_file": outside,
        },
    }
    problems = _control(config_dir).validate(json.dumps(candidate))
    where = sorted(problem.split(":")[1] for problem in problems)
    assert where == [
        "backends[0].tls.ca_file",
        "backends[0].tls.client_cert_file",
        "backends[0].tls.client_key_file",
        "provenance.dir",
        "provenance.high_water_file",
        "provenance.previous_signing_key_files[0]",
        "provenance.signing_key_file",
    ], problems


def test_a_link_out_of_the_config_directory_is_outside(tmp_path: Path) -> None:
    host = _host_files(tmp_path / "host")
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "policies").symlink_to(host)
    problems = _control(config_dir).validate(
        json.dumps({**BASE, "policy": {"paths": ["policies"]}})
    )
    assert len(problems) == 1 and "outside the files" in problems[0], problems
    assert SECRET not in problems[0]


def test_the_files_the_running_config_reads_are_still_validated(tmp_path: Path) -> None:
    """Under the config's directory, under a directory the running config names
    elsewhere (a policy volume mounted beside the config) and a file it names there (a
    keys file from a secret volume), a candidate's files are read and checked as
    `owngate serve` would."""
    config_dir = tmp_path / "config"
    (config_dir / "policies").mkdir(parents=True)
    (config_dir / "policies" / "bad.yaml").write_text("apiVersion: nope-1\nkind: Policy\n")
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    (mounted / "p.yaml").write_text(versioned_policy("1", "eu"))
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    running: dict[str, object] = {
        **BASE,
        "policy": {"paths": [str(mounted)]},
        "keys_file": str(secrets / "k.yaml"),
    }
    control = _control(config_dir, running)
    (mounted / "more").mkdir()
    (mounted / "more" / "bad.yaml").write_text("apiVersion: nope-2\nkind: Policy\n")
    (secrets / "k.yaml").write_text("tenants: {acme: [nope-3]}\n")
    for named, shown in (
        ({"policy": {"paths": ["policies"]}}, "nope-1"),
        ({"policy": {"paths": [str(mounted / "more")]}}, "nope-2"),
        ({"keys_file": str(secrets / "k.yaml")}, "acme"),
    ):
        problems = control.validate(json.dumps({**BASE, **named}))
        assert any(shown in problem for problem in problems), problems
        assert not any("outside the files" in problem for problem in problems), problems


def test_a_high_water_file_is_confined_under_a_relative_config_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`owngate serve --config deploy/gateway.yaml` runs with a relative config
    directory. The high-water file was checked as `high_water_path` (already joined to
    it) joined to it again, `deploy/deploy/../x`, so `../x` passed for a file under
    `deploy/` and the gateway read `x` beside it: its first line came back quoted."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "deploy").mkdir()
    (tmp_path / "host.txt").write_text(f"{SECRET}\n1\n{'A' * 43}=\n\n- x\n")
    log = {"dir": "log", "origin": "example.com/log", "signing_key_file": "k"}
    candidate = {**BASE, "provenance": {**log, "high_water_file": "../host.txt"}}
    problems = _control(Path("deploy")).validate(json.dumps(candidate))
    assert not any(SECRET in problem for problem in problems), problems
    refused = "candidate:provenance.high_water_file: '../host.txt' is outside the files"
    assert any(problem.startswith(refused) for problem in problems), problems


def test_a_high_water_file_under_the_config_directory_is_not_quoted(tmp_path: Path) -> None:
    """A file of the gateway's own (a provider's credentials mounted beside the config)
    named as a candidate's high-water file: its second line, a secret, was quoted as a
    checkpoint size that is not a decimal number."""
    config_dir = tmp_path / "config"
    (config_dir / "secrets").mkdir(parents=True)
    (config_dir / "secrets" / "credentials").write_text(
        f"[default]\naws_secret_access_key = {SECRET}\nregion = eu\n\n[other]\n"
    )
    log = {"dir": "log", "origin": "example.com/log", "signing_key_file": "k"}
    candidate = {**BASE, "provenance": {**log, "high_water_file": "secrets/credentials"}}
    problems = _control(config_dir).validate(json.dumps(candidate))
    assert any("does not hold a checkpoint" in problem for problem in problems), problems
    assert not any(SECRET in problem for problem in problems), problems


@pytest.mark.parametrize(
    "named",
    [
        {"keys_file": "a\0b"},
        {"policy": {"paths": ["a\0b"]}},
        {"provenance": {"dir": "a\0b", "origin": "example.com/log", "signing_key_file": "k"}},
    ],
)
def test_a_path_holding_a_nul_byte_is_a_problem(tmp_path: Path, named: dict[str, object]) -> None:
    # Before: resolving it raised ValueError, the admin API's 500 (internal error)
    problems = _control(tmp_path).validate(json.dumps({**BASE, **named}))
    assert any("a path may not hold a NUL byte" in problem for problem in problems), problems


def test_a_link_to_a_host_file_inside_a_named_directory_is_outside(tmp_path: Path) -> None:
    """Only the path named was resolved: a directory under the config's holding a link to
    a host file (a link to a directory is never walked, one to a file is read) had that
    file read, and its key name, the secret, quoted."""
    host = _host_files(tmp_path / "host")
    config_dir = tmp_path / "config"
    (config_dir / "policies").mkdir(parents=True)
    (config_dir / "policies" / "spec.yaml").symlink_to(host / "spec.yaml")
    problems = _control(config_dir).validate(
        json.dumps({**BASE, "policy": {"paths": ["policies"]}})
    )
    assert not any(SECRET in problem for problem in problems), problems
    assert len(problems) == 1 and "a link to a file outside" in problems[0], problems


def test_a_link_the_running_config_reads_is_still_validated(tmp_path: Path) -> None:
    """A link in the running config's own policy directory (to a file shared elsewhere)
    is a file the running config reads: a candidate naming that directory is checked."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "p.yaml").write_text(versioned_policy("1", "eu"))
    config_dir = tmp_path / "config"
    (config_dir / "policies").mkdir(parents=True)
    (config_dir / "policies" / "p.yaml").symlink_to(shared / "p.yaml")
    running: dict[str, object] = {**BASE, "policy": {"paths": ["policies"]}}
    control = _control(config_dir, running)
    (shared / "p.yaml").write_text("apiVersion: nope-4\nkind: Policy\n")
    problems = control.validate(json.dumps(running))
    assert any("nope-4" in problem for problem in problems), problems
    assert not any("outside the files" in problem for problem in problems), problems


def test_a_policy_path_too_long_to_list_is_a_problem(tmp_path: Path) -> None:
    # Listing a named policy directory's files (to resolve each) raised OSError for a
    # name past the filesystem's limit: the admin API's 500
    problems = _control(tmp_path).validate(json.dumps({**BASE, "policy": {"paths": ["x" * 300]}}))
    assert problems == [f"candidate:policy.paths[0]: {'x' * 300!r} cannot be listed"], problems


def test_a_log_directory_too_long_to_look_at_is_a_problem(tmp_path: Path) -> None:
    # Before: the preflight's `exists()` raised OSError (ENAMETOOLONG): the admin API's 500
    log = {"dir": "x" * 300, "origin": "example.com/log", "signing_key_file": "k"}
    problems = _control(tmp_path).validate(json.dumps({**BASE, "provenance": log}))
    assert any(p.startswith(f"provenance.dir {tmp_path / ('x' * 300)}: ") for p in problems)


def test_a_policy_path_named_again_is_walked_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A candidate of 256 KiB names some 60,000 policy paths: each listing of the same
    directory again was the check's own walk added to the loader's (the parse held)."""
    import gateway.admin.candidate_files as candidate_files
    from gateway.policy.source import discover

    walked: list[list[Path]] = []

    def counted(paths: list[Path]) -> tuple[list[Path], list[PolicyIssue]]:
        walked.append(paths)
        return discover(paths)

    monkeypatch.setattr(candidate_files, "discover", counted)
    (tmp_path / "policies").mkdir()
    problems = _control(tmp_path).validate(
        json.dumps({**BASE, "policy": {"paths": ["policies"] * 1000}})
    )
    assert problems, problems  # no *.yaml files there: the loader's problem
    assert len(walked) == 1, len(walked)


def test_a_policy_path_named_again_is_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The policy set listed a directory once per time a config named it (its stamps and
    its read): a candidate naming one directory with 50 subdirectories 20,000 times (240
    KB) held the parse for 38 s of CPU; 0.7 s once each is listed once."""
    import gateway.policy.source as source

    walked: list[Path] = []
    walk = source._walk

    def counted(root: Path, skip_tests: bool) -> tuple[list[Path], list[PolicyIssue]]:
        walked.append(root)
        return walk(root, skip_tests)

    monkeypatch.setattr(source, "_walk", counted)
    (tmp_path / "policies").mkdir()
    _control(tmp_path).validate(json.dumps({**BASE, "policy": {"paths": ["policies"] * 1000}}))
    assert len(walked) == 2, len(walked)  # the candidate's check, then the policy loader
