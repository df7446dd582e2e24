"""The parts of a provenance record that repeat from request to request, built once: the
policy reference and trace of a (cached) policy decision, and the declared facts of a
backend's config as a record states them (gateway/api/recorder.py `Recorder`)."""

from __future__ import annotations

from gateway.config.facts import facts_of
from gateway.policy import Decision
from gateway.provenance import BackendRef, PolicyRef, Retention, TraceStep
from gateway.routing.registry import BackendState

__all__ = ["RecordRefs"]


class RecordRefs:
    """Per policy decision and per backend config, keyed by identity (the decision or the
    config kept beside, so a reused id is never mistaken), at most 4096 of each."""

    def __init__(self) -> None:
        self._backend_refs: dict[int, tuple[object, BackendRef]] = {}
        self._traces: dict[int, tuple[Decision, PolicyRef, tuple[TraceStep, ...]]] = {}

    def decided(self, decision: Decision) -> tuple[PolicyRef, tuple[TraceStep, ...]]:
        """The policy reference and trace of a decision (decisions are cached: so is this)."""
        found = self._traces.get(id(decision))
        if found is not None and found[0] is decision:
            return found[1], found[2]
        if len(self._traces) >= 4096:
            self._traces.clear()
        policy = PolicyRef(decision.policy_id, decision.policy_version, decision.policy_digest)
        trace = tuple(TraceStep(t.backend, t.verdict, t.rule) for t in decision.trace)
        self._traces[id(decision)] = (decision, policy, trace)
        return policy, trace

    def backend(self, backend: BackendState) -> BackendRef:
        """The declared facts the policy judged, as the record states them."""
        config = backend.config
        found = self._backend_refs.get(id(config))
        if found is not None and found[0] is config:
            return found[1]
        facts = facts_of(config)
        ref = BackendRef(
            id=facts.id,
            tier=facts.tier,
            kind=facts.kind,
            provider=facts.provider,
            owner=facts.owner,
            region=facts.region,
            retention=Retention(facts.retention_days, facts.zero_data_retention, facts.training),
        )
        if len(self._backend_refs) >= 4096:
            self._backend_refs.clear()
        self._backend_refs[id(config)] = (config, ref)
        return ref
