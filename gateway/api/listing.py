"""Which models a tenant may know exist: the ones `GET /v1/models` lists (`listed`,
gateway/api/tenant_reads.py), and the one answer every other name gets on the proxied
paths (`decide_listed`, gateway/api/proxy.py).

A name the tenant's `/v1/models` does not list (no backend serves it, the tenant's key
may not use it, or the tenant's policy refuses it unlabelled) and that the request is
refused for gets 404 `model_not_found` in the words of a model that does not exist,
whatever refused it: a 403 naming the policy's rule for a configured model, against a
404 for a made-up one, told a tenant the names of other tenants' models (a fine-tune's
name carries business information). Each is a refusal like any other, recorded with the
rule that really refused it (`unknown-model` for a name no backend serves, `owngate/tenant`
for one the key may not use, the policy's own rule for a refused one), so the operator's
and the auditor's views keep it; the client's answer, receipt included, is the same for
all of them. A model `/v1/models` lists keeps its 403 naming the rule (a data class
refused, its fallback): the tenant knows it exists, and the rule tells it why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.api.decided import Decided, decide
from gateway.api.labels import excerpt
from gateway.api.refusal import TENANT_RULE, Refused
from gateway.asgi import Scope
from gateway.errors import ErrorCode
from gateway.policy import Decision, PolicySet
from gateway.routing.registry import Registry
from gateway.tenants import TenantEntry

if TYPE_CHECKING:
    from gateway.api.exchange import Exchange
    from gateway.api.metrics import GatewayMetrics

__all__ = ["decide_listed", "listed", "no_such_model"]


def listed(
    policy: PolicySet, registry: Registry, tenant: TenantEntry, name: str
) -> Decision | None:
    """The unlabelled decision under which `GET /v1/models` lists `name` for `tenant`;
    None when it does not list it: no backend serves it, the tenant's key may not use
    it, or the tenant's policy refuses it without a label."""
    if name not in registry.routes or not tenant.may_use(name):
        return None
    decision = policy.decide(tenant.id, name, None)
    return None if decision.refusal is not None else decision


def no_such_model(model: str, decision: Decision, rule: str) -> Refused:
    """The refusal of a request for a model the tenant's `/v1/models` does not list: the
    404 of a model that does not exist (its name excerpted: the client's string), with
    the decision and the rule that refused it, for its refusal record."""
    return Refused(
        ErrorCode.model_not_found,
        f"The model `{excerpt(model)}` does not exist or you do not have access to it.",
        decision,
        rule,
        param="model",
    )


def decide_listed(
    policy: PolicySet,
    registry: Registry,
    metrics: GatewayMetrics,
    exchange: Exchange,
    tenant: TenantEntry,
    model: str,
    scope: Scope,
) -> Decided:
    """`decide`, except that a request for a model the tenant's `/v1/models` does not
    list is refused as one no backend serves (`no_such_model`), before its label is read;
    a request its label admits is decided as any other (it may use the model)."""
    if model not in registry.routes or not tenant.may_use(model):
        exchange.policy = f"{policy.id}@{policy.version}"
        exchange.policy_digest = policy.digest
        # A name no backend serves is decided as "" (no config names a model so), never
        # as the client's string: the decision (its refusal's message repeats the name)
        # is kept per request by the recorder's `RecordRefs`, 4096 of them, and a name
        # may be as long as a body (4096 of 8 MiB held 64 GiB).
        asked = model if model in registry.routes else ""
        decision = policy.decide(tenant.id, asked, None)  # the unknown-model rule's refusal
        metrics.decided(decision.rules)
        refusal = decision.refusal
        rule = TENANT_RULE if refusal is None or model in registry.routes else refusal.rule
        raise no_such_model(model, decision, rule)
    try:
        return decide(policy, metrics, exchange, tenant.id, model, scope)
    except Refused as refused:
        if listed(policy, registry, tenant, model) is not None:
            raise  # a model the tenant sees: the rule that refused it is its to know
        raise no_such_model(model, refused.decision, refused.rule) from None
