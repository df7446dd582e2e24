"""A request's policy decision as the proxy keeps it, and whether a reload since took a
backend away from it.

The decision is made once, on arrival (gateway/api/proxy.py `_decide`); a request may wait
in a queue and fail over for a while, and a reload (of the policies, or of gateway.yaml:
the new config's set) may land meanwhile. Each attempt is checked against the set active
when its turn comes and again right before its dispatch record (`withdrawn_by_reload`),
never only against the older set.
"""

from __future__ import annotations

from typing import NamedTuple

from gateway.policy import Decision, PolicySet, UnknownDataClass
from gateway.policy_set import TrustPolicies
from gateway.routing.attempt import Attempt

__all__ = ["Decided", "withdrawn_by_reload"]


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
