"""A request refused before anything was dispatched, carried as data.

`Refused` is the `GatewayError` the client gets (rendered like any other) together with
the policy decision that refused it: the refusal record keeps that decision's rule and
per-backend trace, never a rule read back out of the message. Only the proxy raises it,
and only while nothing of the request has been dispatched: once a dispatch record is
written, a failure is an attempt's outcome (a completion record), never a refusal.
Besides the policy's own refusals: `nothing_served` (no backend the policy admits was
available), `not_sent` (every backend the plan came to refused the request before it
was sent: a hosted provider's checks, a private backend's media URLs; and nothing else
was dispatched) and `hosted_unavailable` (LiteLLM
did not load, so no hosted provider could be called, and nothing else was dispatched) and
`lapsed` (the request's key was revoked, removed or given to another tenant, or its model
taken from the tenant, while it was in flight, before anything was dispatched:
gateway/api/standing.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from gateway.errors import ErrorCode, GatewayError
from gateway.policy import Decision

__all__ = [
    "HOSTED_CHECKS_RULE",
    "HOSTED_UNAVAILABLE_RULE",
    "MEDIA_URLS_RULE",
    "REFUSAL_CODES",
    "TENANT_RULE",
    "UNSERVED_CHARS",
    "Refused",
    "diagnosis",
    "hosted_unavailable",
    "lapsed",
    "not_sent",
    "not_served",
    "nothing_served",
]

# The codes a refusal answers with (docs/provenance.md, "refusal").
REFUSAL_CODES: Final = frozenset(
    {
        ErrorCode.policy_denied,
        ErrorCode.unknown_data_class,
        ErrorCode.no_compliant_backend,
        ErrorCode.upstream_bad_request,  # `not_sent`
        ErrorCode.invalid_request,  # `not_sent`: a media URL no private backend may fetch
        ErrorCode.backend_unavailable,  # `hosted_unavailable`
        ErrorCode.invalid_api_key,  # `lapsed`
        ErrorCode.model_not_found,  # `lapsed`
    }
)
UNSERVED_CHARS: Final = 400
"""The longest `diagnosis`: the access line stays short (a few backends' reasons)."""
_REASON_CHARS: Final = 80  # one reason's words, after its backend id
# Where a reason's words stop: anything but letters, digits, spaces and `./:()_-`, which
# a quoted value, a provider's echoed text or a non-ASCII character would start with.
_UNSAFE = re.compile(r"[^A-Za-z0-9 ./:()_-]")

# The `rule` of a `not_sent` refusal: no policy rule refused, the gateway's own checks of
# what it sends a hosted provider did (gateway/upstream/hosted.py `HostedClient.prepare`).
HOSTED_CHECKS_RULE: Final = "owngate/hosted_request"
# The `rule` of a `not_sent` refusal whose first refused attempt was a private one: no
# policy rule refused, the media URLs it would have had the backend fetch did
# (gateway/api/private_media.py, the backend's `media_urls:`).
MEDIA_URLS_RULE: Final = "owngate/media_urls"
# The `rule` of a `hosted_unavailable` refusal: no policy rule refused, LiteLLM (which
# every hosted call goes through) could not be loaded (gateway/upstream/hosted.py).
HOSTED_UNAVAILABLE_RULE: Final = "owngate/hosted_unavailable"
# The `rule` of a `lapsed` refusal: no policy rule refused, the tenant index and the key
# revocations active now did (the key no longer stands, or the model is not the tenant's).
TENANT_RULE: Final = "owngate/tenant"


class Refused(GatewayError):
    """The policy left nothing that may (or can) serve the request.

    `decision` is the decision that refused it (for an undefined data class, the one
    `UnknownDataClass.decision` carries: every backend excluded by the data-class rule);
    `rule` is the rule the refusal names."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        decision: Decision,
        rule: str,
        *,
        param: str | None = None,
    ) -> None:
        if code not in REFUSAL_CODES:
            raise ValueError(f"{code.value} is not a refusal")
        super().__init__(code, message, param=param)
        self.decision: Final = decision
        self.rule: Final = rule


def not_sent(error: GatewayError, decision: Decision, rule: str = HOSTED_CHECKS_RULE) -> Refused:
    """The refusal of a request that every backend the plan came to refused before
    anything was sent (and that nothing was dispatched for): the first such 400, as the
    client gets it (a hosted provider's checks: `upstream_bad_request`,
    `HOSTED_CHECKS_RULE`; a private backend's media URLs: `invalid_request`,
    `MEDIA_URLS_RULE`), with the decision whose plan led there."""
    return Refused(error.code, error.message, decision, rule, param=error.param)


def hosted_unavailable(decision: Decision, model: str, request_id: str) -> Refused:
    """The refusal of a request whose hosted attempts LiteLLM's failing to load kept from
    being made (and that nothing was dispatched for): 503 `backend_unavailable` in the
    words every request that no backend served gets (`not_served`)."""
    return Refused(
        ErrorCode.backend_unavailable,
        not_served(model, request_id),
        decision,
        HOSTED_UNAVAILABLE_RULE,
    )


def lapsed(error: GatewayError, decision: Decision) -> Refused:
    """The refusal of a request whose key or tenant no longer stands (`error`: what
    `Standing.lapsed` said, 401 `invalid_api_key` or 404 `model_not_found`) before anything
    of it was dispatched."""
    return Refused(error.code, error.message, decision, TENANT_RULE, param=error.param)


def not_served(model: str, request_id: str) -> str:
    """What a client whose request no backend served is told: the same words for every
    tenant and every cause. Which backends were skipped or failed, and why (`Plan.reasons`:
    backend ids, probe and connect failures), is the operator's, on `/admin/status`, never
    a tenant's (docs/security.md)."""
    return f"no compliant backend could serve model `{model}` (request {request_id})"


def nothing_served(decision: Decision, model: str, request_id: str) -> Refused:
    """Nothing was dispatched: no backend the policy admits was available, and its
    fallback rule allows no hosted one (or none is configured, or the fallback was
    withheld: a private backend was not shown unavailable, e.g. the deadline passed).
    The message names the fallback rule, the tenant's own policy, and nothing of the
    backends (`not_served`)."""
    rule = decision.fallback_rule
    return Refused(
        ErrorCode.no_compliant_backend,
        f"policy {rule}: {not_served(model, request_id)}",
        decision,
        rule,
    )


def diagnosis(reasons: Iterable[str]) -> str:
    """The operator's view of why no backend served a request (`Plan.reasons`, in order),
    for its access line (`unserved`): "<backend id>: <why>" for each, joined by "; ".

    The reasons are the gateway's own (backend ids, probe, connect and breaker words, the
    gateway's summaries of a provider's failure); each is still cut at the first
    character a quoted or echoed text would bring (`_UNSAFE`) and at `_REASON_CHARS`, and
    the whole at `UNSERVED_CHARS` ("..." marks a cut), so nothing a client sent reaches
    the line verbatim and the line stays bounded."""
    parts: list[str] = []
    size = 0
    for reason in reasons:
        head = _UNSAFE.search(reason)
        part = reason[: head.start() if head else len(reason)].strip()
        if len(part) > _REASON_CHARS:
            part = part[:_REASON_CHARS] + "..."
        if size + len(part) + 2 > UNSERVED_CHARS:
            parts.append("...")
            break
        parts.append(part)
        size += len(part) + 2
    return "; ".join(parts)
