"""Warnings for `owngate policy check`: rules that cannot match what is configured.

None of these makes a set invalid (the configured backends change more often than the
policies do), but each usually means a typo or a policy that will refuse more than its
author expects: a residency entry or allow/deny entry that names no configured backend,
a fallback that can find no compliant hosted backend, a data class that loosens (and is
therefore ignored), a tenant with no policy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from gateway.policy import jurisdictions
from gateway.policy.engine import PolicySet
from gateway.policy.rules import Globs, Sections, target_matches
from gateway.policy.schema import PolicyDocument
from gateway.policy.source import Document, YamlPath
from gateway.policy.types import FALLBACK_MODES, BackendFacts, PolicyIssue

__all__ = ["lint"]


def lint(
    policies: Sequence[tuple[Document, PolicyDocument]],
    policy_set: PolicySet,
    backends: Sequence[BackendFacts],
    tenants: Sequence[str],
    tenants_source: str,
) -> list[PolicyIssue]:
    warnings: list[PolicyIssue] = []
    for document, policy in policies:
        warn = _warner(document, warnings)
        spec = policy.spec
        if not spec.tenants:
            warn(("spec", "tenants"), "binds no tenants: this policy applies to nobody")
        for i, tenant in enumerate(spec.tenants):
            if tenants and tenant not in tenants:
                warn(
                    ("spec", "tenants", i), f"tenant {tenant!r} is not defined in {tenants_source}"
                )
        _entries(("spec",), spec, backends, warn)
        for name, rules in spec.data_classes.items():
            path: YamlPath = ("spec", "data_classes", name)
            _entries(path, rules, backends, warn)
            if rules.fallback is not None:
                base_rank = FALLBACK_MODES.index(spec.fallback.mode)
                if FALLBACK_MODES.index(rules.fallback.mode) > base_rank:
                    warn(
                        (*path, "fallback", "mode"),
                        f"is looser than the policy's fallback ({spec.fallback.mode}); a data "
                        "class only tightens, so the policy's fallback applies",
                    )
        _reachability(document, policy, policy_set, backends, warn)
    for tenant in tenants:
        if policy_set.policy_for(tenant) is None:
            warnings.append(
                PolicyIssue(
                    tenants_source,
                    None,
                    None,
                    f"tenants.{tenant}",
                    "has no policy: deny by default, every request of this tenant is refused",
                )
            )
    return warnings


Warn = Callable[[YamlPath, str], None]


def _warner(document: Document, warnings: list[PolicyIssue]) -> Warn:
    def warn(path: YamlPath, message: str) -> None:
        warnings.append(document.issue(path, message))

    return warn


def _entries(path: YamlPath, rules: Sections, backends: Sequence[BackendFacts], warn: Warn) -> None:
    regions = sorted({b.region.lower() for b in backends})
    if rules.residency is not None:
        for key, entries in (("allow", rules.residency.allow), ("deny", rules.residency.deny)):
            for i, entry in enumerate(entries):
                patterns = jurisdictions.expand(entry)
                if not any(jurisdictions.region_matches(r, patterns) for r in regions):
                    warn(
                        (*path, "residency", key, i),
                        f"{entry!r} matches no configured backend region "
                        f"(regions: {', '.join(regions)})",
                    )
    fields: dict[str, Callable[[BackendFacts], Iterable[str]]] = {
        "backends": lambda b: (b.id,),
        "providers": lambda b: (b.provider,),
        "models": lambda b: b.models,
    }
    for section, values_of in fields.items():
        lists = getattr(rules, section)
        if lists is None:
            continue
        values = {v for b in backends for v in values_of(b)}
        for key, entries in (("allow", lists.allow or ()), ("deny", lists.deny)):
            for i, entry in enumerate(entries):
                if not any(Globs((entry,)).first_match(v) for v in values):
                    warn(
                        (*path, section, key, i), f"{entry!r} matches no configured {section[:-1]}"
                    )
    if rules.fallback is not None and rules.fallback.to is not None:
        for i, target in enumerate(rules.fallback.to):
            hits = [b for b in backends if target_matches(target, b)]
            if not hits:
                warn((*path, "fallback", "to", i), "matches no configured backend")
            elif all(b.tier == "private" for b in hits):
                warn(
                    (*path, "fallback", "to", i),
                    "matches only private backends; fallback.to chooses hosted backends",
                )


def _reachability(
    document: Document,
    policy: PolicyDocument,
    policy_set: PolicySet,
    backends: Sequence[BackendFacts],
    warn: Warn,
) -> None:
    """Warn when a policy or data class admits no backend, or its fallback none."""
    compiled = policy_set.compiled(policy.metadata.id)
    labels: list[str | None] = [None, *policy.spec.data_classes]
    for label in labels:
        scopes = (compiled.base,) if label is None else (compiled.base, compiled.classes[label])
        path: YamlPath = ("spec",) if label is None else ("spec", "data_classes", label)
        admitted = [
            b
            for b in backends
            if all(s.static[b.id] is None for s in scopes)
            and any(all(s.model_verdicts[m] is None for s in scopes) for m in b.models)
        ]
        what = "this policy" if label is None else f"data class {label!r}"
        if not admitted:
            warn(path, f"no configured backend complies with {what}: every request is refused")
            continue
        mode = compiled.fallbacks[label].mode
        if mode != "never" and not any(b.tier == "hosted" for b in admitted):
            warn(
                (*path, "fallback") if label is None else path,
                f"fallback is allowed ({mode}) but no configured hosted backend complies with "
                f"{what}: fallback will find nothing",
            )
