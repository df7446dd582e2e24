"""A request's policy decision as the proxy keeps it, and whether a reload since took a
backend away from it.

The decision is made once, on arrival (`decide`, from gateway/api/proxy.py); a request may wait
in a queue and fail over for a while, and a reload (of the policies, or of gateway.yaml:
the new config's set) may land meanwhile. Each attempt is checked against the set active
when its turn comes and again right before its dispatch record (`withdrawn_by_reload`),
never only against the older set: its backend must still be admitted, and a hosted
fallback's reason must still be one the new set's fallback mode accepts (a reload from
`when_private_saturated` to `when_private_unavailable` takes "saturated" and "busy" away
as reasons; a raised `saturation_threshold` takes "saturated"; a private backend the new
set admits that the plan never tried was not shown unavailable). After a gateway.yaml
reload, an attempt on a backend whose declared facts changed is not made either: the
request runs on its own config's addresses, and the new set judged the new declaration;
nor one on a backend the new config serves the requested name on as another model (an
alias given to another model): the attempt would ask for the old one, the new set judged
the new one. Nor is one on a backend the reload moved or whose TLS trust it changed (`base_url`, CA,
client certificate, `server_name`, pins: `Registry.moved`): the old address or key may be
the very thing the operator no longer trusts. Each such backend is left out of a
hosted fallback's basis, as one the plan never tried: its new self was never shown
unavailable.

What the attempt came to, for the plan's fallback (`Withdrawn.came_to`): a backend the
policy set active now no longer admits is `withdrawn`, "down" for that set (it judges the
fallback without it) but never tried for a later set that admits it again (the plan's
`withdrawn`: before, a policy reload undone before the fallback left it "down" in the
fallback's basis, and the hosted provider served); one whose config a reload changed
(moved, re-trusted, removed, redeclared, renamed: `Retired`) is `retired`, as one whose
pool a reload closed: an operator's config change is not the private fleet failing, so it
never lets a request go to a hosted provider, whatever a later reload changes back
(gateway/routing/attempt.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from gateway.api.labels import UNKNOWN, InvalidLabel, label_refused, read_label
from gateway.api.refusal import Refused
from gateway.asgi import Scope
from gateway.errors import ErrorCode
from gateway.policy import Decision, PolicySet, UnknownDataClass
from gateway.policy_set import TrustPolicies
from gateway.routing.attempt import FALLBACK_STATES, Attempt, FallbackBasis

if TYPE_CHECKING:
    from gateway.api.exchange import Exchange
    from gateway.api.metrics import GatewayMetrics
    from gateway.routing.registry import Registry
    from gateway.routing.router import Plan

__all__ = ["Decided", "Retired", "Withdrawn", "decide", "fallback_refused", "withdrawn_by_reload"]


class Withdrawn(str):
    """Why a reload withdrew an attempt before it sent; `came_to`: what a private one
    came to for the fallback, "withdrawn" (not tried: the policy set active now does not
    admit it; `Plan.withdrawn`, gateway/routing/router.py)."""

    came_to: ClassVar[str] = "withdrawn"


class Retired(Withdrawn):
    """Withdrawn because a config reload changed the backend itself (`Registry.moved`, a
    redeclaration, a model renamed): "retired", never unavailable (module docstring)."""

    came_to: ClassVar[str] = "retired"


class Decided(NamedTuple):
    """A request's decision, the policy set that made it and the label it was made for."""

    decision: Decision
    policy: PolicySet
    label: str | None


def withdrawn_by_reload(
    trust: TrustPolicies,
    registry: Registry,
    decided: Decided,
    attempt: Attempt,
    plan: Plan | None = None,
) -> Withdrawn | None:
    """Why the policy set active now no longer admits `attempt`, if a reload since the
    decision took it away (None: it still admits it, or nothing was reloaded): its backend,
    or, for a hosted attempt of `plan` (a fallback, `plan.fallback` and `plan.basis` saying
    why), the reason it falls back; or why the newest config no longer reaches its backend
    where and as `registry` (the request's config's) does (`Registry.moved`)."""
    current = trust.latest()
    moved = registry.moved(attempt.backend.id)
    if current is decided.policy:
        return None if moved is None else Retired(moved)
    decision = decided.decision
    try:
        now = current.decide(decision.tenant, decision.model, decided.label)
    except UnknownDataClass:
        now = None
    admitted = () if now is None else now.private if attempt.private else now.hosted
    if attempt.backend.id not in admitted:
        return Withdrawn(
            f"{attempt.backend.id}: no longer admitted by policy set {current.version}"
        )
    before = decided.policy
    redeclared = current.facts_digest != before.facts_digest
    if redeclared and _redeclared(before, current, attempt.backend.id):
        # A gateway.yaml reload admitted the id for what it declares now; the attempt
        # would go where the old config pointed, under the old declaration.
        return Retired(
            f"{attempt.backend.id}: declared anew in the config of policy set {current.version}"
        )
    if redeclared and _renamed(registry, current, attempt.backend.id, decision.model):
        # The new set judged the model the backend serves the name as now; the attempt
        # would ask it for the one the old config named (maybe one the new set denies).
        return Retired(
            f"{attempt.backend.id}: serves {decision.model} as another model in the config "
            f"of policy set {current.version}"
        )
    if moved is not None:
        return Retired(moved)
    if now is None or attempt.private or plan is None or plan.fallback is None:
        return None
    # What came of a backend since redeclared, renamed or moved says nothing of it now;
    # one a policy reload withdrew was never tried (`now` may admit it again).
    basis = tuple(
        (b, state)
        for b, state in plan.basis
        if not (
            redeclared
            and (_redeclared(before, current, b) or _renamed(registry, current, b, decision.model))
        )
        and registry.moved(b) is None
        and b not in plan.withdrawn
    )
    why = fallback_refused(decision, now, plan.fallback, basis)
    if why is None:
        return None
    return Withdrawn(
        f"{attempt.backend.id}: fallback no longer allowed by policy set {current.version} ({why})"
    )


def _redeclared(before: PolicySet, current: PolicySet, backend_id: str) -> bool:
    """Whether `current` was compiled against other facts for the backend (its region,
    owner, provider, retention, identity) than `before`, the set of the config the attempt
    belongs to. The names it serves are not compared: `decide` judged them."""
    old, new = before.declared(backend_id), current.declared(backend_id)
    if old is None or new is None:
        return True
    return replace(old, models=frozenset(), model_groups=()) != replace(
        new, models=frozenset(), model_groups=()
    )


def _renamed(registry: Registry, current: PolicySet, backend_id: str, model: str) -> bool:
    """Whether the config `current` was compiled against serves public name `model` on
    `backend_id` as another model than the one the request's config (`registry`) asks the
    backend for under that name (a reload that gave an alias to another model): the
    new set judged the one it serves now."""
    new = current.declared(backend_id)
    if new is None:
        return True
    names = new.names_of(model)
    routes = registry.routes.get(model, ())
    return any(r.backend.id == backend_id and r.upstream_model not in names for r in routes)


def fallback_refused(
    before: Decision, now: Decision, fallback: str, basis: FallbackBasis
) -> str | None:
    """Why `now` (a newer set's decision) does not let a request fall back for `fallback`
    (`private_saturated` or `private_unavailable`), each private backend having come to
    what `basis` says, as the plan made under `before` did; None when it does."""
    states = dict(basis)
    if fallback == "private_saturated":
        if now.fallback != "when_private_saturated":
            return f"fallback.mode {now.fallback} does not fall back when saturated"
        if (now.saturation_threshold or 0.0) > (before.saturation_threshold or 0.0):
            return f"saturation_threshold is {now.saturation_threshold}"
        # Every backend the plan judged was down or saturated; one it never judged was not.
        unjudged = [b for b in now.private if b not in states]
        return f"{', '.join(unjudged)} not judged saturated" if unjudged else None
    accepted = FALLBACK_STATES.get(now.fallback, frozenset())
    left = [
        f"{b} {states.get(b, 'not tried')}" for b in now.private if states.get(b) not in accepted
    ]
    return f"{now.fallback}: {', '.join(left)}" if left else None


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
            ErrorCode.policy_denied, refusal.public, decision, refusal.rule, param="model"
        )
    return Decided(decision, policy, label)
