"""`owngate policy check|explain|test`: the security team's tools for trust policies.

All three load policies with the same code the gateway runs, against the backends and
tenants of gateway.yaml (`--config`). Exit codes: 0 ok, 1 failed check (invalid files,
a failing case, coverage below `--min-coverage`, warnings under `--strict`), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.cli._common import env_default, load_or_report, usage
from gateway.config import GatewaySettings
from gateway.config.facts import backend_facts
from gateway.policy import (
    Decision,
    PolicyIssue,
    PolicySet,
    UnknownDataClass,
    check_policies,
    check_sources,
)
from gateway.policy.cases import TestReport, default_case_paths, load_cases, run_cases
from gateway.policy.labels import InvalidLabel, one_label
from gateway.policy_set import BUILTIN_POLICY_ID, builtin_source
from gateway.provenance.audit.shown import MAX_SHOWN_MESSAGE, shown

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("policy", help="check, explain and test trust policies")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")

    check = verbs.add_parser(
        "check",
        help="validate policy files",
        description="Validate policy files and directories: every error with file, line and "
        "column; warnings for rules that cannot match the configured backends, for tenants "
        "without a policy, for a tenant, model and data class whose requests would all go "
        "to a hosted provider (every private backend serving the model excluded), and for a "
        "retention.max_days of 0 or zero whose other spelling would decide differently. "
        "Exit 0 when valid, 1 when not (or, under --strict, when there are warnings).",
    )
    check.add_argument(
        "paths",
        nargs="*",
        default=_env_paths("OWNGATE_POLICY_PATHS"),
        metavar="PATH",
        help="policy files or directories (env OWNGATE_POLICY_PATHS; default: the config's "
        "policy.paths, else the gateway's built-in set)",
    )
    check.add_argument(
        "--strict",
        action="store_true",
        default=env_default("OWNGATE_POLICY_STRICT", "") not in ("", "0", "false"),
        help="treat warnings as failures (env OWNGATE_POLICY_STRICT=1)",
    )
    check.add_argument(
        "--document",
        action="store_true",
        help="write the canonical policy document to stdout (the RFC 8785 bytes whose "
        "SHA-256 is the digest records hold; the summary goes to stderr)",
    )
    _config_flag(check)
    check.set_defaults(handler=_check)

    explain = verbs.add_parser(
        "explain",
        help="show the decision for one request",
        description="Show which backends may serve a request, in order, and the rule behind "
        "every verdict.",
    )
    _policies_flag(explain)
    _config_flag(explain)
    for flag, env, what in (
        ("--tenant", "OWNGATE_POLICY_TENANT", "tenant id"),
        ("--model", "OWNGATE_POLICY_MODEL", "public model name"),
    ):
        default = os.environ.get(env)
        explain.add_argument(
            flag, default=default, required=default is None, help=f"{what} (env {env})"
        )
    explain.add_argument(
        "--data-class",
        default=os.environ.get("OWNGATE_POLICY_DATA_CLASS"),
        help="data-class label, as the request header carries it; without it, the policy's "
        "default_data_class for the tenant applies, if any (env OWNGATE_POLICY_DATA_CLASS)",
    )
    explain.add_argument(
        "--json",
        action="store_true",
        default=env_default("OWNGATE_POLICY_JSON", "") not in ("", "0", "false"),
        help="print the decision as JSON (env OWNGATE_POLICY_JSON=1)",
    )
    explain.set_defaults(handler=_explain)

    test = verbs.add_parser(
        "test",
        help="run policy test cases and report rule coverage",
        description="Run case files (kind PolicyTest: input and expected decision) against "
        "the policies; report failures and which rules at least one case exercised. Exit 1 "
        "on any failure.",
    )
    test.add_argument(
        "paths",
        nargs="*",
        default=_env_paths("OWNGATE_POLICY_TESTS"),
        metavar="PATH",
        help="case files or directories (env OWNGATE_POLICY_TESTS; default: tests/ in each "
        "policy directory)",
    )
    _policies_flag(test)
    _config_flag(test)
    test.add_argument(
        "--min-coverage",
        type=float,
        default=float(env_default("OWNGATE_POLICY_MIN_COVERAGE", "0")),
        metavar="PERCENT",
        help="fail when fewer rules are exercised (env OWNGATE_POLICY_MIN_COVERAGE, default 0)",
    )
    test.set_defaults(handler=_test)
    parser.set_defaults(handler=lambda _args: usage(parser))


def _env_paths(env: str) -> list[str]:
    value = os.environ.get(env, "")
    return [p for p in value.split(os.pathsep) if p]


def _policies_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policies",
        action="append",
        metavar="PATH",
        help="policy file or directory, repeatable (env OWNGATE_POLICY_PATHS, "
        f"{os.pathsep}-separated; default: the config's policy.paths, else the gateway's "
        "built-in set)",
    )


def _config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        default=env_default("OWNGATE_CONFIG", "gateway.yaml"),
        help="gateway.yaml supplying backends and tenants (env OWNGATE_CONFIG, "
        "default ./gateway.yaml)",
    )


def _print_issues(issues: Sequence[PolicyIssue], severity: str) -> None:
    for issue in issues:
        location = issue.file
        if issue.line is not None:
            location += f":{issue.line}" + (f":{issue.column}" if issue.column else "")
        subject = f"{shown(issue.path)}: " if issue.path else ""
        message = shown(issue.message, MAX_SHOWN_MESSAGE)
        print(f"{shown(location)}: {severity}: {subject}{message}", file=sys.stderr)


def _load(
    paths: Sequence[str], config_path: str
) -> tuple[PolicySet | None, list[str], list[PolicyIssue], GatewaySettings | None]:
    """Load the config, then the policies: the paths given, else the config's
    `policy.paths` (relative to the config file), else the built-in set that the
    gateway enforces for a config without a `policy` section (never some other files:
    what these commands decide must be what the gateway does)."""
    config = load_or_report(config_path)
    if config is None:
        return None, [], [], None
    facts = list(backend_facts(config))
    tenants = [t.id for t in config.tenants]
    models = {t.id: t.models for t in config.tenants}
    if not paths and config.policy is None:
        print(
            f"note: {shown(config_path)} has no policy section, so the gateway enforces its "
            f"built-in set ({BUILTIN_POLICY_ID}: private backends only, never a hosted one); "
            "deciding with that set. Name policy files (PATH or --policies) to use them.",
            file=sys.stderr,
        )
        source = builtin_source(tenants)
        policy_set, errors, warnings = check_sources(
            [source], facts, tenants, tenants_source=config_path, tenant_models=models
        )
        _print_issues(errors, "error")
        return policy_set, [source[0]], warnings, config
    if not paths:
        assert config.policy is not None
        base = Path(config_path).parent
        paths = [str(base / p) for p in config.policy.paths]
    policy_set, errors, warnings = check_policies(
        paths, facts, tenants, tenants_source=config_path, tenant_models=models
    )
    _print_issues(errors, "error")
    return policy_set, list(paths), warnings, config


def _check(args: argparse.Namespace) -> int:
    policy_set, paths, warnings, config = _load(args.paths, args.config)
    if config is None:
        return 1
    _print_issues(warnings, "warning")
    if policy_set is None:
        print(f"{' '.join(paths)}: invalid (see the errors above)", file=sys.stderr)
        return 1
    policies = policy_set.policy_ids()
    summary = (
        f"{len(policies)} policies, {len(policy_set.tenants())} tenants, "
        f"{len(policy_set.rules)} rules, {len(warnings)} warnings"
    )
    identity = f"{policy_set.id} {policy_set.version} {policy_set.digest}"
    if args.strict and warnings:
        print(f"{' '.join(paths)}: failed under --strict ({summary}) {identity}", file=sys.stderr)
        return 1
    if args.document:  # what an auditor re-decides a record from (docs/provenance.md)
        sys.stdout.buffer.write(policy_set.canonical)
        sys.stdout.flush()
    print(
        f"{' '.join(paths)}: ok ({summary}) {identity}",
        file=sys.stderr if args.document else sys.stdout,
    )
    return 0


def _explain(args: argparse.Namespace) -> int:
    policy_set, _facts, _warnings, _config = _load(
        args.policies or _env_paths("OWNGATE_POLICY_PATHS"), args.config
    )
    if policy_set is None:
        return 1
    try:
        # Read as the gateway reads the header: comma-separated values must agree.
        label = None if args.data_class is None else one_label([args.data_class])
        decision = policy_set.decide(args.tenant, args.model, label)
    except InvalidLabel as exc:
        print(
            f"error: the data-class label {exc}: the gateway refuses it (400 unknown_data_class)",
            file=sys.stderr,
        )
        return 1
    except UnknownDataClass as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(decision.as_dict(), indent=2))
    else:
        print(_render(decision, policy_set))
    return 0


def _render(decision: Decision, policy_set: PolicySet) -> str:
    label = f", data class {decision.data_class}" if decision.data_class else ""
    if decision.default_rule is not None:
        label += f" (no label sent: the default, rule {decision.default_rule})"
    lines = [
        f"tenant {decision.tenant}, model {decision.model}{label}",
        f"policy {decision.policy_id} version {decision.policy_version} "
        f"(set {policy_set.id} {policy_set.version}, {decision.policy_digest})",
    ]
    threshold = (
        f", above {decision.saturation_threshold:g} waiting per slot"
        if decision.saturation_threshold is not None
        else ""
    )
    lines.append(f"fallback: {decision.fallback}{threshold} (rule {decision.fallback_rule})")
    if decision.refusal is not None:
        lines.append(f"refused: {decision.refusal.message}")
    entries = {t.backend: t for t in decision.trace}
    width = max((len(t.backend) for t in decision.trace), default=0)
    rule_width = max((len(t.rule) for t in decision.trace), default=0)
    if decision.eligible:
        lines.append("eligible, in order:")
        for n, backend in enumerate(decision.eligible, 1):
            tier = "private" if backend in decision.private else "hosted"
            entry = entries[backend]
            lines.append(
                f"  {n}. {backend:<{width}}  {tier:<7}  {entry.rule:<{rule_width}}  {entry.reason}"
            )
    excluded = [t for t in decision.trace if t.verdict == "excluded"]
    if excluded:
        lines.append("excluded:")
        lines += [f"  - {t.backend:<{width}}  {t.rule:<{rule_width}}  {t.reason}" for t in excluded]
    return "\n".join(lines)


def _test(args: argparse.Namespace) -> int:
    policy_set, paths, _warnings, _config = _load(
        args.policies or _env_paths("OWNGATE_POLICY_PATHS"), args.config
    )
    if policy_set is None:
        return 1
    cases = args.paths or default_case_paths(paths)
    suites, errors = load_cases(cases)
    _print_issues(errors, "error")
    if errors:
        return 1
    if not suites:
        print("error: no test cases found (give case files or directories)", file=sys.stderr)
        return 1
    report = run_cases(policy_set, suites)
    _print_report(report)
    if report.failed:
        return 1
    if report.coverage * 100 < args.min_coverage:
        print(f"coverage below --min-coverage {args.min_coverage:g}%", file=sys.stderr)
        return 1
    return 0


def _print_report(report: TestReport) -> None:
    for result in report.results:
        where = f"{result.file}:{result.line}" if result.line else result.file
        status = "PASS" if result.passed else "FAIL"
        # What a case file says (its name, expected values) is shown escaped: a name
        # holding `\r` or ESC could print over a FAIL line.
        print(f"{status} {shown(where)}: {shown(result.suite)}: {shown(result.name)}")
        for failure in result.failures:
            print(f"     {shown(failure, MAX_SHOWN_MESSAGE)}")
    passed = len(report.results) - report.failed
    print(f"{passed} passed, {report.failed} failed")
    covered = report.exercised & report.rules
    print(
        f"rule coverage: {len(covered)}/{len(report.rules)} rules exercised ({report.coverage:.0%})"
    )
    missing = sorted(report.rules - report.exercised)
    if missing:
        print("not exercised by any case:")
        print("\n".join(f"  {rule}" for rule in missing))
