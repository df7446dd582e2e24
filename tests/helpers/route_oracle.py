"""Where a request MAY go, restated from the documentation alone (the differential oracle).

Written from docs/policies.md, docs/configuration.md and docs/security.md only, in their
words, sharing no code with gateway/: the jurisdiction table is read out of
docs/policies.md itself, globs are `fnmatch`'s, and every input is the plain data a
security team and an operator write (a policy spec, gateway.yaml backends and tenants)
plus what a client sends (the model string, the request's headers). The property tests
(tests/unit/test_route_differential.py) compare the gateway's choice with `allowed`.

Deliberately literal readings (where the docs leave room, the stricter one):
- a model is looked up by the exact string the client sent: it names a configured model
  name or alias, or nothing ("a request for a model no configured backend serves is
  refused"); case, spaces, a provider prefix or an encoding make another name;
- a tenant's `models` is `["*"]` or a list of the public names it may use, compared
  exactly;
- the data-class label comes from the policy set's header only (every copy, every
  comma-separated value, stripped, lower case, all naming one class); a label in the
  body is no label;
- a `models` rule judges the model by every name it is served under: a deny entry
  matching any name of it (on any backend serving the name asked for, and on through
  the names those backends give it) excludes every backend serving the name asked for;
  an allow entry admits the backends that serve it by a name it matches.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import cache
from typing import Any

from tests.helpers.paths import REPO_ROOT as REPO

__all__ = ["Verdict", "allowed", "jurisdictions"]

SECTIONS = ("models", "backends", "providers", "residency", "retention", "require", "fallback")
MODES = ("never", "when_private_unavailable", "when_private_saturated")  # strictest first
DEFAULT_HEADER = "x-data-class"


@dataclass(frozen=True)
class Verdict:
    """`refused`: why nothing may serve (a short reason), else None; `private` and `hosted`:
    the backend ids that may see the request (hosted empty when the fallback mode is
    `never`); `mode`: the effective fallback mode."""

    refused: str | None
    private: frozenset[str] = frozenset()
    hosted: frozenset[str] = frozenset()
    mode: str = "never"

    @property
    def anywhere(self) -> frozenset[str]:
        return self.private | self.hosted


@cache
def jurisdictions() -> dict[str, frozenset[str]]:
    """Code → every name it stands for (the code too), from the table in docs/policies.md."""
    text = (REPO / "docs" / "policies.md").read_text()
    table_text = text.split("| code | stands for", 1)[1].split("\n\n", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in table_text.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`") or cells[0].startswith("`<"):
            continue
        codes = re.findall(r"`([a-z0-9-]+)`", cells[0])
        names = re.findall(r"`([a-z0-9-]+)`", cells[1])
        for code in codes:
            rows[code] = [*names, *(c for c in codes if c != code and "each other" in cells[1])]
    table: dict[str, frozenset[str]] = {}
    for code, names in rows.items():
        out = {code}
        for name in names:  # `eu` names member states, `eea` names `eu`
            out.add(name)
            for inner in rows.get(name, ()):
                out.add(inner)
                out.update(rows.get(inner, ()))
        table[code] = frozenset(out)
    return table


def _glob(value: str, patterns: Sequence[str]) -> bool:
    return any(fnmatchcase(value.lower(), p.lower()) for p in patterns)


def _region_in(region: str, entries: Sequence[str]) -> bool:
    table = jurisdictions()
    return any(_glob(region, sorted(table.get(e.lower(), {e}))) for e in entries)


def _facts(backend: Mapping[str, Any]) -> dict[str, Any]:
    hosted = backend["kind"] == "hosted"
    retention = backend.get("retention") or {}
    return {
        "id": backend["id"],
        "hosted": hosted,
        # "For a private backend the provider a policy sees is its declared owner. For a
        # hosted backend it is provider (or owner when provider is not set)."
        "provider": (backend.get("provider") or backend["owner"]) if hosted else backend["owner"],
        "region": backend["region"],
        "days": retention.get("days", 0),
        "zdr": retention.get("zero_data_retention", False),
        "training": retention.get("training", False),
        "attested": backend.get("identity") == "certificate",
    }


def _names_on(backend: Mapping[str, Any], model: str) -> list[str] | None:
    """The names `backend` serves the public name `model` under, or None."""
    for entry in backend["models"]:
        names = [entry["name"], *entry.get("aliases", ())]
        if model in names:
            return names
    return None


def _same_model(backends: Sequence[Mapping[str, Any]], model: str) -> list[str]:
    """Every name of the model `model` names: its names and aliases on each backend serving
    it, and so on through each of those names ("one public name may be served by several
    backends": it is one model)."""
    found, todo = {model}, [model]
    while todo:
        name = todo.pop()
        for backend in backends:
            for other in _names_on(backend, name) or ():
                if other not in found:
                    found.add(other)
                    todo.append(other)
    return sorted(found)


def _lists(rule: Mapping[str, Any], values: Sequence[str], denied: Sequence[str] = ()) -> bool:
    """allow/deny: deny wins; a missing allow allows everything; `allow: []` nothing."""
    if any(_glob(v, rule.get("deny", [])) for v in (*values, *denied)):
        return False
    allow = rule.get("allow")
    return allow is None or any(_glob(v, allow) for v in values)


def _passes(
    section: str,
    rules: Mapping[str, Any],
    facts: dict[str, Any],
    names: list[str],
    everywhere: list[str],
) -> bool:
    rule = rules.get(section)
    if rule is None:  # "Leaving a whole section out imposes no constraint"
        return True
    if section == "models":
        return _lists(rule, names, everywhere)
    if section == "backends":
        return _lists(rule, [facts["id"]])
    if section == "providers":
        return _lists(rule, [facts["provider"]])
    if section == "residency":
        region = facts["region"]
        # A backend declared by a code is anywhere in it: denied when a deny covers any part.
        places = jurisdictions().get(region.lower(), {region})
        denied = any(_region_in(place, rule.get("deny", [])) for place in places)
        return not denied and _region_in(region, rule["allow"])
    if section == "retention":
        limit, days = rule["max_days"], facts["days"]
        if limit == "zero":
            kept = not (facts["zdr"] and days == 0)
        else:
            kept = limit != "any" and days > int(limit)
        return not kept and not (facts["training"] and not rule.get("training", False))
    if section == "require":
        return "attested_facts" not in rule or facts["attested"]
    assert section == "fallback"  # "fallback applies to hosted backends only"
    if not facts["hosted"]:
        return True
    if rule["mode"] == "never":
        return False
    targets = rule.get("to")
    return targets is None or any(
        _glob(facts["id"], [t["backend"]])
        if "backend" in t
        else _glob(facts["provider"], [t["provider"]])
        for t in targets
    )


def label_of(headers: Sequence[tuple[str, str]], header: str) -> str | None:
    """The one class the request's `header` copies name; "" when they name none (empty,
    blank, or disagreeing: refused); None when the request has no such header."""
    values = [v for k, v in headers if k.lower() == header.lower()]
    if not values:
        return None
    stripped = [part.strip(" \t") for v in values for part in v.split(",")]  # SP, HTAB only
    labels = {p.lower() if p.isascii() else p for p in stripped}
    return labels.pop() if len(labels) == 1 and "" not in labels else ""


def allowed(
    backends: Sequence[Mapping[str, Any]],
    tenant: Mapping[str, Any],
    spec: Mapping[str, Any] | None,
    model: str,
    headers: Sequence[tuple[str, str]],
    header: str = DEFAULT_HEADER,
) -> Verdict:
    """Which backends may serve `model` (as the client sent it) for `tenant` under its
    policy `spec` (None: the tenant has no policy), given the request `headers`."""
    models = tenant.get("models", [])
    if "*" not in models and model not in models:
        return Verdict("the tenant may not use the model")
    serving = [b for b in backends if _names_on(b, model) is not None]
    if not serving:
        return Verdict("no configured backend serves the model")
    if spec is None or tenant["id"] not in spec.get("tenants", []):
        return Verdict("deny by default: the tenant has no policy")
    label = label_of(headers, header)
    if label is None:
        by_tenant = spec.get("default_data_class_by_tenant") or {}
        label = by_tenant.get(tenant["id"], spec.get("default_data_class"))
    classes = spec.get("data_classes") or {}
    if label is not None and label not in classes:
        return Verdict("the label names no class of the policy")
    scopes = [spec] if label is None else [spec, classes[label]]
    mode = spec["fallback"]["mode"]
    for scope in scopes[1:]:
        theirs = (scope.get("fallback") or {}).get("mode", mode)
        mode = min(mode, theirs, key=MODES.index)  # "the more restrictive"
    private: set[str] = set()
    hosted: set[str] = set()
    everywhere = _same_model(backends, model)
    for backend in serving:
        facts, names = _facts(backend), _names_on(backend, model) or []
        if all(_passes(s, r, facts, names, everywhere) for r in scopes for s in SECTIONS):
            (hosted if facts["hosted"] else private).add(facts["id"])
    if mode == "never":
        hosted.clear()
    if not private and not hosted:
        return Verdict("every backend serving the model is excluded", mode=mode)
    return Verdict(None, frozenset(private), frozenset(hosted), mode)
