"""Property test: random policies, backends and data classes; the decision never admits a
backend a rule forbids, never drops one every rule allows, and names only rules that exist.

The oracle below restates each rule from the language reference (docs/policies.md) with
`fnmatch` and the jurisdiction table; it shares no code with the compiled filters.
"""

from __future__ import annotations

import dataclasses
from fnmatch import fnmatchcase
from typing import Any, Literal

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.policy import BackendFacts, Decision, PolicySet, parse_policies
from gateway.policy.jurisdictions import expand

REGIONS = ["eu-west-1", "westeurope", "us-east-1", "us", "eu-west-2", "eu-central-2", "fr", "dc-1"]
PROVIDERS = ["own", "azure", "openai", "Mistral"]
MODELS = ["m1", "m2", "m3"]
RESIDENCY = ["eu", "us", "uk", "ch", "de", "fr", "eu-*", "*", "dc-1", "WestEurope", "ie"]
MODES = ["never", "when_private_unavailable", "when_private_saturated"]


@st.composite
def backends(draw: st.DrawFn) -> tuple[BackendFacts, ...]:
    count = draw(st.integers(1, 6))
    out = []
    for i in range(count):
        tier: Literal["private", "hosted"] = draw(st.sampled_from(["private", "hosted"]))
        out.append(
            BackendFacts(
                id=f"b{i}",
                tier=tier,
                kind="vllm" if tier == "private" else "hosted",
                provider=draw(st.sampled_from(PROVIDERS)),
                region=draw(st.sampled_from(REGIONS)),
                owner="owner",
                retention_days=draw(st.sampled_from([0, 0, 7, 8, 30, 31, 90])),
                zero_data_retention=draw(st.booleans()),
                training=draw(st.booleans()),
                models=frozenset(draw(st.lists(st.sampled_from(MODELS), min_size=1, max_size=3))),
                attested=tier == "private" and draw(st.booleans()),
            )
        )
    return tuple(out)


def subset(items: list[str], max_size: int = 3) -> st.SearchStrategy[list[str]]:
    return st.lists(st.sampled_from(items), max_size=max_size, unique=True)


def lists(items: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    patterns = [*items, "*", "b*", "?1", "o*"]
    return st.fixed_dictionaries(
        {}, optional={"allow": subset(patterns), "deny": subset(patterns, 2)}
    )


@st.composite
def fallback(draw: st.DrawFn, base: bool) -> dict[str, Any]:
    mode = draw(st.sampled_from(MODES))
    out: dict[str, Any] = {"mode": mode}
    if mode == "when_private_saturated":
        out["saturation_threshold"] = draw(st.sampled_from([0.5, 1, 4]))
    if mode != "never" and (base or draw(st.booleans())):
        targets = [*(f"b{i}" for i in range(6)), "*"]
        entry = st.one_of(
            st.builds(lambda b: {"backend": b}, st.sampled_from(targets)),
            st.builds(lambda p: {"provider": p}, st.sampled_from([*PROVIDERS, "*", "m*"])),
        )
        out["to"] = draw(st.lists(entry, max_size=3))
    return out


def sections(base: bool) -> st.SearchStrategy[dict[str, Any]]:
    residency = st.fixed_dictionaries(
        {"allow": subset(RESIDENCY)}, optional={"deny": subset(RESIDENCY, 2)}
    )
    retention = st.fixed_dictionaries(
        {"max_days": st.sampled_from(["zero", "any", 0, 7, 30])},
        optional={"training": st.booleans()},
    )
    optional = {
        "providers": lists(PROVIDERS),
        "backends": lists([f"b{i}" for i in range(6)]),
        "models": lists(MODELS),
        "require": st.sampled_from([[], ["attested_facts"]]),
    }
    required = {"residency": residency, "retention": retention, "fallback": fallback(base)}
    if base:
        return st.fixed_dictionaries(required, optional=optional)
    return st.fixed_dictionaries({}, optional={**optional, **required})


@st.composite
def policies(draw: st.DrawFn) -> dict[str, Any]:
    spec = draw(sections(base=True))
    spec["tenants"] = ["t"]
    labels = draw(subset(["phi", "pii"], 2))
    spec["data_classes"] = {label: draw(sections(base=False)) for label in labels}
    return spec


def matches(value: str, patterns: list[str]) -> bool:
    return any(fnmatchcase(value.lower(), p.lower()) for p in patterns)


def in_region(region: str, entries: list[str]) -> bool:
    return any(matches(region, list(expand(entry))) for entry in entries)


def violated(section: str, rules: dict[str, Any], backend: BackendFacts, model: str) -> bool:
    """Whether `backend` serving `model` breaks `section` of `rules` (an absent one: never)."""
    rule = rules.get(section)
    if rule is None:
        return False
    if section in ("providers", "backends", "models"):
        value = {"providers": backend.provider, "backends": backend.id, "models": model}[section]
        allow = rule.get("allow")
        return matches(value, rule.get("deny", [])) or (
            allow is not None and not matches(value, allow)
        )
    if section == "residency":
        region = backend.region
        # A region declared as a code is anywhere in it: a deny of any part holds for it.
        denied = any(in_region(place, rule.get("deny", [])) for place in expand(region))
        return denied or not in_region(region, rule["allow"])
    if section == "require":
        return "attested_facts" in rule and not backend.attested
    if section == "retention":
        limit, days = rule["max_days"], backend.retention_days
        too_long = (
            not (backend.zero_data_retention and days == 0)
            if limit == "zero"
            else limit != "any" and days > limit
        )
        return too_long or (backend.training and not rule.get("training", False))
    assert section == "fallback"
    if backend.tier == "private":
        return False
    if rule["mode"] == "never":
        return True
    targets = rule.get("to")
    return targets is not None and not any(hits(t, backend) for t in targets)


def hits(target: dict[str, str], backend: BackendFacts) -> bool:
    if "backend" in target:
        return matches(backend.id, [target["backend"]])
    return matches(backend.provider, [target["provider"]])


SECTIONS = ("models", "backends", "providers", "residency", "retention", "require", "fallback")


def check(
    ps: PolicySet,
    spec: dict[str, Any],
    declared: tuple[BackendFacts, ...],
    model: str,
    label: str | None,
) -> Decision:
    decision = ps.decide("t", model, label)
    scopes: list[tuple[str, dict[str, Any]]] = [("p", spec)]
    if label is not None:
        scopes.append((f"p/data_classes.{label}", spec["data_classes"][label]))
    serving = [b for b in declared if model in b.models]
    by_id = {b.id: b for b in declared}
    assert [t.backend for t in decision.trace] == [b.id for b in serving]
    eligible = set(decision.eligible)
    assert len(eligible) == len(decision.eligible)
    assert {by_id[b].tier for b in decision.private} <= {"private"}
    assert {by_id[b].tier for b in decision.hosted} <= {"hosted"}
    for backend in serving:
        broken = [
            f"{prefix}/{section}"
            for prefix, rules in scopes
            for section in SECTIONS
            if violated(section, rules, backend, model)
        ]
        entry = next(t for t in decision.trace if t.backend == backend.id)
        assert entry.rule in ps.rules
        if broken:  # some rule forbids it: excluded, by the first one that does
            assert backend.id not in eligible
            assert (entry.verdict, entry.rule) == ("excluded", broken[0])
        else:  # every rule allows it: eligible
            assert backend.id in eligible and entry.verdict == "admitted"
    if decision.fallback == "never":
        assert decision.hosted == ()
    assert (decision.refusal is not None) == (not eligible)
    if decision.refusal is not None:
        assert decision.refusal.rule in ps.rules
        assert decision.refusal.message.startswith(f"policy {decision.refusal.rule}: ")
    to = spec["fallback"].get("to") or []
    first = [next(i for i, t in enumerate(to) if hits(t, by_id[b])) for b in decision.hosted]
    assert first == sorted(first)  # hosted backends come in fallback.to order
    return decision


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(declared=backends(), spec=policies())
def test_decisions_obey_every_rule(
    declared: tuple[BackendFacts, ...], spec: dict[str, Any]
) -> None:
    document = {
        "apiVersion": "policy.owngate.dev/v1",
        "kind": "Policy",
        "metadata": {"id": "p"},
        "spec": spec,
    }
    ps = parse_policies([("p.yaml", yaml.safe_dump(document))], declared)
    for model in MODELS:
        if not any(model in b.models for b in declared):
            assert ps.decide("t", model, None).refusal is not None
            continue
        plain = check(ps, spec, declared, model, None)
        for label in spec["data_classes"]:
            labelled = check(ps, spec, declared, model, label)
            assert set(labelled.eligible) <= set(plain.eligible)  # a data class only tightens
    stranger = ps.decide("stranger", MODELS[0], None)
    assert stranger.eligible == () and stranger.refusal is not None
    assert stranger.refusal.rule in ps.rules


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(declared=backends(), spec=policies(), data=st.data())
def test_a_default_data_class_decides_as_if_the_client_sent_it(
    declared: tuple[BackendFacts, ...], spec: dict[str, Any], data: st.DataObject
) -> None:
    """No label under `default_data_class: C` is exactly the label C: never wider."""
    default = data.draw(st.sampled_from(["phi", "pii"]))
    spec["data_classes"].setdefault(default, {})
    document = {
        "apiVersion": "policy.owngate.dev/v1",
        "kind": "Policy",
        "metadata": {"id": "p"},
        "spec": {**spec, "default_data_class": default},
    }
    ps = parse_policies([("p.yaml", yaml.safe_dump(document))], declared)
    for model in MODELS:
        unlabelled = ps.decide("t", model, None)
        assert unlabelled.default_rule == "p/default_data_class"
        assert dataclasses.replace(unlabelled, default_rule=None) == ps.decide("t", model, default)
