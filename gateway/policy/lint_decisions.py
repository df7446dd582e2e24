"""The two `owngate policy check` warnings that run the real engine over a valid set.

Each finds a foot-gun that sends traffic somewhere its author did not mean it to go
without a single refusal to notice; gateway/policy/lint.py runs them with its other checks.

- *hosted only* (`hosted_only`): for some tenant, model and data class, every private
  backend serving the model is excluded while a hosted one is eligible.
- *retention spelling* (`retention_spellings`): a `retention.max_days` of `0` or `zero`
  whose other spelling would decide differently for the configured backends; the policy
  is compiled again with the other spelling and every decision compared.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from gateway.policy.compiler import compile_set
from gateway.policy.engine import PolicySet
from gateway.policy.schema import PolicyDocument, Retention
from gateway.policy.source import Document, YamlPath
from gateway.policy.types import BackendFacts, PolicyIssue

__all__ = ["Warn", "hosted_only", "retention_spellings"]

Warn = Callable[[YamlPath, str], None]


def hosted_only(
    tenant: str,
    allowed: Collection[str] | None,
    policy_set: PolicySet,
    backends: Sequence[BackendFacts],
    documents: Mapping[str, Document],
) -> list[PolicyIssue]:
    """Every (model, data class) of `tenant` whose requests would all go hosted: the
    private backends serving the model are all excluded, a hosted one is eligible."""
    policy_id = policy_set.policy_for(tenant)
    if policy_id is None:
        return []  # denied everything: lint reports the tenant as having no policy
    document = documents[policy_id]
    private = {b.id for b in backends if b.tier == "private"}
    served = sorted({m for b in backends if b.tier == "private" for m in b.models})
    models = served if allowed is None or "*" in allowed else [m for m in served if m in allowed]
    labels: list[str | None] = [None, *sorted(policy_set.data_classes(tenant))]
    found: list[PolicyIssue] = []
    for model in models:
        for label in labels:
            decision = policy_set.decide_uncached(tenant, model, label)
            if decision.private or not decision.hosted:
                continue
            excluded = [t for t in decision.trace if t.backend in private]
            rules = list(dict.fromkeys(t.rule for t in excluded))
            why = "; ".join(f"{t.backend} by {t.rule} ({t.reason})" for t in excluded)
            what = "unlabelled" if label is None else f"data class {label!r}"
            message = (
                f"tenant {tenant!r}, model {model!r}, {what}: no private backend is eligible "
                f"but hosted {', '.join(decision.hosted)} is, so every such request goes to a "
                f"hosted provider ({decision.fallback} finds the private tier empty); private "
                f"backends excluded: {why}"
            )
            found.append(document.issue(_rule_path(rules[0]), message))
    return found


def _rule_path(rule: str) -> YamlPath:
    """The YAML path of a rule id: `p/residency` or `p/data_classes.phi/retention`."""
    _policy, *scope, section = rule.split("/")
    if scope and scope[0].startswith("data_classes."):
        return ("spec", "data_classes", scope[0].removeprefix("data_classes."), section)
    return ("spec", section)


def retention_spellings(
    policy: PolicyDocument, policy_set: PolicySet, backends: Sequence[BackendFacts], warn: Warn
) -> None:
    """Warn where `max_days: 0` and `max_days: zero` would decide differently: the same
    policy is compiled with the other spelling and every decision compared."""
    spec = policy.spec
    sections: list[tuple[str | None, Retention]] = [(None, spec.retention)]
    sections += [(n, r.retention) for n, r in spec.data_classes.items() if r.retention]
    for label, retention in sections:
        written = retention.max_days
        if written not in (0, "zero") or not spec.tenants:
            continue
        other: int | str = 0 if written == "zero" else "zero"
        swapped = compile_set(None, [_with_max_days(policy, label, other)], backends)
        here, there = _eligible(policy_set, policy, backends), _eligible(swapped, policy, backends)
        changed = sorted({backend for _label, _model, backend in here ^ there})
        if not changed:
            continue
        tiers = {b.id: b.tier for b in backends}
        differ = ", ".join(f"{b} ({tiers[b]})" for b in changed)
        path: YamlPath = ("spec",) if label is None else ("spec", "data_classes", label)
        declared = "declared retention days 0 without zero_data_retention: true"
        if written == "zero":
            message = (
                f"is zero, which excludes {differ} ({declared}), where max_days: 0 would "
                "admit them. If they keep nothing, declare zero_data_retention: true in "
                "gateway.yaml; if 0 days is what you mean, write max_days: 0"
            )
        else:
            message = (
                f"is 0, which admits {differ} ({declared}; days 0 is also the default of a "
                "backend that declares nothing), where max_days: zero would exclude them. "
                "Write max_days: zero to require the zero-data-retention declaration"
            )
        warn((*path, "retention", "max_days"), message)


def _with_max_days(
    policy: PolicyDocument, label: str | None, max_days: int | str
) -> PolicyDocument:
    """`policy` with one retention section's max_days spelled differently."""
    spec = policy.spec
    if label is None:
        retention = spec.retention.model_copy(update={"max_days": max_days})
        spec = spec.model_copy(update={"retention": retention})
    else:
        rules = spec.data_classes[label]
        assert rules.retention is not None
        retention = rules.retention.model_copy(update={"max_days": max_days})
        classes = {**spec.data_classes, label: rules.model_copy(update={"retention": retention})}
        spec = spec.model_copy(update={"data_classes": classes})
    return policy.model_copy(update={"spec": spec})


def _eligible(
    policy_set: PolicySet, policy: PolicyDocument, backends: Sequence[BackendFacts]
) -> set[tuple[str | None, str, str]]:
    """(data class, model, backend) for every backend eligible for a request of the
    policy's first tenant, over every served model and data class."""
    tenant = policy.spec.tenants[0]
    models = sorted({m for b in backends for m in b.models})
    labels: list[str | None] = [None, *sorted(policy.spec.data_classes)]
    found: set[tuple[str | None, str, str]] = set()
    for model in models:
        for label in labels:
            decision = policy_set.decide_uncached(tenant, model, label)
            found.update((label, model, b) for b in decision.eligible)
    return found
