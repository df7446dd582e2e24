"""The trust filter: only backends the tenant's policy decision admits are ever tried.

Inputs: the routes of the public model name (gateway/routing/registry.py) and the
`Decision` of gateway/policy (`private`: the private backend ids the request may go
to; `hosted`: the hosted ids it may fall back to, in fallback order). Output: the
routes whose backend id is in each set: private in gateway.yaml order (the picker
orders them), hosted in the decision's order. Config: the policy files
(`policy.paths` in gateway.yaml; without them, the built-in private-only set of
gateway/policy_set.py). The decision is a filter, never a score: retries and fallback
stay inside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.policy import Decision
    from gateway.routing.registry import Route

__all__ = ["eligible_hosted", "eligible_private"]


def eligible_private(routes: Sequence[Route], decision: Decision) -> list[Route]:
    """The model's routes to private backends the decision admits, in config order."""
    allowed = decision.private
    return [r for r in routes if r.backend.id in allowed]


def eligible_hosted(by_id: Mapping[str, Route], decision: Decision) -> list[Route]:
    """The model's routes (`by_id`: backend id → route) to the decision's hosted
    fallbacks, in the decision's order."""
    return [by_id[b] for b in decision.hosted if b in by_id]
