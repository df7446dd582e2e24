"""What `owngate audit show` reports: requests per backend, region and data class,
fallbacks, refusals.

`summarise` folds records (in log order) into a `Summary`, keeping only those that match
the `Filters`. A completion matches when its dispatch did (it carries no tenant/backend).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from gateway.provenance.audit.figures import data_class_key
from gateway.provenance.formats.records import Record

__all__ = ["BackendRow", "Filters", "Summary", "summarise"]


@dataclass(frozen=True, slots=True)
class Filters:
    tenant: str | None = None
    backend: str | None = None
    since: datetime | None = None  # inclusive, timezone-aware
    until: datetime | None = None  # exclusive, timezone-aware

    def accepts(self, record: Record, backend: str | None, tenant: str | None) -> bool:
        if self.tenant is not None and tenant != self.tenant:
            return False
        if self.backend is not None and backend != self.backend:
            return False
        if self.since is None and self.until is None:
            return True
        moment = datetime.fromisoformat(record.time)
        if self.since is not None and moment < self.since:
            return False
        return self.until is None or moment < self.until


@dataclass(slots=True)
class BackendRow:
    backend: str
    region: str
    tier: str
    dispatched: int = 0
    fallbacks: int = 0
    completed: int = 0
    errors: int = 0
    tokens: int = 0


@dataclass(slots=True)
class Summary:
    records: list[tuple[int, Record]] = field(default_factory=list)
    backends: dict[tuple[str, str], BackendRow] = field(default_factory=dict)
    data_classes: Counter[str] = field(default_factory=Counter)  # dispatches per class
    fallback_reasons: Counter[str] = field(default_factory=Counter)
    refusal_rules: Counter[str] = field(default_factory=Counter)
    dispatched: int = 0
    completed: int = 0
    refused: int = 0

    def regions(self) -> Counter[str]:
        """Requests dispatched per region, over every backend there."""
        totals: Counter[str] = Counter()
        for row in self.backends.values():
            totals[row.region] += row.dispatched
        return totals

    def as_dict(self) -> dict[str, object]:
        return {
            "dispatched": self.dispatched,
            "regions": dict(self.regions()),
            "completed": self.completed,
            "refused": self.refused,
            "backends": [
                {
                    "backend": row.backend,
                    "region": row.region,
                    "tier": row.tier,
                    "dispatched": row.dispatched,
                    "fallbacks": row.fallbacks,
                    "completed": row.completed,
                    "errors": row.errors,
                    "tokens": row.tokens,
                }
                for row in self.backends.values()
            ],
            "data_classes": dict(self.data_classes),
            "fallback_reasons": dict(self.fallback_reasons),
            "refusal_rules": dict(self.refusal_rules),
        }


def summarise(
    records: Iterable[tuple[int, Record]], filters: Filters, *, keep_records: bool = False
) -> Summary:
    summary = Summary()
    open_dispatches: dict[int, tuple[str, str]] = {}  # index -> (backend, region) if matched
    for index, record in records:
        data = record.data
        if record.type == "dispatch":
            backend = data["backend"]
            if not filters.accepts(record, backend["id"], data["tenant"]):
                continue
            key = (backend["id"], backend["region"])
            row = summary.backends.setdefault(key, BackendRow(*key, backend["tier"]))
            row.dispatched += 1
            summary.dispatched += 1
            summary.data_classes[data_class_key(data)] += 1
            if data["fallback"] is not None:
                row.fallbacks += 1
                summary.fallback_reasons[data["fallback"]] += 1
            open_dispatches[index] = key
        elif record.type == "completion":
            matched = open_dispatches.pop(data["dispatch"]["index"], None)
            if matched is None:
                continue
            row = summary.backends[matched]
            row.completed += 1
            summary.completed += 1
            if data["error"] is not None or data["status"] >= 400:
                row.errors += 1
            if data["usage"] is not None:
                row.tokens += data["usage"]["total_tokens"]
        elif record.type == "refusal":
            if not filters.accepts(record, None, data["tenant"]) or filters.backend:
                continue
            summary.refused += 1
            summary.refusal_rules[data["rule"]] += 1
        elif not filters.accepts(record, None, None):  # admin: no tenant, no backend
            continue
        if keep_records:
            summary.records.append((index, record))
    return summary
