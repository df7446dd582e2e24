"""A request for a model no backend serves holds nothing of its name past its answer.

`decide_listed` (gateway/api/listing.py) decided such a request under the client's own
string, and the decision it refused with (whose refusal message repeats the name,
repr'd) is what the recorder keeps per request in `RecordRefs`, 4096 of them: a
tenant's 4096 requests each naming an 8 MiB model (`max_body_bytes`' default) held some
64 GiB for as long as no other refusal displaced them. Before the unknown-model 404
moved into the decision step, such a name was refused before any decision was made.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
import yaml

from gateway.api.listing import decide_listed
from gateway.api.record_refs import RecordRefs
from gateway.api.refusal import Refused
from gateway.config.facts import backend_facts
from gateway.config.schema import GatewaySettings
from gateway.errors import ErrorCode
from gateway.policy import PolicySet, parse_policies
from gateway.tenants import TenantEntry

BACKEND = {
    "id": "gpu",
    "kind": "vllm",
    "base_url": "http://127.0.0.1:9",
    "models": [{"name": "m"}],
    "region": "eu-west-1",
    "owner": "acme",
}
NAME = "q" * 1_000_000  # a model no backend serves, as long as a big body allows


def _policies(tenants: list[str]) -> PolicySet:
    config = GatewaySettings.model_validate({"backends": [BACKEND]})
    spec = {
        "tenants": tenants,
        "residency": {"allow": ["*"]},
        "retention": {"max_days": "any", "training": True},
        "fallback": {"mode": "never"},
    }
    meta = {"apiVersion": "policy.owngate.dev/v1", "kind": "Policy", "metadata": {"id": "p"}}
    text = yaml.safe_dump({**meta, "spec": spec})
    return parse_policies([("p.yaml", text)], backend_facts(config))


@pytest.mark.parametrize("tenants", [["acme"], ["other"]], ids=["policy", "no-policy"])
def test_the_refusal_of_an_unknown_model_keeps_nothing_of_its_name(tenants: list[str]) -> None:
    policy = _policies(tenants)
    registry: Any = SimpleNamespace(routes={"m": ()})
    metrics: Any = SimpleNamespace(decided=lambda rules: None)
    exchange: Any = SimpleNamespace()
    tenant = TenantEntry("acme", all_models=True, models=frozenset())
    with pytest.raises(Refused) as raised:
        decide_listed(policy, registry, metrics, exchange, tenant, NAME, cast(Any, {}))
    refused = raised.value
    assert refused.code is ErrorCode.model_not_found
    decision = refused.decision
    kept = RecordRefs().decided(decision)  # what the recorder holds, request after request
    held = repr((decision, kept, refused.rule))
    assert "q" * 64 not in held, f"{len(held)} characters held"
    if tenants == ["acme"]:
        assert refused.rule == "p/unknown-model" or refused.rule.endswith("/unknown-model")
