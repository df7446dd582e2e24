"""Warnings for `owngate policy check`: rules that cannot match what is configured.

None of these makes a set invalid (the configured backends change more often than the
policies do), but each usually means a typo or a policy that will refuse more than its
author expects: a residency entry or allow/deny entry that names no configured backend,
a fallback that can find no compliant hosted backend, a data class that loosens (and is
therefore ignored), a tenant with no policy, a residency glob that reads like a
jurisdiction and spans countries (`eu-*` covers London and Zurich), a deny by
jurisdiction code that cannot see a region the built-in table does not place, and a
`models.allow` entry that admits a hosted model by its public name alone.

Two foot-guns get the real engine run over them (gateway/policy/lint_decisions.py), since
they send traffic somewhere its author did not mean it to go without a single refusal to
notice:

- *hosted only*: for some tenant, model and data class (or none), every private backend
  serving the model is excluded while a hosted one is eligible, so every such request
  goes to a hosted provider (`providers: {allow: [anthropic]}`, or private backends not
  declared `zero_data_retention: true` under `max_days: zero`). A model that no private
  backend serves at all is hosted by design and not reported.
- *retention spelling*: a `retention.max_days` of `0` or `zero` whose other spelling
  would decide differently for the configured backends (`zero` also demands the
  `zero_data_retention: true` declaration; `0` accepts `days: 0`, the default of a
  backend that declares nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from gateway.policy import jurisdictions
from gateway.policy.engine import PolicySet
from gateway.policy.lint_decisions import Warn, hosted_only, retention_spellings
from gateway.policy.rules import Globs, Sections, _spellings, target_matches
from gateway.policy.schema import PolicyDocument, Residency
from gateway.policy.source import Document, YamlPath
from gateway.policy.types import FALLBACK_MODES, BackendFacts, PolicyIssue

__all__ = ["lint"]


def lint(
    policies: Sequence[tuple[Document, PolicyDocument]],
    policy_set: PolicySet,
    backends: Sequence[BackendFacts],
    tenants: Sequence[str],
    tenants_source: str,
    tenant_models: Mapping[str, Collection[str]] | None = None,
) -> list[PolicyIssue]:
    """Warnings for a valid set. `tenant_models` limits the models a tenant is checked
    for (a tenant's `models` from gateway.yaml, `*` for all; absent: all)."""
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
        retention_spellings(policy, policy_set, backends, warn)
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
    documents = {policy.metadata.id: document for document, policy in policies}
    for tenant in tenants:
        allowed = (tenant_models or {}).get(tenant)
        warnings += hosted_only(tenant, allowed, policy_set, backends, documents)
    return warnings


_GLOB = frozenset("*?[")  # what makes a residency entry a shell pattern
_Match = Callable[[str, tuple[str, ...]], str | None]


def _warner(document: Document, warnings: list[PolicyIssue]) -> Warn:
    def warn(path: YamlPath, message: str) -> None:
        warnings.append(document.issue(path, message))

    return warn


def _entries(path: YamlPath, rules: Sections, backends: Sequence[BackendFacts], warn: Warn) -> None:
    regions = sorted({b.region.lower() for b in backends})
    if rules.residency is not None:
        for i, entry in enumerate(rules.residency.allow):
            spans = _countries_of_glob(entry)
            if len(spans) > 1:
                examples = ", ".join(f"{spans[c]} in {c}" for c in sorted(spans))
                warn(
                    (*path, "residency", "allow", i),
                    f"{entry!r} is a region glob, not a jurisdiction: it allows regions of "
                    f"{len(spans)} countries ({examples}); to mean a jurisdiction, name its "
                    "code (eu, de, ...), which lists its regions one by one",
                )
        _unplaced(path, rules.residency, backends, warn)
        _partial_denies(path, rules.residency, backends, warn)
        for key, entries in (("allow", rules.residency.allow), ("deny", rules.residency.deny)):
            for i, entry in enumerate(entries):
                patterns = jurisdictions.expand(entry)
                # A deny holds for a backend declared by a code when it covers any part.
                matches = jurisdictions.overlap if key == "deny" else jurisdictions.region_matches
                if not any(matches(r, patterns) for r in regions):
                    warn(
                        (*path, "residency", key, i),
                        f"{entry!r} matches no configured backend region "
                        f"(regions: {', '.join(regions)})",
                    )
    fields: dict[str, Callable[[BackendFacts], Iterable[str]]] = {
        "backends": lambda b: (b.id,),
        "providers": lambda b: b.providers(),
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
    _public_name_allows(path, rules, backends, warn)
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


def _public_name_allows(
    path: YamlPath, rules: Sections, backends: Sequence[BackendFacts], warn: Warn
) -> None:
    """Warn at a `models.allow` entry that admits a hosted backend's model only by the
    public name gateway.yaml gives it (`llama*` admits `llama-x` sent as `openai/gpt-4o`):
    the operator's naming, not the policy, then decides which provider model is allowed."""
    if rules.models is None or rules.models.allow is None:
        return
    allow = Globs(rules.models.allow)
    for i, entry in enumerate(rules.models.allow):
        glob = Globs((entry,))
        hits = sorted(
            f"{b.id} ({name!r} sent as {sent!r})"
            for b in backends
            for name, sent in b.provider_models
            if glob.first_match(name) is not None
            and all(allow.first_match(s) is None for s in _spellings(sent))
        )
        if hits:
            warn(
                (*path, "models", "allow", i),
                f"{entry!r} admits hosted {', '.join(hits)} by the public name gateway.yaml "
                "gives it, not by the provider model it sends, which no allow entry names: "
                "add the provider model to models.allow if that model is meant",
            )


def _unplaced(
    path: YamlPath, residency: Residency, backends: Sequence[BackendFacts], warn: Warn
) -> None:
    """Warn at the first jurisdiction code in `residency.deny` when a backend the allow
    list admits is declared in a region the built-in table does not place (`virginia`,
    `dc-1`): no code can deny it, so `deny: [us]` does not hold for it."""
    codes = [i for i, entry in enumerate(residency.deny) if jurisdictions.is_jurisdiction(entry)]
    if not codes:
        return
    placed = _placed_regions()

    def covered(region: str, entries: Sequence[str]) -> bool:
        return any(jurisdictions.region_matches(region, jurisdictions.expand(e)) for e in entries)

    unplaced = [
        b
        for b in backends
        if b.region.lower() not in placed
        and covered(b.region, residency.allow)
        and not any(
            jurisdictions.overlap(b.region, jurisdictions.expand(e)) for e in residency.deny
        )
    ]
    if unplaced:
        named = ", ".join(f"{b.id} ({b.region!r})" for b in unplaced)
        warn(
            (*path, "residency", "deny", codes[0]),
            f"residency.allow admits {named}, whose region the built-in table does not place "
            "in any jurisdiction, so no code in residency.deny can exclude it; deny the region "
            "by name, or declare a region name the table lists",
        )


def _partial_denies(
    path: YamlPath, residency: Residency, backends: Sequence[BackendFacts], warn: Warn
) -> None:
    """Warn at a `residency.deny` glob that covers regions of a country while the allow
    list admits a backend declared in another region of it (`us-*` denies AWS us-east-1,
    not Azure's eastus): it reads like a jurisdiction and is not one."""
    country_of = {
        region: country
        for country, regions in jurisdictions.COUNTRIES.items()
        for region in regions
        if country != "gb" and not jurisdictions.is_jurisdiction(region)
    }

    def covered(region: str, entries: Sequence[str], match: _Match) -> bool:
        return any(match(region, jurisdictions.expand(e)) for e in entries)

    for i, entry in enumerate(residency.deny):
        spans = _countries_of_glob(entry)
        missed = [
            b
            for b in backends
            if country_of.get(b.region.lower()) in spans
            and covered(b.region, residency.allow, jurisdictions.region_matches)
            and not covered(b.region, residency.deny, jurisdictions.overlap)
        ]
        if missed:
            country = country_of[missed[0].region.lower()]
            named = ", ".join(f"{b.id} ({b.region!r})" for b in missed)
            warn(
                (*path, "residency", "deny", i),
                f"{entry!r} is a region glob, not a jurisdiction: it denies {spans[country]} "
                f"in {country} but not {named}, also in {country}; to deny a jurisdiction, "
                f"name its code ({country})",
            )


def _placed_regions() -> frozenset[str]:
    """Every region name and code the jurisdiction table places somewhere."""
    names = {*jurisdictions.COUNTRIES, *jurisdictions.GROUPS}
    return frozenset(names.union(*jurisdictions.COUNTRIES.values()))


def _countries_of_glob(entry: str) -> dict[str, str]:
    """Country code -> the first region of the built-in table a residency glob covers
    there (`eu-*` covers eu-west-2, London, and eu-central-2, Zurich). Empty for a
    jurisdiction code, a plain region name, and `*` (written to mean everywhere)."""
    if jurisdictions.is_jurisdiction(entry) or entry.strip("*") == "" or not _GLOB & set(entry):
        return {}
    glob = Globs((entry,))
    spans: dict[str, str] = {}
    for country, regions in jurisdictions.COUNTRIES.items():
        if country == "gb":  # the same regions as uk, under ISO's code
            continue
        hit = next(
            (r for r in regions if not jurisdictions.is_jurisdiction(r) and glob.first_match(r)),
            None,
        )
        if hit is not None:
            spans[country] = hit
    return spans


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
