"""A policy's provider globs match every name of a hosted backend's provider: the names
and LiteLLM prefixes gateway/config/provider_routes.py lists for it. `provider: gemini`
is Google, so `providers.deny: [google]` excludes it (it once matched only the string
declared, and the deny failed open)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import yaml

from gateway.config.facts import facts_of
from gateway.config.schema import BackendSettings
from gateway.policy import BackendFacts, PolicySet, check_sources, parse_policies
from tests.helpers.gateways import backend, hosted_backend

URL = "http://127.0.0.1:9/v1"
ROUTE = {
    "gemini": "gemini/gemini-2.0-flash",
    "vertex_ai": "vertex_ai/gemini-2.0-flash",
    "google": "gemini/gemini-2.0-flash",
    "bedrock": "bedrock/anthropic.claude-3-haiku",
    "aws": "bedrock/anthropic.claude-3-haiku",
    "openai": "openai/m",
    "acme": "openai/m",
}


def hosted(id: str, provider: str) -> BackendFacts:
    settings = {
        **hosted_backend(id, URL, provider=provider),
        "models": [{"name": "m", "provider_model": ROUTE[provider]}],
    }
    return facts_of(BackendSettings.model_validate(settings))


def policy_text(**sections: Any) -> str:
    spec = {
        "tenants": ["t"],
        "residency": {"allow": ["*"]},
        "retention": {"max_days": "any", "training": True},
        "fallback": {"mode": "when_private_unavailable", "to": [{"provider": "*"}]},
        **sections,
    }
    document = {
        "apiVersion": "policy.owngate.dev/v1",
        "kind": "Policy",
        "metadata": {"id": "p"},
        "spec": spec,
    }
    return yaml.safe_dump(document)


def policy_set(declared: tuple[BackendFacts, ...], **sections: Any) -> PolicySet:
    return parse_policies([("p.yaml", policy_text(**sections))], declared)


@pytest.mark.parametrize(
    ("providers", "declared", "admitted"),
    [
        ({"deny": ["google"]}, "gemini", False),
        ({"deny": ["google"]}, "vertex_ai", False),
        ({"deny": ["GOOGLE"]}, "gemini", False),  # in any case, as before
        ({"deny": ["goo*"]}, "gemini", False),  # a glob matches any of the names
        ({"deny": ["gemini"]}, "google", False),
        ({"deny": ["vertex_ai"]}, "gemini", False),
        ({"deny": ["aws"]}, "bedrock", False),
        ({"deny": ["amazon"]}, "bedrock", False),
        ({"deny": ["google"]}, "bedrock", True),
        ({"allow": ["aws"]}, "bedrock", True),
        ({"allow": ["bedrock"]}, "aws", True),
        ({"allow": ["google"]}, "gemini", True),
        ({"allow": ["google"]}, "bedrock", False),
        ({"allow": ["acme"]}, "acme", True),  # a provider no entry knows: as declared
        ({"deny": ["acme"]}, "acme", False),
    ],
)
def test_the_providers_rule_judges_every_name_of_the_provider(
    providers: dict[str, Any], declared: str, admitted: bool
) -> None:
    decision = policy_set((hosted("cloud", declared),), providers=providers).decide("t", "m", None)
    assert (decision.hosted == ("cloud",)) is admitted, decision.trace
    if not admitted:
        (entry,) = decision.trace
        assert (entry.verdict, entry.rule) == ("excluded", "p/providers")


def test_a_data_class_deny_holds_for_every_name_of_the_provider() -> None:
    classes = {"phi": {"providers": {"deny": ["google"]}}}
    declared = (hosted("gem", "gemini"), hosted("gpt", "openai"))
    decision = policy_set(declared, data_classes=classes).decide("t", "m", "phi")
    assert decision.hosted == ("gpt",)
    assert [(t.backend, t.rule) for t in decision.trace if t.verdict == "excluded"] == [
        ("gem", "p/data_classes.phi/providers")
    ]


def test_the_trace_names_the_provider_name_that_matched() -> None:
    denied = policy_set((hosted("cloud", "gemini"),), providers={"deny": ["google"]})
    (entry,) = denied.decide("t", "m", None).trace
    assert entry.reason == "provider 'gemini' (google) matches providers.deny entry 'google'"
    direct = policy_set((hosted("cloud", "gemini"),), providers={"deny": ["gemini"]})
    (entry,) = direct.decide("t", "m", None).trace
    assert entry.reason == "provider 'gemini' matches providers.deny entry 'gemini'"
    outside = policy_set((hosted("cloud", "gemini"),), providers={"allow": ["anthropic"]})
    (entry,) = outside.decide("t", "m", None).trace
    assert entry.reason == (
        "provider 'gemini' (also google, vertex_ai, vertex_ai_beta) is not in "
        "providers.allow [anthropic]"
    )


def test_fallback_to_a_provider_picks_a_backend_declared_by_another_of_its_names() -> None:
    declared = (hosted("gpt", "openai"), hosted("gem", "gemini"), hosted("vtx", "vertex_ai"))
    fallback = {"mode": "when_private_unavailable", "to": [{"provider": "google"}]}
    decision = policy_set(declared, fallback=fallback).decide("t", "m", None)
    assert decision.hosted == ("gem", "vtx")
    ordered = {
        "mode": "when_private_unavailable",
        "to": [{"provider": "google"}, {"provider": "*"}],
    }
    decision = policy_set(declared, fallback=ordered).decide("t", "m", None)
    assert decision.hosted == ("gem", "vtx", "gpt")


def test_a_private_backend_is_judged_by_its_owner_as_written() -> None:
    """`owner: google` on a private box is the operator's own word, not Google's API."""
    private = facts_of(BackendSettings.model_validate(backend("gpu", URL, "m", owner="google")))
    assert private.providers() == ("google",)
    decision = policy_set((private,), providers={"deny": ["gemini"]}).decide("t", "m", None)
    assert decision.private == ("gpu",)


def test_provider_names_lists_the_entry_declared_first() -> None:
    from gateway.config.provider_table import provider_names

    assert provider_names("gemini") == ("gemini", "google", "vertex_ai", "vertex_ai_beta")
    assert provider_names("Google")[:2] == ("Google", "gemini")
    assert set(provider_names("bedrock")) >= {"bedrock", "aws", "amazon", "sagemaker"}
    assert set(provider_names("qwencloud")) == {"qwencloud", "dashscope", "qwen_ai_platform"}
    assert provider_names("together") == ("together", "together_ai")
    assert provider_names("acme") == ("acme",)


@pytest.mark.parametrize(("entry", "warned"), [("google", False), ("gogle", True)])
def test_check_warns_only_at_a_provider_no_backend_goes_by(entry: str, warned: bool) -> None:
    declared = (hosted("cloud", "gemini"),)
    text = policy_text(providers={"deny": [entry]})
    checked, errors, warnings = check_sources([("p.yaml", text)], declared, ["t"])
    assert checked is not None, errors
    found = [w for w in warnings if "matches no configured provider" in w.message]
    assert bool(found) is warned, [w.message for w in warnings]


def test_the_facts_digest_pins_the_names_a_provider_goes_by() -> None:
    """What the provider table made of a declared provider decides; a reload under an
    owngate whose table differs is a redeclared backend."""
    gemini = hosted("cloud", "gemini")
    bare = replace(gemini, provider_names=())
    assert policy_set((gemini,)).facts_digest != policy_set((bare,)).facts_digest
    assert hosted("cloud", "acme").provider_names == ("acme",)
