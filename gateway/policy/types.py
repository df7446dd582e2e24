"""The values the policy engine takes and gives: backend facts, decisions, traces, errors.

All are frozen dataclasses with no behaviour beyond rendering, so the gateway, the CLI
and the tests share one definition of each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "FALLBACK_MODES",
    "BackendFacts",
    "Decision",
    "FallbackMode",
    "PolicyError",
    "PolicyIssue",
    "Refusal",
    "TraceEntry",
    "UnknownDataClass",
]

FallbackMode = Literal["never", "when_private_unavailable", "when_private_saturated"]

# Strictest first: a data class may only move a policy's fallback towards the front.
FALLBACK_MODES: tuple[FallbackMode, ...] = (
    "never",
    "when_private_unavailable",
    "when_private_saturated",
)


@dataclass(frozen=True, slots=True)
class BackendFacts:
    """What the operator declared about one backend in gateway.yaml (the trust root)."""

    id: str
    tier: Literal["private", "hosted"]
    kind: str
    provider: str  # the owner for private backends
    region: str
    owner: str
    retention_days: int
    zero_data_retention: bool
    training: bool
    models: frozenset[str]  # public names (names and aliases) the backend serves
    # The names of each model it serves (a name and its aliases): a `models` rule judges
    # a model by all its names, so an alias never escapes a deny written for the name.
    model_groups: tuple[frozenset[str], ...] = ()
    # (public name, provider model) for each name a hosted backend serves: the LiteLLM
    # model string it sends (`openai/gpt-4o` for a model the operator calls `fast`). A
    # `models` rule judges it too: a deny holds whatever the operator names the model.
    provider_models: tuple[tuple[str, str], ...] = ()
    # region, owner and retention were checked against the backend's certificate on each
    # connection (`identity: certificate`), not only declared: `require: [attested_facts]`
    attested: bool = False
    # Every name a hosted backend's provider goes by, `provider` first (`gemini`,
    # `google`, `vertex_ai`, ...: gateway/config/provider_routes.py's table, filled in by
    # gateway/config/facts.py); empty: `provider` alone (a private backend's owner).
    provider_names: tuple[str, ...] = ()

    def providers(self) -> tuple[str, ...]:
        """The names a policy's provider globs are matched against: any one matching
        is a match (`providers.deny: [google]` holds for `provider: gemini`)."""
        return self.provider_names or (self.provider,)

    def names_of(self, model: str) -> frozenset[str]:
        """Every name the backend serves `model` under (the name itself at least)."""
        for group in self.model_groups:
            if model in group:
                return group
        return frozenset((model,))

    def provider_model_of(self, model: str) -> str | None:
        """The provider model a hosted backend sends for public name `model`, if any."""
        for name, provider_model in self.provider_models:
            if name == model:
                return provider_model
        return None


@dataclass(frozen=True, slots=True)
class TraceEntry:
    """Why one backend serving the requested model was admitted or excluded."""

    backend: str
    verdict: Literal["admitted", "excluded"]
    rule: str
    reason: str


@dataclass(frozen=True, slots=True)
class Refusal:
    """Nothing at all is eligible; `message` starts with `policy <rule>:`.

    `message` is the operator's and the policy author's (`owngate policy explain`): it
    ends in what the rule found of a backend (its id, region, provider, the model a
    hosted provider is sent). `public` is what the tenant is told: the same words up to
    that reason, naming the rule, the model it asked for, itself and its data class only
    (docs/security.md, "Routing internals are not public")."""

    rule: str
    message: str
    public: str


@dataclass(frozen=True, slots=True)
class Decision:
    """Which backends may see a request of (tenant, model, data class), and why.

    `private` is in gateway.yaml order (the router orders by load); `hosted` is in
    fallback order. `saturation_threshold` is waiting requests per concurrency slot of
    the private tier above which `when_private_saturated` falls back (None otherwise).
    `data_class` is the class decided for (normalized); when the request carried no label
    it is the policy's default for the tenant, and `default_rule` names that default.
    """

    tenant: str
    model: str
    data_class: str | None
    private: tuple[str, ...]
    hosted: tuple[str, ...]
    fallback: FallbackMode
    saturation_threshold: float | None
    refusal: Refusal | None
    trace: tuple[TraceEntry, ...]
    policy_id: str
    policy_version: str
    policy_digest: str
    fallback_rule: str
    # Set when the request carried no label and the policy gave it `data_class`: the rule
    # that did (`<policy>/default_data_class`, or `..._by_tenant.<tenant>`).
    default_rule: str | None = None
    # The rules that took part: each that admitted or excluded a backend, refused the
    # request, or gave it a default data class (what policy test coverage and the
    # decisions-per-rule metric count). Computed once, with the decision: decisions are
    # cached, so the request path only reads it.
    rules: frozenset[str] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        rules = {t.rule for t in self.trace}
        if self.refusal is not None:
            rules.add(self.refusal.rule)
        if self.default_rule is not None:
            rules.add(self.default_rule)
        object.__setattr__(self, "rules", frozenset(rules))

    @property
    def eligible(self) -> tuple[str, ...]:
        """Every backend that may see the request: private tier first, then fallbacks."""
        return self.private + self.hosted

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready view (the shape `owngate policy explain --json` prints)."""
        return {
            "tenant": self.tenant,
            "model": self.model,
            "data_class": self.data_class,
            "default_rule": self.default_rule,
            "private": list(self.private),
            "hosted": list(self.hosted),
            "fallback": self.fallback,
            "saturation_threshold": self.saturation_threshold,
            "fallback_rule": self.fallback_rule,
            "refusal": None
            if self.refusal is None
            else {"rule": self.refusal.rule, "message": self.refusal.message},
            "trace": [
                {"backend": t.backend, "verdict": t.verdict, "rule": t.rule, "reason": t.reason}
                for t in self.trace
            ],
            "policy_id": self.policy_id,
            "policy_version": self.policy_version,
            "policy_digest": self.policy_digest,
        }


@dataclass(frozen=True, slots=True)
class PolicyIssue:
    """One problem (or warning) in a policy file: where it is and what is wrong."""

    file: str
    line: int | None
    column: int | None
    path: str
    message: str
    # The file could not be read at all (an OSError: out of file descriptors, an I/O
    # error), as opposed to what it says: a running gateway reads it again unchanged.
    unreadable: bool = False

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        subject = f"{self.path}: " if self.path else ""
        return f"{where}: {subject}{self.message}"


class PolicyError(Exception):
    """The policy files are invalid; `issues` lists every problem found. `unreadable`:
    a file or directory could not be read at all (see `PolicyIssue.unreadable`)."""

    def __init__(self, issues: list[PolicyIssue]) -> None:
        self.issues = issues
        self.unreadable = any(issue.unreadable for issue in issues)
        lines = "\n".join(f"  {issue}" for issue in issues)
        super().__init__(f"invalid policies ({len(issues)} problem(s)):\n{lines}")


class UnknownDataClass(Exception):
    """The request carried a data-class label its tenant's policy does not define.

    `decision` is the refusal as data (for the gateway's refusal record): every backend
    serving the model excluded by `rule`, nothing eligible; it carries no label."""

    def __init__(
        self,
        tenant: str,
        label: str,
        rule: str,
        known: tuple[str, ...],
        decision: Decision,
    ) -> None:
        self.tenant = tenant
        self.label = label
        self.rule = rule
        self.known = known
        self.decision = decision
        defined = ", ".join(known) if known else "none"
        super().__init__(
            f"policy {rule}: data class {_bounded(label)!r} is not defined for tenant {tenant!r} "
            f"(defined: {defined}); an unknown label is refused, not ignored"
        )


def _bounded(label: str, limit: int = 64) -> str:
    """A client-supplied label as messages may quote it: at most `limit` characters."""
    return label if len(label) <= limit else label[:limit] + "..."
