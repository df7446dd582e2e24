"""Policy rule sections, table-driven: residency, retention, allow/deny lists, fallback,
data classes, deny by default, refusals and the decision cache."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.policy import BackendFacts, Decision, PolicySet, UnknownDataClass, parse_policies
from gateway.policy.jurisdictions import COUNTRIES, GROUPS, expand, region_matches
from tests.helpers.paths import REPO_ROOT


def facts(
    id: str,
    tier: str = "private",
    *,
    region: str = "eu-west-1",
    provider: str = "own",
    days: int = 0,
    zdr: bool = True,
    training: bool = False,
    models: tuple[str, ...] = ("m",),
) -> BackendFacts:
    return BackendFacts(
        id=id,
        tier="private" if tier == "private" else "hosted",
        kind="vllm" if tier == "private" else "hosted",
        provider=provider,
        region=region,
        owner=provider,
        retention_days=days,
        zero_data_retention=zdr,
        training=training,
        models=frozenset(models),
    )


BACKENDS = (
    facts("gpu-eu", region="eu-west-1"),
    facts("gpu-us", region="us-east-1"),
    facts("azure-eu", "hosted", region="westeurope", provider="azure"),
    facts("openai", "hosted", region="us", provider="openai", days=30, zdr=False),
    facts("trainer", "hosted", region="eu-central-1", provider="cheap", zdr=False, training=True),
)

PERMISSIVE: dict[str, Any] = {
    "residency": {"allow": ["*"]},
    "retention": {"max_days": "any", "training": True},
    "fallback": {"mode": "when_private_unavailable", "to": [{"provider": "*"}]},
}


def policy_set(
    declared: tuple[BackendFacts, ...] = BACKENDS, version: str | None = None, **spec: Any
) -> PolicySet:
    metadata: dict[str, Any] = {"id": "p"} if version is None else {"id": "p", "version": version}
    document = {
        "apiVersion": "policy.owngate.dev/v1",
        "kind": "Policy",
        "metadata": metadata,
        "spec": {"tenants": ["t"], **PERMISSIVE, **spec},
    }
    return parse_policies([("p.yaml", yaml.safe_dump(document))], declared)


def decide(data_class: str | None = None, model: str = "m", **spec: Any) -> Decision:
    return policy_set(**spec).decide("t", model, data_class)


def excluded(decision: Decision) -> dict[str, str]:
    return {t.backend: t.rule for t in decision.trace if t.verdict == "excluded"}


ALL = ("gpu-eu", "gpu-us", "azure-eu", "openai", "trainer")


@pytest.mark.parametrize(
    ("residency", "eligible"),
    [
        ({"allow": ["eu"]}, ("gpu-eu", "azure-eu", "trainer")),
        ({"allow": ["EU"]}, ("gpu-eu", "azure-eu", "trainer")),  # names ignore case
        ({"allow": ["us"]}, ("gpu-us", "openai")),
        ({"allow": ["eu-west-1"]}, ("gpu-eu",)),  # an exact region
        ({"allow": ["eu-*"]}, ("gpu-eu", "trainer")),  # a glob
        ({"allow": ["de"]}, ("trainer",)),  # eu-central-1 is Frankfurt
        ({"allow": ["nl"]}, ("azure-eu",)),  # westeurope is the Netherlands
        ({"allow": ["eu"], "deny": ["de"]}, ("gpu-eu", "azure-eu")),  # deny wins
        ({"allow": ["*"]}, ALL),
        ({"allow": []}, ()),  # an empty allow list allows nothing
    ],
)
def test_residency(residency: dict[str, Any], eligible: tuple[str, ...]) -> None:
    decision = decide(residency=residency)
    assert set(decision.eligible) == set(eligible)
    assert set(excluded(decision)) == set(ALL) - set(eligible)
    assert set(excluded(decision).values()) <= {"p/residency"}


@pytest.mark.parametrize(
    ("region", "entry", "matches"),
    [
        ("eu-west-1", "eu", True),
        ("westeurope", "eu", True),
        ("europe-west4", "eu", True),
        ("eu", "eu", True),  # an operator may declare the code itself
        ("pt", "eu", True),
        ("eu-west-2", "eu", False),  # London
        ("europe-west2", "eu", False),  # London
        ("eu-central-2", "eu", False),  # Zurich
        ("europe-west6", "eu", False),  # Zurich
        ("eu-west-2", "uk", True),
        ("uksouth", "gb", True),
        ("uk", "gb", True),
        ("switzerlandnorth", "ch", True),
        ("norwayeast", "eu", False),
        ("norwayeast", "eea", True),
        ("sa-east-1", "br", True),  # São Paulo, whatever its prefix suggests
        ("us-east-1", "us", True),
        ("eastus", "us", True),
        ("US-EAST-1", "us", True),
        ("dc-dublin", "ie", False),
        ("dc-dublin", "dc-dublin", True),
        ("dc-dublin", "dc-*", True),
    ],
)
def test_jurisdictions(region: str, entry: str, matches: bool) -> None:
    assert (region_matches(region, expand(entry)) is not None) is matches


def test_jurisdiction_table_is_consistent() -> None:
    regions = [r for rs in COUNTRIES.values() for r in rs if r not in COUNTRIES]
    assert all(r == r.lower() for r in regions)
    owners: dict[str, set[str]] = {}
    for code, rs in COUNTRIES.items():
        for region in rs:
            owners.setdefault(region, set()).add(code)
    # A region lies in one country (uk and gb are one country under two codes).
    assert all(o <= {"uk", "gb"} or len(o) == 1 for o in owners.values()), owners
    # A group's members are countries, or another group (the EEA holds the EU's code).
    known = COUNTRIES.keys() | GROUPS.keys()
    assert all(member in known for members in GROUPS.values() for member in members)


@pytest.mark.parametrize(
    ("retention", "eligible", "reason"),
    [
        ({"max_days": "zero", "training": True}, ("gpu-eu", "gpu-us", "azure-eu"), "zero"),
        ({"max_days": 0, "training": True}, ("gpu-eu", "gpu-us", "azure-eu", "trainer"), "30"),
        ({"max_days": 30, "training": True}, ALL, None),
        ({"max_days": 29, "training": True}, ("gpu-eu", "gpu-us", "azure-eu", "trainer"), "29"),
        ({"max_days": "any"}, ("gpu-eu", "gpu-us", "azure-eu", "openai"), "train"),
        ({"max_days": "any", "training": False}, ("gpu-eu", "gpu-us", "azure-eu", "openai"), None),
    ],
)
def test_retention(
    retention: dict[str, Any], eligible: tuple[str, ...], reason: str | None
) -> None:
    decision = decide(retention=retention)
    assert set(decision.eligible) == set(eligible)
    assert set(excluded(decision).values()) <= {"p/retention"}
    if reason is not None:
        assert any(reason in t.reason for t in decision.trace if t.verdict == "excluded")


def test_zero_retention_needs_the_attestation_and_zero_days() -> None:
    odd = facts("odd", "hosted", provider="x", days=7, zdr=True)  # declared both: inconsistent
    ps = policy_set((*BACKENDS, odd), retention={"max_days": "zero"})
    assert "odd" in excluded(ps.decide("t", "m", None))


@pytest.mark.parametrize(
    ("section", "lists", "eligible", "rule"),
    [
        ("providers", {"deny": ["openai"]}, ("gpu-eu", "gpu-us", "azure-eu", "trainer"), None),
        ("providers", {"deny": ["OpenAI"]}, ("gpu-eu", "gpu-us", "azure-eu", "trainer"), None),
        ("providers", {"allow": ["azure", "own"]}, ("gpu-eu", "gpu-us", "azure-eu"), None),
        ("providers", {"allow": []}, (), "p/providers"),
        ("backends", {"allow": ["gpu-*"]}, ("gpu-eu", "gpu-us"), None),
        ("backends", {"allow": ["*"], "deny": ["gpu-*"]}, ("azure-eu", "openai", "trainer"), None),
        ("backends", {"allow": ["gpu-eu"], "deny": ["gpu-eu"]}, (), "p/backends"),  # deny wins
        ("models", {"allow": ["m"]}, ALL, None),
        ("models", {"allow": ["M*"]}, ALL, None),
        ("models", {"deny": ["m"]}, (), "p/models"),
        ("models", {"allow": ["other"]}, (), "p/models"),
    ],
)
def test_allow_and_deny_lists(
    section: str, lists: dict[str, Any], eligible: tuple[str, ...], rule: str | None
) -> None:
    spec: dict[str, Any] = {section: lists}
    decision = policy_set(**spec).decide("t", "m", None)
    assert set(decision.eligible) == set(eligible)
    assert set(excluded(decision).values()) <= {f"p/{section}"}
    assert (decision.refusal.rule if decision.refusal else None) == rule


@pytest.mark.parametrize(
    ("fallback", "hosted", "mode", "threshold"),
    [
        ({"mode": "never"}, (), "never", None),
        (
            {"mode": "when_private_unavailable", "to": [{"provider": "*"}]},
            ("azure-eu", "openai", "trainer"),  # gateway.yaml order
            "when_private_unavailable",
            None,
        ),
        (
            {
                "mode": "when_private_unavailable",
                "to": [{"backend": "openai"}, {"provider": "az*"}],
            },
            ("openai", "azure-eu"),  # fallback.to order
            "when_private_unavailable",
            None,
        ),
        ({"mode": "when_private_unavailable", "to": []}, (), "when_private_unavailable", None),
        (
            {
                "mode": "when_private_saturated",
                "saturation_threshold": 2,
                "to": [{"backend": "t*"}],
            },
            ("trainer",),
            "when_private_saturated",
            2.0,
        ),
    ],
)
def test_fallback(
    fallback: dict[str, Any], hosted: tuple[str, ...], mode: str, threshold: float | None
) -> None:
    decision = decide(fallback=fallback)
    assert decision.private == ("gpu-eu", "gpu-us")
    assert decision.hosted == hosted
    assert (decision.fallback, decision.saturation_threshold) == (mode, threshold)
    assert decision.fallback_rule == "p/fallback"
    for backend in {"azure-eu", "openai", "trainer"} - set(hosted):
        assert excluded(decision)[backend] == "p/fallback"
    admitted = {t.backend: t.rule for t in decision.trace if t.verdict == "admitted"}
    assert admitted == {"gpu-eu": "p/private", "gpu-us": "p/private"} | dict.fromkeys(
        hosted, "p/fallback"
    )


C = "p/data_classes.c"


@pytest.mark.parametrize(
    ("base", "data_class", "eligible", "rules"),
    [
        # allow sets intersect: EU, then Ireland only
        ({"residency": {"allow": ["eu"]}}, {"residency": {"allow": ["ie"]}}, ("gpu-eu",), None),
        # a class cannot widen: EU and US have nothing in common
        ({"residency": {"allow": ["eu"]}}, {"residency": {"allow": ["us"]}}, (), None),
        # deny lists add up
        (
            {"providers": {"deny": ["openai"]}},
            {"providers": {"deny": ["azure"]}},
            ("gpu-eu", "gpu-us", "trainer"),
            {"openai": "p/providers", "azure-eu": f"{C}/providers"},
        ),
        # the stricter retention applies
        (
            {"retention": {"max_days": 30}},
            {"retention": {"max_days": "zero"}},
            ("gpu-eu", "gpu-us", "azure-eu"),
            {"openai": f"{C}/retention", "trainer": "p/retention"},
        ),
        # a class retention that is looser changes nothing
        (
            {"retention": {"max_days": "zero"}},
            {"retention": {"max_days": "any", "training": True}},
            ("gpu-eu", "gpu-us", "azure-eu"),
            {"openai": "p/retention", "trainer": "p/retention"},
        ),
        # fallback.to entries intersect, in the policy's order
        (
            {"fallback": {"mode": "when_private_unavailable", "to": [{"provider": "*"}]}},
            {"fallback": {"mode": "when_private_unavailable", "to": [{"backend": "azure-eu"}]}},
            ("gpu-eu", "gpu-us", "azure-eu"),
            {"openai": f"{C}/fallback", "trainer": f"{C}/fallback"},
        ),
        # models allow sets intersect
        ({"models": {"allow": ["m*"]}}, {"models": {"deny": ["m"]}}, (), None),
    ],
)
def test_data_classes_only_tighten(
    base: dict[str, Any],
    data_class: dict[str, Any],
    eligible: tuple[str, ...],
    rules: dict[str, str] | None,
) -> None:
    ps = policy_set(**base, data_classes={"c": data_class})
    plain, labelled = ps.decide("t", "m", None), ps.decide("t", "m", "c")
    assert set(labelled.eligible) == set(eligible)
    assert set(labelled.eligible) <= set(plain.eligible)
    if rules is not None:
        assert excluded(labelled) == rules


U, S = "when_private_unavailable", "when_private_saturated"


@pytest.mark.parametrize(
    ("base", "extra", "mode", "threshold", "rule"),
    [
        (U, "never", "never", None, f"{C}/fallback"),
        (f"{S}:2", U, U, None, f"{C}/fallback"),
        (U, f"{S}:9", U, None, "p/fallback"),  # looser: ignored
        ("never", U, "never", None, "p/fallback"),
        (f"{S}:2", f"{S}:5", S, 5.0, f"{C}/fallback"),  # falls back later: stricter
        (f"{S}:5", f"{S}:2", S, 5.0, "p/fallback"),
    ],
)
def test_the_more_restrictive_fallback_applies(
    base: str, extra: str, mode: str, threshold: float | None, rule: str
) -> None:
    def section(text: str, to: list[dict[str, str]] | None) -> dict[str, Any]:
        name, _, limit = text.partition(":")
        out: dict[str, Any] = {"mode": name}
        if limit:
            out["saturation_threshold"] = float(limit)
        if name != "never" and to is not None:
            out["to"] = to
        return out

    ps = policy_set(
        fallback=section(base, [{"provider": "*"}]),
        data_classes={"c": {"fallback": section(extra, None)}},
    )
    decision = ps.decide("t", "m", "c")
    assert (decision.fallback, decision.saturation_threshold) == (mode, threshold)
    assert decision.fallback_rule == rule
    assert (decision.hosted == ()) is (mode == "never")


def test_a_tenant_without_a_policy_gets_nothing() -> None:
    decision = policy_set().decide("stranger", "m", None)
    assert decision.eligible == ()
    assert decision.refusal is not None and decision.refusal.rule == "owngate/default-deny"
    assert decision.refusal.message.startswith("policy owngate/default-deny: ")
    assert {t.verdict for t in decision.trace} == {"excluded"}
    assert decision.fallback == "never"


def test_a_model_no_backend_serves_is_refused() -> None:
    decision = policy_set().decide("t", "nope", None)
    assert decision.refusal is not None and decision.refusal.rule == "owngate/unknown-model"
    assert decision.trace == ()


def test_unknown_data_class_is_an_error_naming_the_rule() -> None:
    ps = policy_set(data_classes={"phi": {"fallback": {"mode": "never"}}})
    with pytest.raises(UnknownDataClass) as info:
        ps.decide("t", "m", "secret")
    assert info.value.rule == "p/data_classes" and info.value.known == ("phi",)
    assert str(info.value).startswith("policy p/data_classes: data class 'secret'")
    assert ps.decide("t", "m", " PHI ").data_class == "phi"  # labels ignore case and spaces
    with pytest.raises(UnknownDataClass):
        policy_set().decide("t", "m", "")


def test_refusal_names_the_rule_that_excluded_most_then_the_more_specific() -> None:
    decision = decide(residency={"allow": ["us"]}, fallback={"mode": "never"})
    # gpu-eu, azure-eu and trainer by residency; openai by fallback; gpu-us admitted
    assert decision.refusal is None and decision.private == ("gpu-us",)
    refused = decide(
        backends={"allow": ["azure-eu", "openai"]},
        residency={"allow": ["us"]},
        data_classes={"c": {"fallback": {"mode": "never"}}},
        data_class="c",
    )
    assert excluded(refused) == {
        "gpu-eu": "p/backends",
        "gpu-us": "p/backends",
        "trainer": "p/backends",
        "azure-eu": "p/residency",
        "openai": f"{C}/fallback",
    }
    assert refused.refusal is not None and refused.refusal.rule == "p/backends"
    two = policy_set(
        (facts("a", "hosted", region="us", provider="x"), facts("b", "hosted", provider="y")),
        residency={"allow": ["eu"]},
        data_classes={"c": {"fallback": {"mode": "never"}}},
    ).decide("t", "m", "c")
    # one exclusion each: the data class's rule (checked later, more specific) is named
    assert two.refusal is not None and two.refusal.rule == f"{C}/fallback"
    assert two.refusal.message.startswith(f"policy {C}/fallback: no backend may serve")


def test_decisions_are_cached_for_known_keys_only() -> None:
    ps = policy_set()
    assert ps.decide("t", "m", None) is ps.decide("t", "m", None)
    assert ps.decide("t", "m", None) == ps.decide_uncached("t", "m", None)
    assert ps.decide("t", "unknown", None) is not ps.decide("t", "unknown", None)
    assert ps.decide("x", "m", None) is not ps.decide("x", "m", None)


def test_decision_carries_policy_identity() -> None:
    ps = policy_set(version="7")
    decision = ps.decide("t", "m", None)
    assert (decision.policy_id, decision.policy_version) == ("p", "7")
    assert decision.policy_digest == ps.digest and ps.digest.startswith("sha256:")
    unversioned = policy_set().decide("t", "m", None)
    assert unversioned.policy_version.startswith("sha256:")
    assert len(unversioned.policy_version) == len("sha256:") + 12
    assert ps.id == "owngate" and ps.version == ps.digest[: len("sha256:") + 12]
    assert ps.rules >= {"p/private", "p/residency", "p/retention", "p/fallback"}


def test_every_jurisdiction_code_is_documented() -> None:
    docs = (REPO_ROOT / "docs" / "policies.md").read_text()
    table = docs[docs.index("| code | stands for") :]
    for code in (*GROUPS, *COUNTRIES):
        assert f"`{code}`" in table, code
    for regions in COUNTRIES.values():
        for region in regions:
            assert f"`{region}`" in table, region


def test_hidden_folders_are_not_read(tmp_path: Path) -> None:
    """A Kubernetes ConfigMap volume holds each file twice: once under `..<timestamp>/`."""
    from gateway.policy.source import discover

    (tmp_path / "..2026_11_30").mkdir()
    (tmp_path / "..2026_11_30" / "p.yaml").write_text("x: 1\n")
    (tmp_path / "p.yaml").write_text("x: 1\n")
    files, issues = discover([tmp_path])
    assert files == [tmp_path / "p.yaml"] and issues == []


def test_default_data_class_gives_an_unlabelled_request_that_class() -> None:
    classes = {"phi": {"fallback": {"mode": "never"}}, "public": {}}
    ps = policy_set(data_classes=classes, default_data_class="phi")
    unlabelled = ps.decide("t", "m", None)
    labelled = ps.decide("t", "m", "phi")
    assert (unlabelled.data_class, unlabelled.default_rule) == ("phi", "p/default_data_class")
    assert (labelled.data_class, labelled.default_rule) == ("phi", None)
    assert unlabelled.hosted == labelled.hosted == ()  # fallback never: as if labelled
    assert unlabelled.trace == labelled.trace
    assert unlabelled.fallback_rule == "p/data_classes.phi/fallback"
    assert ps.decide("t", "m", "public").hosted != ()  # a label the client sends counts
    assert "p/default_data_class" in ps.rules
    assert unlabelled.as_dict()["default_rule"] == "p/default_data_class"
    assert ps.decide("t", "m", None) is unlabelled  # cached like any known key
    with pytest.raises(UnknownDataClass):
        ps.decide("t", "m", "")  # an empty label is not "no label"
    # Without a default, an unlabelled request has only the policy's own rules.
    plain = policy_set(data_classes=classes).decide("t", "m", None)
    assert (plain.data_class, plain.default_rule) == (None, None)
    assert plain.hosted != ()


def test_a_per_tenant_default_overrides_the_policy_default() -> None:
    classes = {"phi": {"fallback": {"mode": "never"}}, "public": {}}
    ps = policy_set(
        data_classes=classes,
        tenants=["t", "u"],
        default_data_class="public",
        default_data_class_by_tenant={"u": "phi"},
    )
    for tenant, (label, rule) in {
        "t": ("public", "p/default_data_class"),
        "u": ("phi", "p/default_data_class_by_tenant.u"),
    }.items():
        decision = ps.decide(tenant, "m", None)
        assert (decision.data_class, decision.default_rule) == (label, rule)
    only_tenant = policy_set(
        data_classes=classes, tenants=["t", "u"], default_data_class_by_tenant={"u": "phi"}
    )
    assert only_tenant.decide("t", "m", None).data_class is None
    assert only_tenant.decide("u", "m", None).data_class == "phi"


def test_a_tenant_without_a_policy_has_no_data_class() -> None:
    decision = policy_set().decide("stranger", "m", "Jane Doe")
    assert decision.refusal is not None and decision.data_class is None


def _aliased(id: str) -> BackendFacts:
    """A backend serving one model as `llama-3.1-8b` and by its alias `llama3`."""
    base = facts(id, models=("llama-3.1-8b", "llama3"))
    return BackendFacts(
        **{f: getattr(base, f) for f in BackendFacts.__dataclass_fields__ if f != "model_groups"},
        model_groups=(frozenset({"llama-3.1-8b", "llama3"}),),
    )


@pytest.mark.parametrize(
    ("models", "asked", "eligible"),
    [
        ({"deny": ["llama-3.1-8b"]}, "llama3", False),  # the alias does not escape the deny
        ({"deny": ["llama-3.1-8b"]}, "llama-3.1-8b", False),
        ({"deny": ["llama3"]}, "llama-3.1-8b", False),  # a deny written for the alias
        ({"allow": ["llama-3.1-8b"]}, "llama3", True),  # the same model, asked by its alias
        ({"allow": ["other"]}, "llama3", False),
        ({"allow": ["llama*"], "deny": ["llama-3.1-*"]}, "llama3", False),  # deny wins
    ],
)
def test_a_models_rule_judges_a_model_by_all_its_names(
    models: dict[str, Any], asked: str, eligible: bool
) -> None:
    decision = policy_set((_aliased("gpu"),), models=models).decide("t", asked, None)
    assert (decision.private == ("gpu",)) is eligible, decision.trace
    if not eligible:
        assert excluded(decision) == {"gpu": "p/models"}


@pytest.mark.parametrize("in_class", [False, True])
@pytest.mark.parametrize(
    ("models", "admitted", "by_models"),
    [
        ({"deny": ["llama3"]}, (), ("gpu", "plain-eu")),
        ({"allow": ["llama3"]}, ("gpu",), ("plain-eu",)),
    ],
)
def test_a_models_verdict_when_backends_alias_a_model_differently(
    models: dict[str, Any], admitted: tuple[str, ...], by_models: tuple[str, ...], in_class: bool
) -> None:
    """One backend serves `llama-3.1-8b` also as `llama3`, others only by its name. A deny
    naming the alias holds on every backend serving `llama-3.1-8b` (the same model, as the
    gateway routes it); an allow naming it admits only the backend serving it by that name
    (the decision used to raise KeyError). A backend the rule passes still faces every
    other section (here residency)."""
    plain = facts("plain-us", region="us-east-1", models=("llama-3.1-8b",))
    declared = (_aliased("gpu"), plain, replace(plain, id="plain-eu", region="eu-west-1"))
    spec: dict[str, Any] = {"residency": {"allow": ["eu"]}}
    if in_class:
        spec["data_classes"] = {"phi": {"models": models}}
    else:
        spec["models"] = models
    label = "phi" if in_class else None
    decision = policy_set(declared, **spec).decide("t", "llama-3.1-8b", label)
    assert decision.private == admitted
    rule = "p/data_classes.phi/models" if in_class else "p/models"
    # The policy's models rule comes before its residency, a data class's after both.
    us = "p/residency" if in_class else rule
    assert excluded(decision) == {**dict.fromkeys(by_models, rule), "plain-us": us}


@pytest.mark.parametrize(
    "models",
    [
        # `y` a model of its own and an alias of `x`: the plan for `y` held the route to
        # upstream `x` too, while `models: {deny: [x]}` judged `y` by the first group only.
        [{"name": "y"}, {"name": "x", "aliases": ["y"]}],
        [{"name": "x", "aliases": ["y"]}, {"name": "z", "aliases": ["y"]}],
        [{"name": "x", "aliases": ["x"]}],
    ],
)
def test_a_backend_serves_each_name_for_one_model_only(models: list[dict[str, Any]]) -> None:
    from pydantic import ValidationError

    from gateway.config.schema import BackendSettings
    from tests.helpers.gateways import backend

    spec = backend("gpu", "http://127.0.0.1:9", "m")
    spec["models"] = models
    with pytest.raises(ValidationError, match="more than once"):
        BackendSettings.model_validate(spec)


_NOT_PLAIN = r"spaces at its ends|U\+[0-9A-F]{4} "


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("region", "us-east-1 "),
        ("region", "us-east-1\u200b"),
        ("owner", " openai"),
        ("provider", "openai\t"),
        ("region", "\u0435u-west-1"),  # a Cyrillic e: escapes `residency.deny: [eu*]`
        ("provider", "\u043epenai"),  # a Cyrillic o
        ("owner", "acme\u2010corp"),  # U+2010 HYPHEN
    ],
)
def test_declared_facts_policies_match_are_plain_names(key: str, value: str) -> None:
    """A region or provider no policy entry can match escaped every deny written for it
    (`residency.deny: [us]` let `us-east-1 ` through); gateway.yaml refuses it."""
    from pydantic import ValidationError

    from gateway.config.schema import BackendSettings
    from tests.helpers.gateways import backend

    spec = backend("gpu", "http://127.0.0.1:9", "m")
    spec[key] = value
    with pytest.raises(ValidationError, match=_NOT_PLAIN):
        BackendSettings.model_validate(spec)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("region", "us-*"),
        ("region", "us-east-?"),
        ("region", "[u]s-east-1"),
        ("region", "*"),
        ("owner", "acme*"),
        ("provider", "open?i"),
    ],
)
def test_declared_facts_written_as_globs_are_refused(key: str, value: str) -> None:
    """`region: us-*` (some US region) is the literal name `us-*`, which no jurisdiction
    covers: `residency.deny: [us]` under `allow: ["*"]` let a hosted backend so declared
    take the tenant's traffic. gateway.yaml refuses a fact written as a glob."""
    from pydantic import ValidationError

    from gateway.config.schema import BackendSettings
    from tests.helpers.gateways import backend

    spec = backend("gpu", "http://127.0.0.1:9", "m")
    spec[key] = value
    with pytest.raises(ValidationError, match=r"glob character"):
        BackendSettings.model_validate(spec)


@pytest.mark.parametrize("name", ["gpt-4\u043e", "llama\u200b", " m"])
def test_model_names_policies_match_are_plain_names(name: str) -> None:
    """`models.deny: [gpt-4o]` must match the configured model: a name with a look-alike
    letter (or an alias so written) would escape it."""
    from pydantic import ValidationError

    from gateway.config.schema import BackendSettings
    from tests.helpers.gateways import backend

    for spec in (
        backend("gpu", "http://127.0.0.1:9", name),
        backend("gpu", "http://127.0.0.1:9", "m"),
    ):
        if name not in spec["models"][0]["name"]:
            spec["models"][0]["aliases"] = [name]
        with pytest.raises(ValidationError, match=_NOT_PLAIN):
            BackendSettings.model_validate(spec)


def test_gateway_yaml_facts_group_a_models_name_with_its_aliases() -> None:
    from gateway.config.facts import facts_of
    from gateway.config.schema import BackendSettings
    from tests.helpers.gateways import backend

    spec = backend("gpu", "http://127.0.0.1:9", "m")
    spec["models"] = [{"name": "llama-3.1-8b", "aliases": ["llama3"]}, {"name": "other"}]
    declared = facts_of(BackendSettings.model_validate(spec))
    assert declared.names_of("llama3") == {"llama-3.1-8b", "llama3"}
    assert declared.names_of("other") == {"other"}


def test_a_policy_file_that_is_a_dangling_link_is_an_error_not_skipped(tmp_path: Path) -> None:
    """A `*.yaml` in a policy directory that cannot be read (its link target gone, a FIFO)
    must stop the load: skipped, it could take a deny or the PolicySet with it."""
    from gateway.policy.source import discover

    (tmp_path / "p.yaml").write_text("x: 1\n")
    (tmp_path / "deny.yaml").symlink_to(tmp_path / "gone.yaml")
    os.mkfifo(tmp_path / "fifo.yml")
    files, issues = discover([tmp_path])
    assert files == [tmp_path / "p.yaml"]
    assert sorted((i.file, i.message) for i in issues) == [
        (str(tmp_path / "deny.yaml"), "not a regular file (a dangling link?)"),
        (str(tmp_path / "fifo.yml"), "not a regular file (a dangling link?)"),
    ]
    (tmp_path / "p.yaml").unlink()
    only_bad, issues = discover([tmp_path])
    assert only_bad == [] and len(issues) == 2  # not "no *.yaml files": it names each


def test_a_linked_directory_in_a_policy_directory_is_an_error_not_left_out(
    tmp_path: Path,
) -> None:
    """A link to a directory is not walked; its policies (a deny, the PolicySet) must not
    silently go missing from the set: the load names it."""
    from gateway.policy.source import discover

    policies, shared = tmp_path / "policies", tmp_path / "shared"
    policies.mkdir()
    shared.mkdir()
    (shared / "deny.yaml").write_text("x: 1\n")
    (policies / "p.yaml").write_text("x: 1\n")
    (policies / "team").symlink_to(shared, target_is_directory=True)
    (policies / "..data").symlink_to(shared, target_is_directory=True)  # hidden: a ConfigMap's
    files, issues = discover([policies])
    assert files == [policies / "p.yaml"]
    assert [(i.file, i.message) for i in issues] == [
        (str(policies / "team"), "a link to a directory: not read")
    ]
