"""The values the record builders (records.py) take: where an entry landed (`LogEntry`),
the policy, backend, data class, trace steps and usage a record states. Each checks its
own fields on construction (record_checks.py) and raises RecordError for what the schema
would refuse."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.provenance.errors import RecordError
from gateway.provenance.formats.record_checks import check_count, check_flag, check_text
from gateway.provenance.formats.schema import DATA_CLASS_NAME

__all__ = [
    "BackendRef",
    "DataClass",
    "LogEntry",
    "PolicyRef",
    "Retention",
    "TraceStep",
    "Usage",
]


@dataclass(frozen=True, slots=True)
class LogEntry:
    """Where an appended record landed: its leaf index and RFC 6962 leaf hash."""

    index: int
    leaf_hash: bytes


@dataclass(frozen=True, slots=True)
class PolicyRef:
    id: str
    version: str
    digest: str

    def __post_init__(self) -> None:
        for name in ("id", "version", "digest"):
            check_text(getattr(self, name), f"policy {name}")


@dataclass(frozen=True, slots=True)
class Retention:
    days: int
    zero_data_retention: bool
    training: bool

    def __post_init__(self) -> None:
        check_count(self.days, "retention days")
        check_flag(self.zero_data_retention, "zero_data_retention")
        check_flag(self.training, "training")


@dataclass(frozen=True, slots=True)
class BackendRef:
    id: str
    tier: Literal["private", "hosted"]
    kind: str
    provider: str
    owner: str
    region: str
    retention: Retention

    def __post_init__(self) -> None:
        check_text(self.id, "backend id", empty=False)
        if self.tier not in ("private", "hosted"):
            raise RecordError(f"backend tier must be private or hosted, not {self.tier!r}")
        for name in ("kind", "provider", "owner", "region"):
            check_text(getattr(self, name), f"backend {name}")
        if type(self.retention) is not Retention:
            raise RecordError("backend retention must be a Retention")


@dataclass(frozen=True, slots=True)
class DataClass:
    """The data class a policy decision applied, as a record states it: `name` one of the
    policy's class names, None for none (an unlabelled request without a default, or a
    label naming no class). A client's label is never one: only the class it proved to be."""

    name: str | None

    def __post_init__(self) -> None:
        if self.name is not None and (
            type(self.name) is not str or DATA_CLASS_NAME.match(self.name) is None
        ):
            raise RecordError("data_class must be a policy's data-class name or None")


@dataclass(frozen=True, slots=True)
class TraceStep:
    """One line of the policy decision trace: a backend admitted or excluded, by which rule."""

    backend: str
    verdict: Literal["admitted", "excluded"]
    rule: str

    def __post_init__(self) -> None:
        check_text(self.backend, "trace backend")
        if self.verdict not in ("admitted", "excluded"):
            raise RecordError(f"trace verdict must be admitted or excluded, not {self.verdict!r}")
        check_text(self.rule, "trace rule")


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
            check_count(getattr(self, name), name)
