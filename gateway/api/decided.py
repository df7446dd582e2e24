"""A request's policy decision as the proxy keeps it, and whether a reload since took a
backend away from it.

The decision is made once, on arrival (`decide`, from gateway/api/proxy.py); a request may wait
in a queue and fail over for a while, and a reload (of the policies, or of gateway.yaml:
the new config's set) may land meanwhile. Each attempt is checked against the set active
when its turn comes and again right before its dispatch record (`withdrawn_by_reload`),
never only against the older set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from gateway.api.labels import UNKNOWN, InvalidLabel, label_refused, read_label
from gateway.api.refusal import Refused
from gateway.asgi import Scope
from gateway.errors import ErrorCode
from gateway.policy import Decision, PolicySet, UnknownDataClass
from gateway.policy_set import TrustPolicies
from gateway.routing.attempt import Attempt

if TYPE_CHECKING:
    from gateway.api.exchange import Exchange
    from gateway.api.metrics import GatewayMetrics

__all__ = ["Decided", "decide", "withdrawn_by_reload"]


class Decided(NamedTuple):
    """A request's decision, the policy set that made it and the label it was made for."""

    decision: Decision
    policy: PolicySet
    label: str | None


def withdrawn_by_reload(trust: TrustPolicies, decided: Decided, attempt: Attempt) -> str | None:
    """Why the policy set active now no longer admits `attempt`'s backend, if a reload
    since the decision took it away (None: it still admits it, or nothing was reloaded)."""
    current = trust.latest()
    if current is decided.policy:
        return None
    decision = decided.decision
    try:
        now = current.decide(decision.tenant, decision.model, decided.label)
    except UnknownDataClass:
        now = None
    admitted = () if now is None else now.private if attempt.private else now.hosted
    if attempt.backend.id in admitted:
        return None
    return f"{attempt.backend.id}: no longer admitted by policy set {current.version}"


def decide(
    policy: PolicySet,
    metrics: GatewayMetrics,
    exchange: Exchange,
    tenant: str,
    model: str,
    scope: Scope,
) -> Decided:
    """`policy`'s decision for the request (raises `Refused` when it admits no backend, or
    the data-class label is invalid or undeclared); the exchange notes the policy and the
    data class decided for."""
    exchange.policy = f"{policy.id}@{policy.version}"
    exchange.policy_digest = policy.digest
    exchange.data_class = UNKNOWN  # until the label proves to be a declared class
    invalid: InvalidLabel | None = None
    try:
        label = read_label(scope, policy.data_class_header.encode())
    except InvalidLabel as exc:
        # Empty, blank or disagreeing copies: the engine refuses an empty label with
        # its decision (or denies a tenant without a policy), so the refusal record
        # has a trace; the client is told what was wrong with the header.
        invalid, label = exc, ""
    try:
        decision = policy.decide(tenant, model, label)
    except UnknownDataClass as exc:
        metrics.decided((exc.rule,))
        error = label_refused(policy, tenant, invalid or exc)
        raise Refused(error.code, error.message, exc.decision, exc.rule, param=error.param) from exc
    metrics.decided(decision.rules)
    if invalid is not None and decision.refusal is None:  # "" names no class: never
        error = label_refused(policy, tenant, invalid)
        rule = f"{decision.policy_id}/data_classes"
        raise Refused(error.code, error.message, decision, rule, param=error.param)
    exchange.data_class = decision.data_class
    exchange.data_class_defaulted = decision.default_rule is not None
    if decision.refusal is not None:
        refusal = decision.refusal
        raise Refused(
            ErrorCode.policy_denied, refusal.message, decision, refusal.rule, param="model"
        )
    return Decided(decision, policy, label)
