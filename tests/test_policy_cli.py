"""`owngate policy check|explain|test` on the shipped examples and on broken input; the
package's public surface and import hygiene."""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import gateway.policy
from gateway.cli import policy as policy_cli

ROOT = Path(__file__).resolve().parent.parent
CONFIG = str(ROOT / "deploy" / "gateway.example.yaml")
POLICIES = str(ROOT / "policies")
CASES = str(ROOT / "policies" / "tests")


def owngate(*argv: str) -> int:
    """Run `owngate policy ...` in-process, as `gateway.cli.main` dispatches it."""
    parser = argparse.ArgumentParser(prog="owngate")
    policy_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


@pytest.fixture(autouse=True)
def _no_policy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TENANT", "MODEL", "DATA_CLASS", "JSON", "STRICT", "PATHS", "TESTS"):
        monkeypatch.delenv(f"OWNGATE_POLICY_{name}", raising=False)
    monkeypatch.setenv("OWNGATE_CONFIG", CONFIG)


def test_shipped_examples_pass_their_tests(capsys: pytest.CaptureFixture[str]) -> None:
    assert owngate("policy", "test", CASES, "--policies", POLICIES) == 0
    out = capsys.readouterr().out
    assert "0 failed" in out and "FAIL" not in out
    assert "rule coverage: 20/21 rules exercised (95%)" in out
    assert "  startup-default/residency" in out  # allows everywhere: nothing to exclude


def test_shipped_examples_check_clean(capsys: pytest.CaptureFixture[str]) -> None:
    assert owngate("policy", "check", POLICIES, "--strict") == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "ok (3 policies, 4 tenants, 21 rules, 0 warnings) owngate-examples 2025-06-01 " in (
        captured.out
    )


def test_paths_default_to_the_configs_policy_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./policies here: the config's policy.paths are used
    assert owngate("policy", "check") == 0
    assert "policies: ok (3 policies" in capsys.readouterr().out
    assert owngate("policy", "test") == 0
    assert "26 passed, 0 failed" in capsys.readouterr().out
    single = str(ROOT / "policies" / "bank-strict.yaml")
    assert owngate("policy", "test", "--policies", single) == 1
    assert "no test cases found" in capsys.readouterr().err


def test_test_fails_on_a_wrong_expectation_and_on_low_coverage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = tmp_path / "cases.yaml"
    cases.write_text(
        "apiVersion: policy.owngate.dev/v1\nkind: PolicyTest\nmetadata: {id: wrong}\ncases:\n"
        "  - name: expects the US server\n"
        "    input: {tenant: clinic-eu, model: llama-3.1-8b}\n"
        "    expect: {private: [gpu-us], refusal: eu-health/nope}\n"
    )
    assert owngate("policy", "test", str(cases), "--policies", POLICIES) == 1
    out = capsys.readouterr().out
    assert f"FAIL {cases}:5: wrong: expects the US server" in out
    assert "expects rule 'eu-health/nope', which no loaded policy defines" in out
    assert "private: expected ['gpu-us'], got ['gpu-vllm', 'cpu-llamacpp']" in out
    code = owngate("policy", "test", CASES, "--policies", POLICIES, "--min-coverage", "100")
    assert code == 1
    assert "coverage below --min-coverage 100%" in capsys.readouterr().err
    cases.write_text("apiVersion: policy.owngate.dev/v1\nkind: PolicyTest\nmetadata: {id: x}\n")
    assert owngate("policy", "test", str(cases), "--policies", POLICIES) == 1
    assert f"{cases}:1:1: error: cases: required key is missing" in capsys.readouterr().err


def test_check_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        (ROOT / "policies" / "bank-strict.yaml")
        .read_text()
        .replace("max_days: zero", "max_days: 1.5")
    )
    assert owngate("policy", "check", str(bad)) == 1
    assert (
        f"{bad}:15:5: error: spec.retention.max_days: max_days is 'zero'" in capsys.readouterr().err
    )
    warned = tmp_path / "warned.yaml"
    warned.write_text(
        (ROOT / "policies" / "bank-strict.yaml").read_text().replace("[eu]", "[eu, ch]")
    )
    assert owngate("policy", "check", str(warned)) == 0
    err = capsys.readouterr().err
    assert "warning: spec.residency.allow[1]: 'ch' matches no configured backend region" in err
    assert "tenants.startup: has no policy" in err  # only the bank's policy was given
    assert owngate("policy", "check", str(warned), "--strict") == 1
    capsys.readouterr()
    assert owngate("policy", "check", str(warned), "--config", str(tmp_path / "none.yaml")) == 1
    assert "cannot read" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        owngate("policy", "check", "--no-such-flag")
    assert info.value.code == 2


def test_explain_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    code = owngate(
        "policy", "explain", "--policies", POLICIES,
        "--tenant", "clinic-eu", "--model", "gpt-4o-mini", "--data-class", "phi", "--json",
    )  # fmt: skip
    assert code == 0
    decision = json.loads(capsys.readouterr().out)
    assert set(decision) == {
        "tenant", "model", "data_class", "default_rule", "private", "hosted", "fallback",
        "saturation_threshold", "fallback_rule", "refusal", "trace", "policy_id",
        "policy_version", "policy_digest",
    }  # fmt: skip
    assert decision["refusal"]["rule"] == "eu-health/data_classes.phi/fallback"
    assert decision["refusal"]["message"].startswith("policy eu-health/data_classes.phi/fallback:")
    assert decision["trace"] == [
        {
            "backend": "openai",
            "verdict": "excluded",
            "rule": "eu-health/residency",
            "reason": "region 'us' is outside residency.allow [eu]",
        },
        {
            "backend": "azure-eu",
            "verdict": "excluded",
            "rule": "eu-health/data_classes.phi/fallback",
            "reason": "fallback.mode is never: hosted backends receive no traffic",
        },
    ]
    assert (decision["policy_id"], decision["policy_version"]) == ("eu-health", "4")
    assert decision["policy_digest"].startswith("sha256:")


def test_explain_text_and_env_defaults(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OWNGATE_POLICY_TENANT", "startup")
    monkeypatch.setenv("OWNGATE_POLICY_MODEL", "llama-3.1-8b")
    monkeypatch.setenv("OWNGATE_POLICY_PATHS", POLICIES)
    assert owngate("policy", "explain") == 0
    out = capsys.readouterr().out
    assert "policy startup-default version 1" in out
    assert "eligible, in order:" in out
    assert "4. azure-eu      hosted   startup-default/fallback" in out
    assert owngate("policy", "explain", "--data-class", "secret") == 1
    assert "policy startup-default/data_classes: data class 'secret'" in capsys.readouterr().err


def test_explain_without_a_label_shows_the_policy_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ("policy", "explain", "--policies", POLICIES, "--tenant", "clinic-eu")
    assert owngate(*base, "--model", "llama-3.1-8b") == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "tenant clinic-eu, model llama-3.1-8b, data class phi (no label sent: the default, "
        "rule eu-health/default_data_class)\n"
    )
    assert "fallback: never (rule eu-health/data_classes.phi/fallback)" in out
    assert owngate(*base, "--model", "llama-3.1-8b", "--json") == 0
    decision = json.loads(capsys.readouterr().out)
    assert (decision["data_class"], decision["default_rule"]) == (
        "phi",
        "eu-health/default_data_class",
    )
    assert decision["hosted"] == []
    assert owngate(*base, "--model", "llama-3.1-8b", "--data-class", "deidentified") == 0
    out = capsys.readouterr().out
    assert "no label sent" not in out and "azure-eu" in out


def test_explain_requires_tenant_and_model() -> None:
    with pytest.raises(SystemExit) as info:
        owngate("policy", "explain", "--model", "m")
    assert info.value.code == 2


def test_policy_without_verb_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert owngate("policy") == 2
    assert "check" in capsys.readouterr().out


def test_public_surface_is_declared() -> None:
    modules = [gateway.policy] + [
        importlib.import_module(f"gateway.policy.{m.name}")
        for m in pkgutil.iter_modules(gateway.policy.__path__)
    ]
    for module in modules:
        assert module.__doc__, module.__name__
        assert all(hasattr(module, name) for name in module.__all__), module.__name__
    api = {"BackendFacts", "TraceEntry", "Refusal", "Decision", "PolicyError", "PolicyIssue"}
    api |= {"PolicySet", "UnknownDataClass", "load_policies", "check_policies"}
    assert api <= set(gateway.policy.__all__)


def test_policy_package_imports_no_server_code() -> None:
    code = (
        "import sys, gateway.policy, gateway.policy.cases\n"
        "bad = {'uvicorn', 'fastapi', 'starlette', 'redis', 'httpx', 'litellm'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in bad))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


def test_bench_prints_cached_and_uncached_percentiles() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "policy.py"), "--calls", "2000", "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    rows = json.loads(done.stdout)["rows"]
    assert {(r["set"], r["mode"]) for r in rows} == {
        (s, m) for s in ("examples", "large") for m in ("cached", "uncached")
    }
    assert all(0 < r["p50_us"] <= r["p99_us"] for r in rows)
