"""`owngate policy check|explain|test` on the shipped examples and on broken input; the
package's public surface and import hygiene."""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import gateway.policy
from gateway.cli import policy as policy_cli
from gateway.provenance import generate_signing_key
from tests.helpers.paths import REPO_ROOT

CONFIG = str(REPO_ROOT / "deploy" / "gateway.example.yaml")
POLICIES = str(REPO_ROOT / "policies")
CASES = str(REPO_ROOT / "policies" / "tests")
# What `owngate demo` fills in for its attested backends: a sidecar's key and a pin.
# one key per attested backend (one key for two is refused)
DEMO_ATTEST_KEYS = {
    name: generate_signing_key(f"owngate-demo.internal/{name}")[1] for name in ("vllm", "llamacpp")
}
DEMO_PIN = "sha256//" + "A" * 43 + "="


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
    single = str(REPO_ROOT / "policies" / "bank-strict.yaml")
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


def test_test_refuses_a_case_file_with_a_line_break_only_yaml_sees(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A carriage return alone is a line break to YAML, not to a diff or an editor. Read
    with read_text it became a newline before the check looked: the case a review shows
    (which fails) was swallowed into a hidden case's name, and `policy test` passed."""
    cr, given = "\r", "input: {tenant: clinic-eu, model: llama-3.1-8b}"
    hidden = f"{cr}    {given}{cr}    expect: {{private: [gpu-vllm, cpu-llamacpp]}}"
    cases = tmp_path / "cases.yaml"
    cases.write_bytes(
        (
            "apiVersion: policy.owngate.dev/v1\nkind: PolicyTest\nmetadata: {id: hid}\ncases:\n"
            f'  - name: runs on our own servers  # reviewed{hidden}{cr}  - name: "\n'
            f"    {given}\n    expect:\n"
            f'      private: [gpu-us]  # the US server only{cr}  "{hidden}\n'
        ).encode()
    )
    assert cases.read_bytes().count(b"\n") == 8  # what a review shows: one case, 8 lines
    assert owngate("policy", "test", str(cases), "--policies", POLICIES) == 1
    captured = capsys.readouterr()
    assert "passed" not in captured.out
    assert f"{cases}:5:46: error: U+000D CARRIAGE RETURN" in captured.err


def test_test_prints_what_a_case_file_says_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A case's name and expected values are the case file's text: a `\\r` or ESC in them
    could print a PASS over the FAIL line, so they are shown escaped (`shown`)."""
    cases = tmp_path / "cases.yaml"
    cases.write_text(
        "apiVersion: policy.owngate.dev/v1\nkind: PolicyTest\nmetadata: {id: forged}\ncases:\n"
        '  - name: "x\\r\\e[2KPASS all"\n'
        "    input: {tenant: clinic-eu, model: llama-3.1-8b}\n"
        '    expect: {refusal: "eu-health/\\e[8mnope"}\n'
    )
    assert owngate("policy", "test", str(cases), "--policies", POLICIES) == 1
    out = capsys.readouterr().out
    assert [c for line in out.split("\n") for c in line if not c.isprintable()] == []
    assert f"FAIL {cases}:5: forged: x\\x0d\\x1b[2KPASS all" in out
    assert "refusal: expected eu-health/\\x1b[8mnope" in out


def test_check_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        (REPO_ROOT / "policies" / "bank-strict.yaml")
        .read_text()
        .replace("max_days: zero", "max_days: 1.5")
    )
    assert owngate("policy", "check", str(bad)) == 1
    assert (
        f"{bad}:15:5: error: spec.retention.max_days: max_days is 'zero'" in capsys.readouterr().err
    )
    warned = tmp_path / "warned.yaml"
    warned.write_text(
        (REPO_ROOT / "policies" / "bank-strict.yaml").read_text().replace("[eu]", "[eu, ch]")
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


FOOTGUN_CONFIG = """\
backends:
  - id: gpu
    kind: vllm
    base_url: http://127.0.0.1:1
    models: [{name: llama}]
    region: eu-west-1
    owner: ml
    retention: {days: 0, zero_data_retention: ZDR}
  - id: anthropic
    kind: hosted
    provider: anthropic
    api_key_env: ANTHROPIC_API_KEY
    models:
      - {name: llama, provider_model: anthropic/claude-3-5-haiku-latest}
      - {name: claude, provider_model: anthropic/claude-3-5-haiku-latest}
    region: eu-central-1
    owner: anthropic
    retention: {days: 0, zero_data_retention: true}
policy: {paths: [policies]}
tenants:
  - {id: acme, models: ["*"]}
  - {id: hosted-only, models: [claude]}
"""

FOOTGUN_POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: acme}
spec:
  tenants: [acme, hosted-only]
  residency: {allow: ["*"]}
  retention: {max_days: 30}
  fallback:
    mode: when_private_unavailable
    to: [{provider: anthropic}]
  data_classes:
    confidential:
      retention: {max_days: 30}
"""


def _footgun(tmp_path: Path, replace: dict[str, str] | None = None, *, zdr: bool = True) -> str:
    """A config (one private backend, one hosted provider serving the same model) and a
    policy with `replace` applied; returns the config's path."""
    config = tmp_path / "gateway.yaml"
    config.write_text(FOOTGUN_CONFIG.replace("ZDR", "true" if zdr else "false"))
    policy = FOOTGUN_POLICY
    for old, new in (replace or {}).items():
        policy = policy.replace(old, new)
    (tmp_path / "policies").mkdir(exist_ok=True)
    (tmp_path / "policies" / "p.yaml").write_text(policy)
    return str(config)


def test_check_is_quiet_when_the_private_tier_is_eligible(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `claude` is served by the hosted provider only: hosted by design, not a foot-gun.
    assert owngate("policy", "check", "--strict", "--config", _footgun(tmp_path)) == 0
    assert capsys.readouterr().err == ""


def test_check_warns_when_a_providers_allow_list_sends_everything_hosted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _footgun(tmp_path, {"  residency:": "  providers: {allow: [anthropic]}\n  residency:"})
    assert owngate("policy", "check", "--config", config) == 0
    err = capsys.readouterr().err
    policy = tmp_path / "policies" / "p.yaml"
    for label in ("unlabelled", "data class 'confidential'"):
        assert (
            f"{policy}:6:3: warning: spec.providers: tenant 'acme', model 'llama', {label}: no "
            "private backend is eligible but hosted anthropic is, so every such request goes "
            "to a hosted provider (when_private_unavailable finds the private tier empty); "
            "private backends excluded: gpu by acme/providers (provider 'ml' is not in "
            "providers.allow [anthropic])"
        ) in err
    assert "tenant 'hosted-only'" not in err  # it may use only the hosted-only model
    assert owngate("policy", "check", "--strict", "--config", config) == 1
    assert "failed under --strict (1 policies, 2 tenants, 9 rules, 2 warnings)" in (
        capsys.readouterr().err
    )
    monkeypatch.setenv("OWNGATE_POLICY_STRICT", "1")
    assert owngate("policy", "check", "--config", config) == 1


def test_check_warns_when_zero_retention_excludes_undeclared_private_backends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The review's case: private servers without `zero_data_retention: true` under a
    zero-retention data class sent every such request to the hosted provider."""
    replaced = {"      retention: {max_days: 30}": "      retention: {max_days: zero}"}
    config = _footgun(tmp_path, replaced, zdr=False)
    assert owngate("policy", "check", "--strict", "--config", config) == 1
    err = capsys.readouterr().err
    policy = tmp_path / "policies" / "p.yaml"
    assert (
        f"{policy}:13:7: warning: spec.data_classes.confidential.retention: tenant 'acme', "
        "model 'llama', data class 'confidential': no private backend is eligible but hosted "
        "anthropic is"
    ) in err
    assert (
        "gpu by acme/data_classes.confidential/retention (retention.max_days is zero: the "
        "backend is not declared zero-data-retention (days 0, zero_data_retention false))"
    ) in err
    assert "'llama', unlabelled" not in err  # the policy's own retention admits gpu
    assert (
        f"{policy}:13:19: warning: spec.data_classes.confidential.retention.max_days: is zero, "
        "which excludes gpu (private) (declared retention days 0 without "
        "zero_data_retention: true), where max_days: 0 would admit them"
    ) in err


def test_check_warns_when_max_days_0_and_zero_decide_differently(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    zero_days = {
        "  retention: {max_days: 30}\n  fallback": "  retention: {max_days: 0}\n  fallback"
    }
    # Both backends declare zero_data_retention: 0 and zero decide the same.
    assert owngate("policy", "check", "--strict", "--config", _footgun(tmp_path, zero_days)) == 0
    capsys.readouterr()
    # gpu declares days 0 (the default) but no zero_data_retention: 0 admits it, zero not.
    config = _footgun(tmp_path, zero_days, zdr=False)
    assert owngate("policy", "check", "--strict", "--config", config) == 1
    err = capsys.readouterr().err
    assert (
        f"{tmp_path / 'policies' / 'p.yaml'}:7:15: warning: spec.retention.max_days: is 0, "
        "which admits gpu (private) (declared retention days 0 without zero_data_retention: "
        "true; days 0 is also the default of a backend that declares nothing), where "
        "max_days: zero would exclude them"
    ) in err
    assert "1 warnings" in err


@pytest.mark.parametrize(
    ("config", "env"),
    [
        ("deploy/gateway.compose.yaml", {}),
        (
            "deploy/k8s/base/gateway.yaml",
            {
                "POD_NAME": "p-0",
                "OWNGATE_LOG_HOST": "h",
                "OWNGATE_REDIS_URL": "redis://r",
                "OWNGATE_ADMIN_TOKEN_HASH": "sha256:" + "c" * 64,
                "OWNGATE_METRICS_TOKEN_HASH": "sha256:" + "d" * 64,
            },
        ),
        (
            "gateway/demo/gateway.yaml",
            {
                "OWNGATE_DEMO_VLLM_URL": "https://127.0.0.1:1",
                "OWNGATE_DEMO_LLAMACPP_URL": "https://127.0.0.1:2",
                "OWNGATE_DEMO_PKI_DIR": "pki",
                "OWNGATE_DEMO_VLLM_PIN": DEMO_PIN,
                "OWNGATE_DEMO_LLAMACPP_PIN": DEMO_PIN,
                "OWNGATE_DEMO_VLLM_ATTEST_KEY": DEMO_ATTEST_KEYS["vllm"],
                "OWNGATE_DEMO_LLAMACPP_ATTEST_KEY": DEMO_ATTEST_KEYS["llamacpp"],
                "OWNGATE_DEMO_HOSTED_URL": "http://127.0.0.1:3",
                "OWNGATE_DEMO_LOG_DIR": "log",
                "OWNGATE_DEMO_LOG_KEY": "log.key",
                "OWNGATE_DEMO_KEY_HASH": "sha256:" + "a" * 64,
                "OWNGATE_DEMO_EU_KEY_HASH": "sha256:" + "b" * 64,
                "OWNGATE_DEMO_ADMIN_PORT": "9091",
                "OWNGATE_DEMO_OPERATOR_TOKEN_HASH": "sha256:" + "c" * 64,
                "OWNGATE_DEMO_SECURITY_TOKEN_HASH": "sha256:" + "d" * 64,
                "OWNGATE_DEMO_AUDITOR_TOKEN_HASH": "sha256:" + "e" * 64,
            },
        ),
    ],
)
def test_shipped_configs_check_clean_under_strict(
    config: str,
    env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert owngate("policy", "check", "--strict", "--config", str(REPO_ROOT / config)) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "0 warnings" in captured.out


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


@pytest.mark.bench
def test_bench_prints_cached_and_uncached_percentiles() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "policy", "--calls", "2000", "--json"],
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


def test_explain_reads_a_label_as_the_gateway_reads_its_header(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The gateway takes "phi, PHI" (values that agree) as phi and refuses "phi,public"
    # and a blank label; explain said "phi, phi" was an undefined class.
    base = ("policy", "explain", "--policies", POLICIES, "--tenant", "clinic-eu")
    model = ("--model", "llama-3.1-8b", "--json")
    assert owngate(*base, *model, "--data-class", "phi") == 0
    plain = json.loads(capsys.readouterr().out)
    assert owngate(*base, *model, "--data-class", " phi, PHI") == 0
    assert json.loads(capsys.readouterr().out) == plain
    for refused in ("phi,public", " "):
        assert owngate(*base, *model, "--data-class", refused) == 1
        assert "the gateway refuses it (400 unknown_data_class)" in capsys.readouterr().err


def test_check_document_writes_the_bytes_the_digest_covers(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """An auditor re-decides a record from this document: it holds what each code a
    backend is declared in (`region: us`, `region: fr` in the example config) stands for
    once a residency deny reads it, and its SHA-256 is the digest the record signs."""
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "apiVersion: policy.owngate.dev/v1\nkind: Policy\nmetadata: {id: p}\n"
        "spec:\n  tenants: [acme]\n  residency: {allow: ['*'], deny: [us-east-1]}\n"
        "  retention: {max_days: any}\n  fallback: {mode: never}\n"
    )
    assert owngate("policy", "check", str(policy), "--document") == 0
    captured = capsysbinary.readouterr()
    digest = "sha256:" + hashlib.sha256(captured.out).hexdigest()
    assert captured.err.decode().rstrip().endswith(f" {digest}")
    table = json.loads(captured.out)["jurisdictions"]
    assert table["us"] == list(gateway.policy.jurisdictions.expand("us"))
    assert "us-east-1" in table["us"] and "eu-west-3" in table["fr"]
