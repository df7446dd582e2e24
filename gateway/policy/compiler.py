"""Validated policy documents → normalized form, digest and compiled `PolicySet`.

The normalized form is what the digest covers: every default filled in, names lower
case, allow/deny lists sorted and de-duplicated (they are sets), `fallback.to` kept in
order (it is a sequence), descriptions dropped (they do not change a decision), `require`
where it requires something, and the expansion of every jurisdiction code a decision
reads, so the digest pins what `eu` meant to the owngate that loaded it: the codes the
policies' residency entries name, and, where a policy has a residency deny, the codes
backends are declared in (`region: de` is excluded by `deny: [eu-central-1]` because `de`
stands for `eu-central-1`, among others). Key order and formatting of the files cannot
change it. The backend facts digest holds each code-declared region's expansion too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from gateway.canonical import canonical_json
from gateway.policy import jurisdictions
from gateway.policy.engine import CompiledPolicy, PolicySet
from gateway.policy.rules import Sections, combine_fallback, compile_scope
from gateway.policy.schema import (
    API_VERSION,
    DEFAULT_DATA_CLASS_HEADER,
    Fallback,
    Lists,
    PolicyDocument,
    PolicySetDocument,
)
from gateway.policy.types import BackendFacts, TraceEntry

__all__ = ["DEFAULT_SET_ID", "compile_set", "normalize_policy", "sha256"]

DEFAULT_SET_ID = "owngate"


def sha256(value: object) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


def compile_set(
    set_doc: PolicySetDocument | None,
    policies: Sequence[PolicyDocument],
    backends: Sequence[BackendFacts],
) -> PolicySet:
    ids = [b.id for b in backends]
    if len(set(ids)) != len(ids):
        raise ValueError("backend ids must be unique")
    normalized = [normalize_policy(p) for p in sorted(policies, key=lambda p: p.metadata.id)]
    compiled = [_compile_policy(p, backends) for p in policies]
    header = DEFAULT_DATA_CLASS_HEADER if set_doc is None else set_doc.spec.data_class_header
    document = {
        "apiVersion": API_VERSION,
        "id": DEFAULT_SET_ID if set_doc is None else set_doc.metadata.id,
        "version": None if set_doc is None else set_doc.metadata.version,
        "data_class_header": header.lower(),
        "policies": normalized,
        "jurisdictions": _jurisdictions_used(normalized, backends),
    }
    canonical = canonical_json(document)
    digest = "sha256:" + hashlib.sha256(canonical).hexdigest()
    return PolicySet(
        id=str(document["id"]),
        version=str(document["version"] or digest[: len("sha256:") + 12]),
        digest=digest,
        facts_digest=sha256([_facts(b) for b in backends]),
        data_class_header=header.lower(),
        canonical=canonical,
        policies=compiled,
        backends=backends,
    )


def normalize_policy(policy: PolicyDocument) -> dict[str, Any]:
    spec = policy.spec
    return {
        "id": policy.metadata.id,
        "version": policy.metadata.version,
        "tenants": sorted(spec.tenants),
        **_sections(spec),
        "data_classes": {name: _sections(rules) for name, rules in spec.data_classes.items()},
        "default_data_class": spec.default_data_class,
        "default_data_class_by_tenant": dict(sorted(spec.default_data_class_by_tenant.items())),
    }


def _compile_policy(policy: PolicyDocument, backends: Sequence[BackendFacts]) -> CompiledPolicy:
    pid = policy.metadata.id
    version = policy.metadata.version
    if version is None:
        unversioned = {**normalize_policy(policy), "version": None}
        version = sha256(unversioned)[: len("sha256:") + 12]
    base = compile_scope(pid, policy.spec, backends)
    assert base.fallback is not None  # the schema requires a policy's fallback section
    classes = {
        name: compile_scope(f"{pid}/data_classes.{name}", rules, backends, data_class=True)
        for name, rules in policy.spec.data_classes.items()
    }
    fallbacks = {None: base.fallback} | {
        name: combine_fallback(base.fallback, scope.fallback) for name, scope in classes.items()
    }
    defaults = _defaults(policy)
    rules = {f"{pid}/private", f"{pid}/data_classes"}.union(
        base.rules, *(s.rules for s in classes.values()), (rule for _, rule in defaults.values())
    )
    # Hosted backends go in fallback.to order (the policy's, then the class's), then in
    # gateway.yaml order.
    hosted_keys: dict[str | None, dict[str, tuple[int, ...]]] = {}
    for label in fallbacks:
        scopes = (base,) if label is None else (base, classes[label])
        hosted_keys[label] = {
            b.id: (*(s.fallback_rank.get(b.id, 0) for s in scopes), position)
            for position, b in enumerate(backends)
            if b.tier == "hosted"
        }
    admitted = {
        b.id: TraceEntry(b.id, "admitted", f"{pid}/private", "private backend; every rule passed")
        for b in backends
        if b.tier == "private"
    }
    return CompiledPolicy(
        id=pid,
        version=version,
        tenants=policy.spec.tenants,
        base=base,
        classes=classes,
        fallbacks=fallbacks,
        rules=frozenset(rules),
        admitted=admitted,
        hosted_keys=hosted_keys,
        rule_ranks={k: v for s in (base, *classes.values()) for k, v in s.rule_ranks.items()},
        defaults=defaults,
    )


def _defaults(policy: PolicyDocument) -> dict[str | None, tuple[str, str]]:
    """Tenant (None: every other tenant of the policy) -> (default class, its rule id)."""
    pid, spec = policy.metadata.id, policy.spec
    defaults: dict[str | None, tuple[str, str]] = {}
    if spec.default_data_class is not None:
        defaults[None] = (spec.default_data_class, f"{pid}/default_data_class")
    for tenant, name in spec.default_data_class_by_tenant.items():
        defaults[tenant] = (name, f"{pid}/default_data_class_by_tenant.{tenant}")
    for name, _rule in defaults.values():
        if name not in spec.data_classes:  # the loader reports it with file and line
            raise ValueError(f"policy {pid}: default data class {name!r} is not defined")
    return defaults


def _sections(rules: Sections) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("models", "backends", "providers"):
        lists: Lists | None = getattr(rules, name)
        if lists is not None:
            allow = ["*"] if lists.allow is None else _set(lists.allow)
            out[name] = {"allow": allow, "deny": _set(lists.deny)}
    if rules.residency is not None:
        out["residency"] = {
            "allow": _set(rules.residency.allow),
            "deny": _set(rules.residency.deny),
        }
    if rules.retention is not None:
        out["retention"] = {
            "max_days": rules.retention.max_days,
            "training": rules.retention.training,
        }
    if rules.require:  # `require: []` requires nothing, as leaving it out does
        out["require"] = sorted(set(rules.require))
    if rules.fallback is not None:
        out["fallback"] = _fallback(rules.fallback)
    return out


def _fallback(fallback: Fallback) -> dict[str, Any]:
    to = None
    if fallback.to is not None:
        to = [
            {"backend": t.backend.lower()}
            if t.backend is not None
            else {"provider": (t.provider or "").lower()}
            for t in fallback.to
        ]
    return {"mode": fallback.mode, "saturation_threshold": fallback.saturation_threshold, "to": to}


def _set(items: Sequence[str]) -> list[str]:
    return sorted({item.lower() for item in items})


def _jurisdictions_used(
    policies: list[dict[str, Any]], backends: Sequence[BackendFacts]
) -> dict[str, list[str]]:
    """Code -> what it stands for, for every code a decision reads: each residency entry
    that is a code and, when some residency deny exists, each region a backend is declared
    in by a code (a deny holds where it covers any part of that area: `overlap`)."""
    entries: set[str] = set()
    denies = False
    for policy in policies:
        for sections in (policy, *policy["data_classes"].values()):
            residency = sections.get("residency")
            if residency is not None:
                entries.update(residency["allow"], residency["deny"])
                denies = denies or bool(residency["deny"])
    if denies:
        entries.update(b.region.lower() for b in backends)
    return {
        code: list(jurisdictions.expand(code))
        for code in sorted(entries)
        if jurisdictions.is_jurisdiction(code)
    }


def _facts(backend: BackendFacts) -> dict[str, Any]:
    return {
        "id": backend.id,
        "tier": backend.tier,
        "kind": backend.kind,
        "provider": backend.provider,
        "region": backend.region,
        "owner": backend.owner,
        "retention_days": backend.retention_days,
        "zero_data_retention": backend.zero_data_retention,
        "training": backend.training,
        "models": sorted(backend.models),
        "model_groups": sorted(sorted(group) for group in backend.model_groups if len(group) > 1),
        **({"attested": True} if backend.attested else {}),  # digests of before stay as they were
        # What a hosted backend sends for each public name: the `models` rule judges it.
        **(
            {"provider_models": [list(pair) for pair in backend.provider_models]}
            if backend.provider_models
            else {}
        ),
        # The names a policy's provider globs match (`gemini` is also `google`): the
        # digest pins what the provider table made of the declared one.
        **(
            {"provider_names": list(backend.provider_names)}
            if len(backend.provider_names) > 1
            else {}
        ),
        # A region declared by a code is decided by what the code stands for (a deny
        # covering any part of it holds): the digest pins that too. Only such backends'
        # facts (and digest) differ from before.
        **(
            {"region_covers": list(jurisdictions.expand(backend.region))}
            if jurisdictions.is_jurisdiction(backend.region)
            else {}
        ),
    }
