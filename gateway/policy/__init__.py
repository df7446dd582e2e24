"""Trust policies: YAML policy files → a compiled, pure, cached decision function.

`load_policies(paths, backends)` validates every policy file (errors carry file, line,
column and YAML path) and compiles them into a `PolicySet`; `PolicySet.decide(tenant,
model, data_class)` returns the backends that may see the request, private tier first
then hosted fallbacks in order, with a trace naming the rule behind every verdict.
Deny by default: a tenant without a policy, or a request nothing complies with, gets a
`Refusal` naming the rule. See docs/policies.md for the language.

This package imports no web framework, Redis or HTTP client: auditors and the CLI use it
without the server.
"""

from gateway.policy.engine import PolicySet
from gateway.policy.loader import check_policies, check_sources, load_policies, parse_policies
from gateway.policy.schema import API_VERSION, DEFAULT_DATA_CLASS_HEADER
from gateway.policy.types import (
    FALLBACK_MODES,
    BackendFacts,
    Decision,
    FallbackMode,
    PolicyError,
    PolicyIssue,
    Refusal,
    TraceEntry,
    UnknownDataClass,
)

__all__ = [
    "API_VERSION",
    "DEFAULT_DATA_CLASS_HEADER",
    "FALLBACK_MODES",
    "BackendFacts",
    "Decision",
    "FallbackMode",
    "PolicyError",
    "PolicyIssue",
    "PolicySet",
    "Refusal",
    "TraceEntry",
    "UnknownDataClass",
    "check_policies",
    "check_sources",
    "load_policies",
    "parse_policies",
]
