"""`PolicySet`: the compiled policies as a pure, cached decision function.

`decide(tenant, model, data_class)` depends on nothing but its arguments and the set
(`data_class=None`, no label, takes the policy's `default_data_class` for the tenant),
so its answers are cached per key. Only keys from the finite space of known tenants,
served models and defined data classes are cached; anything else (a model no backend
serves, a tenant with no policy) is answered afresh, so clients cannot grow the cache.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.policy.labels import normalized
from gateway.policy.rules import EffectiveFallback, Scope
from gateway.policy.types import BackendFacts, Decision, Refusal, TraceEntry, UnknownDataClass

__all__ = ["CompiledPolicy", "PolicySet"]


@dataclass(frozen=True)
class CompiledPolicy:
    id: str
    version: str
    tenants: tuple[str, ...]
    base: Scope
    classes: Mapping[str, Scope]
    fallbacks: Mapping[str | None, EffectiveFallback]  # None: no data class
    rules: frozenset[str]
    admitted: Mapping[str, TraceEntry]  # private backend id → its "admitted" entry
    hosted_keys: Mapping[str | None, Mapping[str, tuple[int, ...]]]  # label → fallback order
    rule_ranks: Mapping[str, int]
    # Tenant (None: the policy's own) -> (the class of an unlabelled request, its rule id).
    defaults: Mapping[str | None, tuple[str, str]] = field(default_factory=dict)

    def default_for(self, tenant: str) -> tuple[str, str] | None:
        """The data class an unlabelled request of `tenant` gets, and the rule saying so."""
        return self.defaults.get(tenant, self.defaults.get(None))


class PolicySet:
    """A loaded, validated policy set. Build it with `load_policies`."""

    def __init__(
        self,
        *,
        id: str,
        version: str,
        digest: str,
        facts_digest: str,
        data_class_header: str,
        canonical: bytes,
        policies: Sequence[CompiledPolicy],
        backends: Sequence[BackendFacts],
    ) -> None:
        self.id = id
        self.version = version
        self.digest = digest
        self.facts_digest = facts_digest
        self.data_class_header = data_class_header
        self.canonical = canonical
        self.default_deny_rule = f"{id}/default-deny"
        self.unknown_model_rule = f"{id}/unknown-model"
        self._policies = {p.id: p for p in policies}
        self._by_tenant = {t: p for p in policies for t in p.tenants}
        by_model: dict[str, list[BackendFacts]] = {}
        for backend in backends:
            for model in sorted(backend.models):
                by_model.setdefault(model, []).append(backend)
        self._by_model = {m: tuple(bs) for m, bs in by_model.items()}
        self._declared = {backend.id: backend for backend in backends}
        self.rules: frozenset[str] = frozenset(
            {self.default_deny_rule, self.unknown_model_rule}.union(*(p.rules for p in policies))
        )
        self._cache: dict[tuple[str, str, str | None], Decision] = {}

    def __repr__(self) -> str:
        count = len(self._policies)
        return f"<PolicySet {self.id} {self.version} {self.digest[:19]} policies={count}>"

    def tenants(self) -> frozenset[str]:
        """Tenants bound to a policy; every other tenant is denied everything."""
        return frozenset(self._by_tenant)

    def declared(self, backend_id: str) -> BackendFacts | None:
        """What gateway.yaml declared about a backend, as this set was compiled against."""
        return self._declared.get(backend_id)

    def falls_back(self) -> bool:
        """Whether a request may go to a hosted backend under this set: one is declared,
        and some policy's fallback (its own or a data class's) is not `never`."""
        if not any(backend.tier == "hosted" for backend in self._declared.values()):
            return False
        fallbacks = (f for p in self._policies.values() for f in p.fallbacks.values())
        return any(fallback.mode != "never" for fallback in fallbacks)

    def policy_ids(self) -> tuple[str, ...]:
        return tuple(sorted(self._policies))

    def compiled(self, policy_id: str) -> CompiledPolicy:
        """The compiled form of one policy (for `check` and `explain`)."""
        return self._policies[policy_id]

    def policy_for(self, tenant: str) -> str | None:
        policy = self._by_tenant.get(tenant)
        return None if policy is None else policy.id

    def data_classes(self, tenant: str) -> frozenset[str]:
        policy = self._by_tenant.get(tenant)
        return frozenset() if policy is None else frozenset(policy.classes)

    def document(self) -> Any:
        """The normalized policy set whose RFC 8785 encoding `digest` is the SHA-256 of."""
        return json.loads(self.canonical)

    def decide(self, tenant: str, model: str, data_class: str | None) -> Decision:
        """Eligible backends for a request; raises `UnknownDataClass` for an unknown label."""
        key = (tenant, model, data_class)
        decision = self._cache.get(key)
        if decision is None:
            decision = self._decide(tenant, model, data_class)
            policy = self._by_tenant.get(tenant)
            if (
                policy is not None
                and model in self._by_model
                and (data_class is None or data_class in policy.classes)
            ):
                self._cache[key] = decision
        return decision

    def decide_uncached(self, tenant: str, model: str, data_class: str | None) -> Decision:
        """`decide` without the cache (for benchmarks and tests)."""
        return self._decide(tenant, model, data_class)

    def _decide(self, tenant: str, model: str, data_class: str | None) -> Decision:
        policy = self._by_tenant.get(tenant)
        if policy is None:
            return self._default_deny(tenant, model)
        label = None if data_class is None else normalized(data_class)
        default_rule = None
        if label is None:  # no label: the policy says what that means (default: unlabelled)
            label, default_rule = policy.default_for(tenant) or (None, None)
        extra: Scope | None = None  # the data class's rules, checked after the policy's
        if label is not None:
            extra = policy.classes.get(label)
            if extra is None:
                raise self._unknown_class(tenant, model, data_class or "", policy)
        fallback = policy.fallbacks[label]
        candidates = self._by_model.get(model, ())
        if not candidates:
            rule = self.unknown_model_rule
            message = f"policy {rule}: no configured backend serves {model!r}"
            unknown = Refusal(rule, message, message)
            return self._decision(
                tenant, model, label, policy, fallback, (), (), (), unknown, default_rule
            )
        # Every verdict below was computed when the set was compiled; this only looks up.
        base = policy.base
        base_models = base.model_entries.get(model)
        extra_models = None if extra is None else extra.model_entries.get(model)
        trace: list[TraceEntry | None] = []
        private: list[str] = []
        hosted: list[tuple[tuple[int, ...], int, str]] = []
        for backend in candidates:
            bid = backend.id
            # Sections in their order, the policy's then the class's. A `models` verdict is
            # per backend: backends may serve one name under different aliases, so the
            # model's entries name only the backends it excludes.
            entry = None if base_models is None else base_models.get(bid)
            if entry is None:
                entry = base.static_entries[bid]
            if entry is None and extra is not None:
                entry = None if extra_models is None else extra_models.get(bid)
                if entry is None:
                    entry = extra.static_entries[bid]
            if entry is None:
                if backend.tier == "private":
                    private.append(bid)
                    entry = policy.admitted[bid]
                else:
                    hosted.append((policy.hosted_keys[label][bid], len(trace), bid))
            trace.append(entry)
        hosted.sort()
        for position, (_key, slot, bid) in enumerate(hosted, 1):
            reason = f"fallback #{position} ({fallback.mode}); every rule passed"
            trace[slot] = TraceEntry(bid, "admitted", fallback.rule, reason)
        entries = tuple(e for e in trace if e is not None)
        refusal = None
        if not private and not hosted:
            refusal = _refusal(entries, policy.rule_ranks, tenant, model, label)
        hosted_ids = tuple(bid for _key, _slot, bid in hosted)
        return self._decision(
            tenant,
            model,
            label,
            policy,
            fallback,
            tuple(private),
            hosted_ids,
            entries,
            refusal,
            default_rule,
        )

    def _decision(
        self,
        tenant: str,
        model: str,
        label: str | None,
        policy: CompiledPolicy,
        fallback: EffectiveFallback,
        private: tuple[str, ...],
        hosted: tuple[str, ...],
        trace: tuple[TraceEntry, ...],
        refusal: Refusal | None,
        default_rule: str | None,
    ) -> Decision:
        return Decision(
            tenant=tenant,
            model=model,
            data_class=label,
            private=private,
            hosted=hosted,
            fallback=fallback.mode,
            saturation_threshold=fallback.threshold,
            refusal=refusal,
            trace=trace,
            policy_id=policy.id,
            policy_version=policy.version,
            policy_digest=self.digest,
            fallback_rule=fallback.rule,
            default_rule=default_rule,
        )

    def _unknown_class(
        self, tenant: str, model: str, label: str, policy: CompiledPolicy
    ) -> UnknownDataClass:
        """The refusal of a label the tenant's policy does not define, with its decision:
        every backend serving the model excluded by the policy's data-class rule."""
        rule = f"{policy.id}/data_classes"
        known = tuple(sorted(policy.classes))
        reason = "the request's data class is not defined by the policy"
        # data_class None: the label is not one the policy defines, so it is not kept.
        decision = self._all_excluded(
            tenant,
            model,
            rule,
            reason,
            f"policy {rule}: {reason} (tenant {tenant!r})",
            policy_id=policy.id,
            policy_version=policy.version,
        )
        return UnknownDataClass(tenant, label, rule, known, decision)

    def _default_deny(self, tenant: str, model: str) -> Decision:
        """A tenant without a policy: refused whatever the label (which names no class)."""
        rule = self.default_deny_rule
        reason = f"tenant {tenant!r} has no policy: deny by default"
        return self._all_excluded(
            tenant,
            model,
            rule,
            reason,
            f"policy {rule}: {reason}",
            policy_id=self.id,
            policy_version=self.version,
        )

    def _all_excluded(
        self,
        tenant: str,
        model: str,
        rule: str,
        reason: str,
        message: str,
        *,
        policy_id: str,
        policy_version: str,
    ) -> Decision:
        """A refusal by one `rule`, saying `message`: every backend serving `model`
        excluded for `reason`, no data class kept, nothing to fall back to."""
        trace = tuple(
            TraceEntry(b.id, "excluded", rule, reason) for b in self._by_model.get(model, ())
        )
        return Decision(
            tenant=tenant,
            model=model,
            data_class=None,
            private=(),
            hosted=(),
            fallback="never",
            saturation_threshold=None,
            refusal=Refusal(rule, message, message),
            trace=trace,
            policy_id=policy_id,
            policy_version=policy_version,
            policy_digest=self.digest,
            fallback_rule=rule,
        )


def _refusal(
    trace: tuple[TraceEntry, ...],
    ranks: Mapping[str, int],
    tenant: str,
    model: str,
    label: str | None,
) -> Refusal:
    """Name the rule that excluded the most backends; on a tie, the later-checked rule
    (a data class's rule over the policy's, fallback over retention over residency...),
    as the more specific one."""
    counts = Counter(entry.rule for entry in trace)
    rule = max(counts, key=lambda r: (counts[r], ranks.get(r, -1)))
    reason = next(entry.reason for entry in trace if entry.rule == rule)
    scope = f" with data class {label!r}" if label is not None else ""
    public = f"policy {rule}: no backend may serve model {model!r} for tenant {tenant!r}{scope}"
    return Refusal(rule, f"{public} ({reason})", public)
