"""Policy test cases, as OPA has them: input → expected decision, plus rule coverage.

A case file (`kind: PolicyTest`, usually under `policies/tests/`) lists cases, each an
input (tenant, model, data class: read as the gateway reads its header, so `phi, PHI`
is `phi` and `phi,public` is refused) and the parts of the decision it expects: the
eligible private and hosted backends in order, the refusal rule (or `null` for none),
the fallback mode and rule, the data class decided for (a policy's default when the
input has none), which rule excluded or admitted given backends, rule ids that must
appear, or the error `unknown_data_class`. Only what a case states is checked.

A rule counts as exercised when it admitted or excluded a backend, refused a request,
rejected a label or supplied a default label in at least one case; coverage is
exercised rules over all rules.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway.policy.engine import PolicySet
from gateway.policy.labels import InvalidLabel, one_label
from gateway.policy.schema import API_VERSION, Metadata
from gateway.policy.source import Document, discover, read_documents, validate
from gateway.policy.types import Decision, FallbackMode, PolicyIssue, UnknownDataClass
from gateway.small_files import read_small_file

__all__ = [
    "MAX_CASE_FILE",
    "CaseResult",
    "PolicyTestDocument",
    "TestReport",
    "default_case_paths",
    "load_cases",
    "parse_cases",
    "run_cases",
]


# A case file is read whole and parsed like a policy file (gateway/policy/loader.py's
# MAX_POLICY_FILE): a larger one is refused, naming the file.
MAX_CASE_FILE = 1024 * 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CaseInput(_Strict):
    tenant: StrictStr
    model: StrictStr
    data_class: StrictStr | None = None


class Expect(_Strict):
    private: tuple[StrictStr, ...] | None = None
    hosted: tuple[StrictStr, ...] | None = None
    refusal: StrictStr | None = None  # `refusal: null` expects no refusal
    fallback: FallbackMode | None = None
    fallback_rule: StrictStr | None = None
    excluded: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    admitted: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    rules: tuple[StrictStr, ...] = ()
    error: Literal["unknown_data_class"] | None = None
    data_class: StrictStr | None = None  # the class decided for; `data_class: null`: none

    @field_validator("private", "hosted", "fallback", "fallback_rule", "error", mode="before")
    @classmethod
    def _written_null(cls, value: object, info: ValidationInfo) -> object:
        # Left out, these check nothing; written empty (`hosted:` with its entries commented
        # out, `hosted: null`) they look like "expects none" and would check nothing too:
        # a case that cannot fail. Refused, as policy files refuse an empty `allow:`.
        if value is None:
            hint = " ([] expects none)" if info.field_name in ("private", "hosted") else ""
            raise ValueError(
                f"{info.field_name} is written with no value, which would check nothing: "
                f"write what the decision must hold{hint}, or leave the key out"
            )
        return value

    @field_validator("excluded", "admitted", "rules")
    @classmethod
    def _not_empty(cls, value: Collection[str], info: ValidationInfo) -> Collection[str]:
        if not value:  # an empty map or list of expectations checks nothing
            raise ValueError(
                f"{info.field_name} is empty, which would check nothing: name what the "
                "decision must hold, or leave the key out"
            )
        return value

    @model_validator(mode="after")
    def _says_something(self) -> Expect:
        if not self.model_fields_set:
            raise ValueError("expect states nothing: a case must check part of the decision")
        if self.error is not None and self.model_fields_set - {"error", "rules"}:
            raise ValueError("a case expecting an error can check only `rules` besides it")
        return self


class Case(_Strict):
    name: StrictStr = Field(min_length=1)
    input: CaseInput
    expect: Expect


class PolicyTestDocument(_Strict):
    apiVersion: Literal["policy.owngate.dev/v1"]  # the key as written in YAML
    kind: Literal["PolicyTest"]
    metadata: Metadata
    cases: tuple[Case, ...] = Field(min_length=1)


@dataclass(frozen=True)
class CaseResult:
    file: str
    line: int | None
    suite: str
    name: str
    failures: tuple[str, ...]
    exercised: frozenset[str]

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class TestReport:
    results: tuple[CaseResult, ...]
    rules: frozenset[str]  # every rule the policy set defines
    exercised: frozenset[str]

    @property
    def failed(self) -> int:
        return sum(not r.passed for r in self.results)

    @property
    def coverage(self) -> float:
        return len(self.exercised & self.rules) / len(self.rules) if self.rules else 1.0


def default_case_paths(policy_paths: Sequence[Path | str]) -> list[Path]:
    """Where the cases of a policy set are by default: `tests/` in each of its policy
    directories (what `owngate policy test` reads when given no case paths)."""
    return [Path(p) / "tests" for p in policy_paths if Path(p).is_dir()]


def load_cases(
    paths: Sequence[Path | str],
) -> tuple[list[tuple[Document, PolicyTestDocument]], list[PolicyIssue]]:
    files, errors = discover((Path(p) for p in paths), skip_tests=False)
    suites: list[tuple[Document, PolicyTestDocument]] = []
    for file in files:
        try:
            # As bytes: read_text would turn a lone carriage return into a newline, a line
            # break diffs and reviews do not show that read_documents must see to refuse.
            # Bounded as a policy file is: a case file of 100 MB (or a log moved into
            # `tests/`) was read whole and composed, holding the CLI, or the admin API's
            # worker and its memory, for minutes.
            text = read_small_file(file, MAX_CASE_FILE).decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            errors.append(PolicyIssue(str(file), None, None, "", f"cannot read: {exc}"))
            continue
        found, issues = parse_cases(str(file), text)
        suites += found
        errors += issues
    return suites, errors


def parse_cases(
    file: str, text: str
) -> tuple[list[tuple[Document, PolicyTestDocument]], list[PolicyIssue]]:
    """The case suites of one case file's text (`file` names it in the issues)."""
    suites: list[tuple[Document, PolicyTestDocument]] = []
    documents, errors = read_documents(file, text)
    for document in documents:
        data = document.data
        if not isinstance(data, dict) or data.get("kind") != "PolicyTest":
            errors.append(document.issue(("kind",), "expected kind PolicyTest"))
            continue
        if data.get("apiVersion") != API_VERSION:
            message = f"unsupported apiVersion (this owngate reads {API_VERSION})"
            errors.append(document.issue(("apiVersion",), message))
            continue
        suite, issues = validate(document, PolicyTestDocument)
        errors += issues
        if suite is not None:
            suites.append((document, suite))
    return suites, errors


def run_cases(
    policy_set: PolicySet, suites: Sequence[tuple[Document, PolicyTestDocument]]
) -> TestReport:
    results = []
    for document, suite in suites:
        for i, case in enumerate(suite.cases):
            failures, exercised = _run(policy_set, case)
            line = document.marks.get(("cases", i), (None, None))[0]
            results.append(
                CaseResult(document.file, line, suite.metadata.id, case.name, failures, exercised)
            )
    exercised = frozenset().union(*(r.exercised for r in results))
    return TestReport(tuple(results), policy_set.rules, exercised)


def _run(policy_set: PolicySet, case: Case) -> tuple[tuple[str, ...], frozenset[str]]:
    expect, given = case.expect, case.input
    failures = [
        f"expects rule {rule!r}, which no loaded policy defines"
        for rule in _named_rules(expect)
        if rule not in policy_set.rules
    ]
    try:
        # Read as the gateway reads the header (gateway/api/proxy.py): values that agree
        # are one class; values that disagree or a blank one name no class ("").
        label = None if given.data_class is None else one_label([given.data_class])
    except InvalidLabel:
        label = ""
    try:
        decision = policy_set.decide(given.tenant, given.model, label)
    except UnknownDataClass as exc:
        exercised = frozenset({exc.rule})
        if expect.error != "unknown_data_class":
            failures.append(f"unexpected error: {exc}")
        failures += [f"rule {r!r} was not exercised" for r in expect.rules if r not in exercised]
        return tuple(failures), exercised
    exercised = decision.rules
    if expect.error is not None:
        failures.append(f"expected error {expect.error}, got a decision")
    failures += _compare(expect, decision, exercised)
    return tuple(failures), exercised


def _named_rules(expect: Expect) -> list[str]:
    named = [*expect.rules, *expect.excluded.values(), *expect.admitted.values()]
    named += [r for r in (expect.refusal, expect.fallback_rule) if r is not None]
    return named


def _compare(expect: Expect, decision: Decision, exercised: frozenset[str]) -> list[str]:
    failures = []
    for name in ("private", "hosted"):
        wanted = getattr(expect, name)
        got = getattr(decision, name)
        if wanted is not None and tuple(wanted) != got:
            failures.append(f"{name}: expected {list(wanted)}, got {list(got)}")
    if "refusal" in expect.model_fields_set:
        got_rule = None if decision.refusal is None else decision.refusal.rule
        if got_rule != expect.refusal:
            failures.append(f"refusal: expected {expect.refusal}, got {got_rule}")
    if "data_class" in expect.model_fields_set and expect.data_class != decision.data_class:
        failures.append(f"data_class: expected {expect.data_class}, got {decision.data_class}")
    if expect.fallback is not None and expect.fallback != decision.fallback:
        failures.append(f"fallback: expected {expect.fallback}, got {decision.fallback}")
    if expect.fallback_rule is not None and expect.fallback_rule != decision.fallback_rule:
        failures.append(
            f"fallback_rule: expected {expect.fallback_rule}, got {decision.fallback_rule}"
        )
    verdicts = {t.backend: t for t in decision.trace}
    for verdict, wanted_map in (("excluded", expect.excluded), ("admitted", expect.admitted)):
        for backend, rule in wanted_map.items():
            entry = verdicts.get(backend)
            if entry is None:
                failures.append(f"{backend}: expected {verdict} by {rule}, but not in the trace")
            elif (entry.verdict, entry.rule) != (verdict, rule):
                failures.append(
                    f"{backend}: expected {verdict} by {rule}, got {entry.verdict} by "
                    f"{entry.rule} ({entry.reason})"
                )
    failures += [f"rule {r!r} was not exercised" for r in expect.rules if r not in exercised]
    return failures
