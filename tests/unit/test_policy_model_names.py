"""A `models` deny entry holds for the model on every backend serving the name asked for,
whatever each backend calls it (found by tests/unit/test_route_differential.py).

gateway.yaml serves one public name on several backends under their own names
(docs/configuration.md: `llama-3.1-8b` is `meta-llama/Llama-3.1-8B-Instruct` on vLLM and
`llama-3.1-8b-q4_k_m` on llama.cpp). A deny written for one of those names used to be
checked against the names of each backend alone, so a client asking by the shared alias
reached every other backend serving the same model, hosted fallbacks included.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gateway.config.facts import backend_facts
from gateway.config.schema import GatewaySettings
from gateway.policy import PolicySet, parse_policies

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
BACKENDS: list[dict[str, Any]] = [
    {
        "id": "gpu-vllm",
        "kind": "vllm",
        "base_url": "http://127.0.0.1:9",
        "models": [{"name": LLAMA, "aliases": ["llama-3.1-8b"]}],
        "region": "eu-west-1",
        "owner": "acme",
    },
    {
        "id": "cpu-llamacpp",
        "kind": "llamacpp",
        "base_url": "http://127.0.0.1:9",
        "models": [{"name": "llama-3.1-8b-q4_k_m", "aliases": ["llama-3.1-8b"]}],
        "region": "eu-west-1",
        "owner": "acme",
    },
    {
        "id": "azure-eu",
        "kind": "hosted",
        "provider": "azure",
        "base_url": "http://127.0.0.1:9",
        "models": [
            {
                "name": "Meta-Llama-3.1-8B-Instruct",
                "aliases": ["llama-3.1-8b"],
                "provider_model": "azure/llama",
            }
        ],
        "region": "westeurope",
        "owner": "microsoft",
        "unsafe_unchecked_azure_host": True,  # loopback, not an Azure endpoint
    },
]


def policies(models: dict[str, Any]) -> PolicySet:
    config = GatewaySettings.model_validate({"backends": BACKENDS})
    spec = {
        "tenants": ["t"],
        "residency": {"allow": ["eu"]},
        "retention": {"max_days": "any"},
        "models": models,
        "fallback": {"mode": "when_private_unavailable", "to": [{"backend": "azure-eu"}]},
    }
    document = {"apiVersion": "policy.owngate.dev/v1", "kind": "Policy", "metadata": {"id": "p"}}
    text = yaml.safe_dump({**document, "spec": spec})
    return parse_policies([("p.yaml", text)], backend_facts(config))


@pytest.mark.parametrize("asked", ["llama-3.1-8b", LLAMA, "llama-3.1-8b-q4_k_m"])
@pytest.mark.parametrize("deny", [LLAMA, "meta-llama/*", "META-LLAMA/LLAMA-3.1-8B-INSTRUCT"])
def test_a_deny_for_a_models_name_holds_on_every_backend_serving_it(asked: str, deny: str) -> None:
    # `llama-3.1-8b-q4_k_m` too: cpu-llamacpp serves it as `llama-3.1-8b`, the same model.
    decision = policies({"deny": [deny]}).decide("t", asked, None)
    assert (decision.private, decision.hosted) == ((), ())
    assert decision.refusal is not None and decision.refusal.rule == "p/models"
    assert {t.rule for t in decision.trace} == {"p/models"}


def test_an_allow_for_a_models_name_admits_only_the_backends_serving_it_by_that_name() -> None:
    # Allow stays per backend: the narrower reading (a security team allowing the vLLM
    # model's name has not allowed the quantized llama.cpp build or Azure's deployment).
    decision = policies({"allow": [LLAMA]}).decide("t", "llama-3.1-8b", None)
    assert (decision.private, decision.hosted) == (("gpu-vllm",), ())


def test_a_deny_follows_a_model_through_every_backend_that_renames_it() -> None:
    # gpu-a calls `x` also `y`; gpu-b serves `y` (the same public name, so the same
    # model) also as `z`: a client asking for `z` asks for `x`.
    chain = [
        {**BACKENDS[0], "id": "gpu-a", "models": [{"name": "x", "aliases": ["y"]}]},
        {**BACKENDS[1], "id": "gpu-b", "models": [{"name": "y", "aliases": ["z"]}]},
    ]
    config = GatewaySettings.model_validate({"backends": chain})
    spec = {
        "tenants": ["t"],
        "residency": {"allow": ["eu"]},
        "retention": {"max_days": "any"},
        "models": {"deny": ["x"]},
        "fallback": {"mode": "never"},
    }
    document = {"apiVersion": "policy.owngate.dev/v1", "kind": "Policy", "metadata": {"id": "p"}}
    text = yaml.safe_dump({**document, "spec": spec})
    policy = parse_policies([("p.yaml", text)], backend_facts(config))
    for asked in ("x", "y", "z"):
        decision = policy.decide("t", asked, None)
        assert decision.private == (), asked
        assert decision.refusal is not None and decision.refusal.rule == "p/models"
