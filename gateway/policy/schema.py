"""The schema of policy files: frozen pydantic models that forbid unknown keys.

Two kinds of document share the `policy.owngate.dev/v1` apiVersion: `Policy` (the
rules for the tenants it names) and `PolicySet` (at most one: the set's own id, version
and the header that carries data-class labels). Scalars are strict: YAML's `no` (read as
false) is not taken for the country code, a quoted `"30"` is not taken for a number.
"""

from __future__ import annotations

import datetime
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    StrictStr,
    field_validator,
    model_validator,
)

from gateway.plain_names import plain_name_problem
from gateway.plain_yaml import key_in_text, key_pattern
from gateway.policy.types import FallbackMode

__all__ = [
    "API_VERSION",
    "DEFAULT_DATA_CLASS_HEADER",
    "Fallback",
    "Lists",
    "Metadata",
    "PolicyDocument",
    "PolicySetDocument",
    "PolicySetSpec",
    "PolicySpec",
    "Residency",
    "Retention",
    "Rules",
    "Target",
]

API_VERSION = "policy.owngate.dev/v1"
DEFAULT_DATA_CLASS_HEADER = "x-data-class"

# Policy ids and data-class names appear inside rule ids (`eu-health/data_classes.phi/...`),
# so they may not hold `/` or `.`.
PolicyId = Annotated[StrictStr, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]
DataClassName = Annotated[StrictStr, Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")]
TenantId = Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]


def _pattern(value: str) -> str:
    # A name or glob with spaces at its ends, an invisible character or a look-alike
    # letter (`gpt-4o` with a Cyrillic o) matches no backend: a deny entry written so
    # would protect nothing, silently (`check` only warns). gateway/plain_names.py.
    problem = plain_name_problem(value)
    if problem is not None:
        raise ValueError(f"{problem}, so it would match nothing; write it plainly")
    # Nor a space inside: YAML joins a value continued on the next line into one, so a
    # list item indented one step too far (`- azure` then `  - openai`) or a missing
    # comma (`[azure openai]`) reads as the one entry 'azure - openai', which matches
    # nothing. No backend id, jurisdiction or certificate fact holds a space; a name
    # in gateway.yaml that does is matched with `?` for it. Likewise `#`: YAML starts a
    # comment only after a space, so `- openai#old` is one entry; a model name in
    # gateway.yaml may hold `#`, and is matched with `?` for it.
    if "#" in value:
        raise ValueError(
            f"{value!r} holds '#': YAML starts a comment only after a space, so all of "
            "it is one entry; put a space before a comment (for a name that holds #, "
            "write ? for it)"
        )
    if " " in value:
        raise ValueError(
            f"{value!r} has a space inside: YAML joins a value continued on the next "
            "line (a list item indented too far, a missing comma) into one entry, which "
            "would match nothing; write each entry as its own list item (for a name "
            "that holds a space, write ? for it)"
        )
    return value


Pattern = Annotated[StrictStr, Field(min_length=1, max_length=200), AfterValidator(_pattern)]

# A description is text, and a block scalar (`description: |`) runs on over the lines
# indented below it: a rule written there (`fallback: {mode: never}` two spaces deeper
# than `description:`) reads as one in a review and restricts nothing. So a description
# may not hold a policy key followed by a colon (a capitalized word in prose may), quoted
# or written with characters a review does not see or takes for ASCII (`key_in_text`).
_KEYS = key_pattern(
    [
        "residency",
        "retention",
        "providers",
        "backends",
        "models",
        "require",
        "fallback",
        "data_classes",
        "default_data_class",
        "default_data_class_by_tenant",
        "tenants",
        "spec",
        "allow",
        "deny",
        "mode",
        "max_days",
        "training",
        "saturation_threshold",
    ]
)


def _description(value: str) -> str:
    found = key_in_text(value, _KEYS)
    if found is not None:
        raise ValueError(
            f"the description holds {found + ':'!r}, which reads as a policy key "
            "but is text here (a line indented under `description:` is part of it); "
            "write the rule as a key of its own, or reword the description"
        )
    return value


Description = Annotated[StrictStr, AfterValidator(_description)]


# The most days a certificate can attest (`owngate:retention:`, docs/backend-tls.md). The
# digest encodes every number as I-JSON: a larger one (or `.inf`) failed the load with a
# traceback instead of an error naming the file and line.
MAX_DAYS = 999999


def _max_days(value: Any) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_DAYS:
        return value
    if value in ("zero", "any"):
        return str(value)
    raise ValueError(
        f"max_days is 'zero', 'any' or a whole number of days (0 to {MAX_DAYS}; 'any' for no limit)"
    )


MAX_THRESHOLD = 1_000_000_000  # waiting requests per slot: past that, "never" is meant


def _threshold(value: Any) -> float:
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and 0 < value <= MAX_THRESHOLD
    ):
        return float(value)
    # YAML 1.1 reads `1e9` (and `1.0e9`) as text: only `1.0e+9` is a number there.
    raise ValueError(
        f"saturation_threshold is a number greater than 0 and at most {MAX_THRESHOLD} "
        "(YAML reads 1e9 as text: write the digits)"
    )


# A version reaches every dispatch and refusal record, the owngate_policy_info metric's
# label, logs and `policy explain`: a bounded plain name, like the ids beside it.
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+-]{0,63}\Z")


def _version(value: Any) -> str:
    if isinstance(value, datetime.date):  # YAML reads an unquoted 2025-06-01 as a date
        value = value.isoformat()
    elif isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str) and _VERSION.match(value):
        return value
    # The value is not quoted back: it may be what a terminal should not be sent.
    raise ValueError(
        "version is 1-64 letters, digits and . _ : + - (starting with a letter or digit; "
        "quote it) or a whole number"
    )


MaxDays = Annotated[int | str, PlainValidator(_max_days)]
Threshold = Annotated[float, PlainValidator(_threshold)]
Version = Annotated[str, PlainValidator(_version)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Metadata(_Strict):
    id: PolicyId
    version: Version | None = None
    description: Description = ""


class Lists(_Strict):
    """Allow and deny globs; deny wins; a missing `allow` allows all, `[]` allows none."""

    allow: tuple[Pattern, ...] | None = None
    deny: tuple[Pattern, ...] = ()


class Residency(_Strict):
    """Jurisdiction codes or region names/globs; `allow` is required."""

    allow: tuple[Pattern, ...]
    deny: tuple[Pattern, ...] = ()


class Retention(_Strict):
    max_days: MaxDays
    training: StrictBool = False


class Target(_Strict):
    """One entry of `fallback.to`: a hosted backend id or a provider, as a glob."""

    backend: Pattern | None = None
    provider: Pattern | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Target:
        if (self.backend is None) == (self.provider is None):
            raise ValueError("each fallback.to entry names exactly one of backend or provider")
        return self


class Fallback(_Strict):
    mode: FallbackMode
    saturation_threshold: Threshold | None = None
    to: tuple[Target, ...] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Fallback:
        saturated = self.mode == "when_private_saturated"
        if saturated and self.saturation_threshold is None:
            raise ValueError("mode when_private_saturated needs saturation_threshold")
        if not saturated and self.saturation_threshold is not None:
            raise ValueError("saturation_threshold applies only to mode when_private_saturated")
        if self.mode == "never" and self.to:
            raise ValueError("fallback.to has no effect when mode is never; remove it")
        return self


# attested_facts: region, owner and retention must come from the backend's certificate
# (gateway.yaml `identity: certificate`), not only from the operator's declaration.
Requirement = Literal["attested_facts"]


def _one_or_many(value: object) -> object:
    # `require: attested_facts` (as issue 15 and the rule's own trace write it) is the
    # one-item list `[attested_facts]`: refused as "not a valid tuple", a policy written
    # that way could not be loaded at all. Only a bare string is wrapped; anything else is
    # left to the tuple's own check.
    return (value,) if isinstance(value, str) else value


# One requirement or a list of them; the normalized form (and so the digest) is the same.
Requirements = Annotated[tuple[Requirement, ...], BeforeValidator(_one_or_many)]


class Rules(_Strict):
    """The sections a data class may add; each only tightens the policy's own."""

    description: Description = ""
    residency: Residency | None = None
    retention: Retention | None = None
    require: Requirements | None = None
    providers: Lists | None = None
    backends: Lists | None = None
    models: Lists | None = None
    fallback: Fallback | None = None


class PolicySpec(_Strict):
    tenants: tuple[TenantId, ...] = ()
    residency: Residency
    retention: Retention
    fallback: Fallback
    require: Requirements | None = None
    providers: Lists | None = None
    backends: Lists | None = None
    models: Lists | None = None
    data_classes: dict[DataClassName, Rules] = Field(default_factory=dict)
    # The class of a request that carries no label (None: it is unlabelled), for every
    # tenant of the policy or per tenant; each must name one of `data_classes` (the
    # loader checks, with the file and line).
    default_data_class: DataClassName | None = None
    default_data_class_by_tenant: dict[TenantId, DataClassName] = Field(default_factory=dict)

    @field_validator("tenants")
    @classmethod
    def _no_repeats(cls, tenants: tuple[str, ...]) -> tuple[str, ...]:
        repeated = sorted({t for t in tenants if tenants.count(t) > 1})
        if repeated:
            raise ValueError(f"tenant listed more than once: {', '.join(repeated)}")
        return tenants

    @field_validator("fallback")
    @classmethod
    def _fallback_targets(cls, fallback: Fallback) -> Fallback:
        if fallback.mode != "never" and fallback.to is None:
            raise ValueError(
                "fallback.to is required unless mode is never: list the hosted backends or "
                "providers that may receive fallback traffic, in order ([] allows none)"
            )
        return fallback


class PolicyDocument(_Strict):
    apiVersion: Literal["policy.owngate.dev/v1"]  # the key as written in YAML
    kind: Literal["Policy"]
    metadata: Metadata
    spec: PolicySpec


class PolicySetSpec(_Strict):
    data_class_header: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")] = (
        DEFAULT_DATA_CLASS_HEADER
    )


class PolicySetDocument(_Strict):
    apiVersion: Literal["policy.owngate.dev/v1"]  # the key as written in YAML
    kind: Literal["PolicySet"]
    metadata: Metadata
    spec: PolicySetSpec = PolicySetSpec()
