"""`owngate policy explain|test|check` decide with the set the gateway enforces. For a
gateway.yaml without a `policy` section that is the built-in private-only set, not
whatever `./policies` holds: the commands used to load `./policies`, so a security team
saw "refused: EU only" and passing cases while the gateway served the request from a
private backend in the US."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gateway.cli import policy as policy_cli
from gateway.config import load_config
from gateway.policy_set import BUILTIN_POLICY_ID, TrustPolicies

CONFIG = """\
backends:
  - id: gpu-us
    kind: vllm
    base_url: http://127.0.0.1:1
    models: [{name: llama}]
    region: us-east-1
    owner: ml
tenants:
  - {id: acme, models: ["*"]}
"""
EU_ONLY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: eu-only}
spec:
  tenants: [acme]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback: {mode: never}
"""
EU_CASES = """\
apiVersion: policy.owngate.dev/v1
kind: PolicyTest
metadata: {id: eu-only-cases}
cases:
  - name: nothing outside the EU
    input: {tenant: acme, model: llama}
    expect: {private: [], refusal: eu-only/residency}
"""


def owngate(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="owngate")
    policy_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


@pytest.fixture
def no_policy_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A gateway.yaml without `policy:`, beside a ./policies that it does not load."""
    for name in ("TENANT", "MODEL", "DATA_CLASS", "JSON", "STRICT", "PATHS", "TESTS"):
        monkeypatch.delenv(f"OWNGATE_POLICY_{name}", raising=False)
    config = tmp_path / "gateway.yaml"
    config.write_text(CONFIG)
    (tmp_path / "policies" / "tests").mkdir(parents=True)
    (tmp_path / "policies" / "eu-only.yaml").write_text(EU_ONLY)
    (tmp_path / "policies" / "tests" / "cases.yaml").write_text(EU_CASES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OWNGATE_CONFIG", str(config))
    return config


def test_explain_says_what_the_gateway_does(
    no_policy_section: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gateway = TrustPolicies(load_config(no_policy_section), no_policy_section.parent)
    enforced = gateway.current.decide("acme", "llama", None)
    assert enforced.private == ("gpu-us",)  # the built-in set: private backends, anywhere

    assert owngate("policy", "explain", "--tenant", "acme", "--model", "llama", "--json") == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == enforced.as_dict()
    assert "has no policy section" in captured.err and BUILTIN_POLICY_ID in captured.err


def test_cases_for_files_the_gateway_does_not_load_fail(
    no_policy_section: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert owngate("policy", "test", "policies/tests") == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "0 passed, 1 failed" in out
    # Naming the files tests them, as before.
    assert owngate("policy", "test", "policies/tests", "--policies", "policies") == 0


def test_check_reports_the_set_the_gateway_enforces(
    no_policy_section: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert owngate("policy", "check") == 0
    captured = capsys.readouterr()
    assert f"<builtin>: ok (1 policies, 1 tenants, 7 rules, 0 warnings) {BUILTIN_POLICY_ID} 1 " in (
        captured.out
    )
    assert "has no policy section" in captured.err
