"""A policy's `models` rule judges the provider model a hosted backend sends, not only the
public name the operator gave it in gateway.yaml (`fast` served as `openai/gpt-4o`)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gateway.config.facts import facts_of
from gateway.config.schema import BackendSettings
from gateway.policy import BackendFacts, PolicySet, parse_policies
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


def policy_set(declared: tuple[BackendFacts, ...], models: dict[str, Any]) -> PolicySet:
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
    return parse_policies([("p.yaml", yaml.safe_dump(document))], declared)


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
