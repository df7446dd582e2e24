"""A policy's `models` rule judges the provider model a hosted backend sends, not only the
public name the operator gave it in gateway.yaml (`fast` served as `openai/gpt-4o`)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gateway.config.facts import facts_of
from gateway.config.schema import BackendSettings
from gateway.policy import BackendFacts, PolicySet, check_sources, parse_policies
from tests.helpers.gateways import backend, hosted_backend

URL = "http://127.0.0.1:9/v1"


def hosted(
    id: str = "cloud",
    name: str = "fast",
    provider_model: str = "openai/gpt-4o",
    aliases: tuple[str, ...] = (),
) -> BackendFacts:
    entry = {"name": name, "provider_model": provider_model, "aliases": list(aliases)}
    settings = {**hosted_backend(id, URL), "models": [entry]}
    return facts_of(BackendSettings.model_validate(settings))


def policy_text(models: dict[str, Any]) -> str:
    spec = {
        "tenants": ["t"],
        "residency": {"allow": ["*"]},
        "retention": {"max_days": "any", "training": True},
        "fallback": {"mode": "when_private_unavailable", "to": [{"provider": "*"}]},
        "models": models,
    }
    document = {
        "apiVersion": "policy.owngate.dev/v1",
        "kind": "Policy",
        "metadata": {"id": "p"},
        "spec": spec,
    }
    return yaml.safe_dump(document)


def policy_set(declared: tuple[BackendFacts, ...], models: dict[str, Any]) -> PolicySet:
    return parse_policies([("p.yaml", policy_text(models))], declared)


@pytest.mark.parametrize(
    ("models", "asked", "admitted"),
    [
        ({"deny": ["gpt-4o*"]}, "fast", False),  # the provider model, its route prefix off
        ({"deny": ["openai/gpt-4o"]}, "fast", False),  # as written
        ({"deny": ["openai/*"]}, "fast", False),
        ({"deny": ["gpt-4o*"]}, "quick", False),  # an alias of `fast` does not escape it
        ({"deny": ["gpt-4o-mini"]}, "fast", True),
        ({"deny": ["fast"]}, "fast", False),  # the public name is still judged
        ({"allow": ["fast"]}, "fast", True),
        ({"allow": ["gpt-4o"]}, "fast", True),  # an allow may name the provider model
        ({"allow": ["claude-*"]}, "fast", False),
    ],
)
def test_the_models_rule_judges_the_provider_model_of_a_hosted_backend(
    models: dict[str, Any], asked: str, admitted: bool
) -> None:
    decision = policy_set((hosted(aliases=("quick",)),), models).decide("t", asked, None)
    assert (decision.hosted == ("cloud",)) is admitted, decision.trace
    if not admitted:
        (entry,) = decision.trace
        assert (entry.verdict, entry.rule) == ("excluded", "p/models")


def test_the_trace_names_the_provider_model_that_matched() -> None:
    decision = policy_set((hosted(),), {"deny": ["gpt-4o*"]}).decide("t", "fast", None)
    (entry,) = decision.trace
    assert entry.reason == (
        "model 'fast' (provider model 'openai/gpt-4o') matches models.deny entry 'gpt-4o*'"
    )


def test_a_deny_on_the_provider_model_holds_on_every_backend_serving_the_public_name() -> None:
    """`fast` is one model wherever it is served (the router balances between them): a
    private backend serving `fast` too is excluded with the hosted one."""
    private = facts_of(BackendSettings.model_validate(backend("gpu", URL, "fast")))
    declared = (private, hosted())
    decision = policy_set(declared, {"deny": ["gpt-4o"]}).decide("t", "fast", None)
    assert decision.eligible == ()
    assert {t.backend: t.rule for t in decision.trace} == {"gpu": "p/models", "cloud": "p/models"}


def test_the_facts_digest_covers_the_provider_model() -> None:
    """A reload that changes only a provider model is a redeclared backend (an attempt
    decided under the old one is not made under the new one)."""
    before = policy_set((hosted(provider_model="openai/gpt-4o-mini"),), {"deny": ["x"]})
    after = policy_set((hosted(provider_model="openai/gpt-4o"),), {"deny": ["x"]})
    assert before.facts_digest != after.facts_digest
    assert hosted().provider_models == (("fast", "openai/gpt-4o"),)
    private = facts_of(BackendSettings.model_validate(backend("gpu", URL, "m")))
    assert private.provider_models == ()


@pytest.mark.parametrize(
    ("allow", "warned"),
    [
        (["llama*"], True),  # admits `llama-x` by its public name alone
        (["llama*", "gpt-4o"], False),  # the provider model is named too
        (["llama*", "openai/*"], False),
        (["quick"], True),  # an alias is a public name too
        (["gpt-4o"], False),  # only the provider model: nothing to warn
        (["claude-*"], False),  # admits nothing of it (another warning says so)
    ],
)
def test_check_warns_at_an_allow_that_admits_a_hosted_model_by_its_public_name(
    allow: list[str], warned: bool
) -> None:
    """`allow: ["llama*"]` admits a hosted backend the operator named `llama-x` that sends
    `openai/gpt-4o`: the policy author meant a Llama, gateway.yaml decided otherwise."""
    declared = (hosted(name="llama-x", aliases=("quick",)),)
    text = policy_text({"allow": allow})
    policy_set, errors, warnings = check_sources([("p.yaml", text)], declared, ["t"])
    assert policy_set is not None, errors
    found = [w for w in warnings if "by the public name gateway.yaml gives it" in w.message]
    assert bool(found) is warned, [w.message for w in warnings]
    if warned:
        (warning,) = found
        assert warning.path == "spec.models.allow[0]"
        assert "cloud (" in warning.message and "'openai/gpt-4o'" in warning.message


@pytest.mark.parametrize(
    "provider_model",
    [
        "bedrock/anthropic%2Eclaude-3-opus-20240229-v1:0",
        "bedrock/converse/anthropic%2eclaude-3-opus",
    ],
)
def test_a_deny_holds_for_a_percent_encoded_provider_model(provider_model: str) -> None:
    """Bedrock takes the model id in the URL path and decodes it: `anthropic%2Eclaude-3-opus`
    is `anthropic.claude-3-opus` there, and escaped a deny written for that name."""
    aws = "https://bedrock-runtime.eu-central-1.amazonaws.com"
    settings = {
        **hosted_backend("cloud", aws, provider="aws", owner="aws", region="eu-central-1"),
        "models": [{"name": "fast", "provider_model": provider_model}],
    }
    declared = (facts_of(BackendSettings.model_validate(settings)),)
    deny = {"deny": ["anthropic.claude-3-opus*"]}
    decision = policy_set(declared, deny).decide("t", "fast", None)
    assert decision.hosted == (), decision.trace
    (entry,) = decision.trace
    assert (entry.verdict, entry.rule) == ("excluded", "p/models")


@pytest.mark.parametrize(
    ("provider_model", "denied"),
    [
        # LiteLLM sends `gpt-4o/` (`/gpt-4o`) to the provider, which may take it for gpt-4o
        ("openai/gpt-4o/", "gpt-4o"),
        ("openai//gpt-4o", "gpt-4o"),
        ("openai/gpt-4o//", "openai/gpt-4o"),
        ("openai/openai//gpt-4o/", "openai/gpt-4o"),
        ("openai/gpt-4o%2F", "gpt-4o"),
    ],
)
def test_a_deny_holds_for_a_provider_model_with_empty_parts(
    provider_model: str, denied: str
) -> None:
    declared = (hosted(provider_model=provider_model),)
    decision = policy_set(declared, {"deny": [denied]}).decide("t", "fast", None)
    assert decision.hosted == (), decision.trace
    (entry,) = decision.trace
    assert (entry.verdict, entry.rule) == ("excluded", "p/models")


@pytest.mark.parametrize(
    "provider_model",
    [
        "openai/gpt-4o ",  # a `models.deny: [gpt-4o]` matched `gpt-4o ` not
        " openai/gpt-4o",
        "openai/gpt-4\u043e",  # a Cyrillic o
        "openai/gpt\u200b-4o",  # a zero-width space
        "openai/gpt-4o%20",  # as percent-decoded (a provider taking it in a URL path)
        "openai/gpt-4o%E2%80%8B",
    ],
)
def test_a_provider_model_that_only_looks_plain_does_not_load(provider_model: str) -> None:
    """Policies match the provider model by its letters, as they match names and aliases:
    one that only looks like `openai/gpt-4o` escaped `deny: [gpt-4o]` unseen."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as info:
        hosted(provider_model=provider_model)
    assert "policies match this name as written" in str(info.value)
