"""Body fields and model prefixes that LiteLLM or a backend reads as routing never move a
hosted call: a property test over the whole request path (a real gateway on loopback,
the private backend down so every request the policy lets fall back does, LiteLLM for
real against an OpenAI-shaped simulator).

A second simulator stands for the place a client would like the call to go
(`api_base`, `base_url`, `model_list`, `extra_body`, ...): it must receive nothing, the
provider must receive only the configured model with the configured key, and a
`fallback: never` tenant's requests (and `phi` ones) must reach no hosted provider at all.
Most such fields are now refused outright (400, for every backend); `metadata`, an OpenAI
field, still passes to private backends and is left out of hosted calls.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.api.control_fields import CONTROL_FIELDS, CONTROL_PREFIXES
from gateway.tenants import hash_api_key
from tests.helpers.gateways import (
    EU_ZERO,
    LITELLM_WARNINGS,
    TENANT_KEY,
    Gateway,
    Sim,
    backend,
    hosted_backend,
)
from tests.helpers.net import free_port

pytestmark = LITELLM_WARNINGS

NEVER_KEY = "og-test-never-key-0123456789"
CLINIC_KEY = "og-test-clinic-key-012345678"
POLICIES = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: open}
spec:
  tenants: [acme]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback: {mode: when_private_unavailable, to: [{backend: hosted-eu}]}
  data_classes:
    phi: {fallback: {mode: never}}
---
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: closed}
spec:
  tenants: [never]
  residency: {allow: ["*"]}
  retention: {max_days: any}
  fallback: {mode: never}
---
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: clinic}
spec:
  tenants: [clinic]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback: {mode: when_private_unavailable, to: [{backend: hosted-eu}]}
  data_classes:
    phi: {fallback: {mode: never}}
    deidentified: {}
  default_data_class: phi
"""
# Fields LiteLLM's keyword arguments, its proxy, or an OpenAI-compatible server read as
# where to send a call, with what key, or what to answer without calling anyone.
ROUTING_FIELDS = [
    "api_base",
    "base_url",
    "api_key",
    "custom_llm_provider",
    "model_list",
    "fallbacks",
    "context_window_fallbacks",
    "mock_response",
    "extra_headers",
    "extra_body",
    "headers",
    "azure_ad_token",
    "api_version",
    "litellm_params",
    "deployment_id",
    "organization",
    "metadata",
    "user_config",
    "aws_region_name",
    "vertex_project",
]


@pytest.fixture
def rig(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> tuple[Gateway, Sim, Sim]:
    """(gateway, hosted provider, decoy): `m` on a private backend that is down and on
    hosted `hosted-eu` (the provider simulator, as `openai/m`); the decoy listens too."""
    provider = start_sim("vllm", models=("m",), zero_latency=True)
    decoy = start_sim("vllm", models=("m", "gpt-4o"), zero_latency=True)
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "p.yaml").write_text(POLICIES)
    down = f"http://127.0.0.1:{free_port()}"
    gateway = start_gateway(
        [
            backend("gpu-eu", down, {"name": "m", "aliases": ["openai/gpt-4o"]}, **EU_ZERO),
            hosted_backend("hosted-eu", f"{provider.url}/v1", "m"),
        ],
        environ={"HOSTED_KEY": "provider-key"},
        policy={"paths": [str(policies)]},
        tenants=[
            {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["*"]},
            {"id": "never", "api_key_hashes": [hash_api_key(NEVER_KEY)], "models": ["*"]},
            {"id": "clinic", "api_key_hashes": [hash_api_key(CLINIC_KEY)], "models": ["*"]},
        ],
    )
    return gateway, provider, decoy


def hostile_fields(decoy_url: str) -> st.SearchStrategy[dict[str, Any]]:
    target = st.sampled_from([decoy_url, f"{decoy_url}/v1", "hosted_vllm/m", "openai/m"])
    value = st.one_of(
        target,
        st.builds(lambda t: {"api_base": t, "base_url": t, "model": "openai/m"}, target),
        st.builds(
            lambda t: [{"model_name": "m", "litellm_params": {"model": "m", "api_base": t}}],
            target,
        ),
        st.builds(lambda t: [{"model": t, "api_base": t}], target),
        st.just("from the client, not the provider"),
        st.just({"authorization": "Bearer client-key", "x-forwarded-host": "decoy"}),
        # A label sent in the body is no label: it neither loosens nor tightens.
        st.just({"x-data-class": "deidentified", "data_class": "deidentified"}),
        st.just("deidentified"),
    )
    fields = st.dictionaries(st.sampled_from(ROUTING_FIELDS), value, min_size=1, max_size=4)
    # `store: true` asks the provider to keep the request: a retention the policy checked;
    # `user` (an OpenAI field, sent) is no data-class label either.
    return st.builds(
        lambda f, extra: {**f, **extra},
        fields,
        st.sampled_from([{}, {"store": True}, {"user": "deidentified"}]),
    )


MODELS = [
    "m",
    "M",
    " m",
    "m ",
    "openai/m",
    "hosted_vllm/m",
    "azure/m",
    "m:latest",
    "%6D",
    "\uff4d",
    "openai/gpt-4o",
    "gpt-4o",
]


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_body_field_or_model_prefix_moves_a_hosted_call(
    rig: tuple[Gateway, Sim, Sim], data: st.DataObject
) -> None:
    gateway, provider, decoy = rig
    fields = data.draw(hostile_fields(decoy.url), label="fields")
    # Half of the requests may fall back (the fields must not move them), half must not.
    model = data.draw(st.one_of(st.just("m"), st.sampled_from(MODELS)), label="model")
    key, label = data.draw(
        st.one_of(
            st.just((TENANT_KEY, None)),
            st.sampled_from(
                [
                    (TENANT_KEY, "phi"),
                    (TENANT_KEY, "PHI, phi"),
                    (NEVER_KEY, None),
                    (CLINIC_KEY, None),  # no header: phi by default, whatever the body says
                    (CLINIC_KEY, "deidentified, phi"),
                ]
            ),
        ),
        label="tenant",
    )
    body = {
        **fields,
        "model": model,
        "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"}],
    }
    headers = {"authorization": f"Bearer {key}"}
    if label is not None:
        headers["x-data-class"] = label
    before = len(provider.app.captured("/v1/chat/completions"))
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=30
    )
    sent = provider.app.captured("/v1/chat/completions")[before:]
    assert decoy.app.captured() == [], "a client field moved the call"
    may_go_hosted = key == TENANT_KEY and label is None and model in ("m",)
    # A router's control field is refused for every backend (gateway/api/control_fields.py)
    # and `store: true` on the hosted attempt (gateway/upstream/hosted_fields.py): 400.
    control = any(f in CONTROL_FIELDS or f.startswith(CONTROL_PREFIXES) for f in fields)
    # ... and a `metadata` that is not an object or null (a LiteLLM proxy decodes a string)
    control = control or not isinstance(fields.get("metadata"), dict | None)
    if control or (may_go_hosted and fields.get("store") is True):
        assert sent == [], (fields, response.text)
        assert response.status_code == 400, response.text
        return
    if not may_go_hosted:
        # A refusal, an unknown model, or the private backend (down, so 503) that serves
        # `openai/gpt-4o`: never the provider.
        assert sent == [], (model, key, label, response.text)
        assert response.status_code in (400, 403, 404, 503), response.text
        return
    assert response.status_code == 200, response.text
    assert "from the client" not in response.text  # no mock_response answered it
    (request,) = sent
    assert request.header("authorization") == b"Bearer provider-key"
    forwarded = orjson.loads(request.body)
    assert forwarded["model"] == "m"
    assert not {*ROUTING_FIELDS, "store"} & forwarded.keys(), forwarded.keys()
