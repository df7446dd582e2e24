"""A request refused before anything was dispatched, carried as data.

`Refused` is the `GatewayError` the client gets (rendered like any other) together with
the policy decision that refused it: the refusal record keeps that decision's rule and
per-backend trace, never a rule read back out of the message. Only the proxy raises it,
and only while nothing of the request has been dispatched: once a dispatch record is
written, a failure is an attempt's outcome (a completion record), never a refusal.
"""

from __future__ import annotations

from typing import Final

from gateway.errors import ErrorCode, GatewayError
from gateway.policy import Decision

__all__ = ["REFUSAL_CODES", "Refused"]

# The codes a refusal answers with (docs/provenance.md, "refusal").
REFUSAL_CODES: Final = frozenset(
    {ErrorCode.policy_denied, ErrorCode.unknown_data_class, ErrorCode.no_compliant_backend}
)


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
