"""Differential property test: where the gateway may send a request, against the docs.

Hypothesis writes a gateway.yaml (private and hosted backends, names and aliases,
declared facts), a policy, a tenant and a hostile request (the model string as sent,
with case changes, spaces, look-alike letters, provider prefixes, `:` suffixes, URL
encoding, huge names; data-class header copies in any case, comma-joined, empty). The
request goes through the gateway's own parts in the order the request path runs them
(gateway/api/proxy.py: tenant models, the registry's routes, `read_label`, the
compiled `PolicySet`, the `Router`'s plan with every private attempt failing, so the
plan reaches as far as it ever would), and the backends it may reach are compared with
`tests/helpers/route_oracle.py`, which restates the documentation and nothing else.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.api.labels import read_label
from gateway.config import load_config
from gateway.config.facts import backend_facts
from gateway.config.schema import GatewaySettings, RoutingSettings
from gateway.policy import PolicySet, UnknownDataClass, load_policies, parse_policies
from gateway.policy.labels import InvalidLabel
from gateway.routing.registry import Registry
from gateway.routing.router import HOSTED_MAX_ATTEMPTS, Outcome, Router
from gateway.routing.signals import BackendLoad
from gateway.state import MemoryState
from gateway.tenants import hash_api_key, index_keys
from tests.helpers.paths import REPO_ROOT
from tests.helpers.route_oracle import Verdict, allowed

NAMES = ["m1", "M1", "gpt-4o", "openai/gpt-4o", "m1:latest"]
PROVIDERS = ["openai", "azure", "Mistral", "own"]
REGIONS = ["eu-west-1", "westeurope", "us-east-1", "eu-west-2", "fr", "dc-1"]
RESIDENCY = ["eu", "us", "uk", "fr", "ie", "eu-*", "*", "dc-1", "WestEurope"]
MODES = ["never", "when_private_unavailable", "when_private_saturated"]
HEADERS = ["x-data-class", "x-label"]
LABELS = ["phi", " PHI", "pii", "Pii ", "", " ", "phi,pii", "phi, phi", "other", "phi\t"]
# Distinct strings a client may send for a configured name `n` (a look-alike letter, a
# fullwidth one, a provider prefix LiteLLM routes by, an encoding, a NUL, ...).
MUTATIONS: list[Callable[[str], str]] = [
    str.upper,
    str.title,
    lambda n: f" {n}",
    lambda n: f"{n}\n",
    lambda n: n.replace("o", "\u043e").replace("m", "\uff4d"),
    lambda n: f"openai/{n}",
    lambda n: f"hosted_vllm/{n}",
    lambda n: f"azure/{n}",
    lambda n: n.rsplit("/", 1)[-1],
    lambda n: f"{n}:latest",
    lambda n: n.split(":", 1)[0],
    lambda n: n.replace("-", "%2D").replace("/", "%2F"),
    lambda n: f"{n}\x00",
    lambda n: n * 400,
]


def _unique_subset(items: list[str], max_size: int = 3) -> st.SearchStrategy[list[str]]:
    return st.lists(st.sampled_from(items), max_size=max_size, unique=True)


@st.composite
def backends(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(1, 5))):
        hosted = draw(st.booleans())
        names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True))
        split = draw(st.integers(1, len(names)))  # the first model gets the rest as aliases
        models = [{"name": names[0], "aliases": names[split:]}]
        models += [{"name": n, "aliases": []} for n in names[1:split]]
        retention = {
            "days": draw(st.sampled_from([0, 0, 7, 30, 90])),
            "zero_data_retention": draw(st.booleans()),
            "training": draw(st.booleans()),
        }
        spec: dict[str, Any] = {
            "id": f"{'h' if hosted else 'b'}{i}",
            "kind": "hosted" if hosted else "vllm",
            "base_url": f"http://127.0.0.1:9/{'v1' if hosted else ''}".rstrip("/"),
            "models": models,
            "region": draw(st.sampled_from(REGIONS)),
            "owner": draw(st.sampled_from(PROVIDERS)),
            "retention": retention,
        }
        if hosted:
            spec["api_key_env"] = "HOSTED_KEY"
            if draw(st.booleans()):
                spec["provider"] = draw(st.sampled_from(PROVIDERS))
            for model in models:
                model["provider_model"] = f"openai/{model['name']}"
            if spec.get("provider", spec["owner"]) == "azure":  # judged as Azure, on loopback
                spec["unsafe_unchecked_azure_host"] = True
        out.append(spec)
    return out


def _lists(values: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    patterns = [*values, *values, "*", "b*", "h?", "M*", "*gpt*"]
    return st.fixed_dictionaries(
        {}, optional={"allow": _unique_subset(patterns), "deny": _unique_subset(patterns, 2)}
    )


@st.composite
def fallback(draw: st.DrawFn, base: bool) -> dict[str, Any]:
    mode = draw(st.sampled_from(MODES))
    out: dict[str, Any] = {"mode": mode}
    if mode == "when_private_saturated":
        out["saturation_threshold"] = 1.0
    if mode != "never" and (base or draw(st.booleans())):
        entry = st.one_of(
            st.builds(lambda b: {"backend": b}, st.sampled_from(["h0", "h1", "h*", "*", "b0"])),
            st.builds(lambda p: {"provider": p}, st.sampled_from([*PROVIDERS, "*", "O*"])),
        )
        out["to"] = draw(st.lists(entry, max_size=3))
    return out


def sections(base: bool) -> st.SearchStrategy[dict[str, Any]]:
    required = {
        "residency": st.fixed_dictionaries(
            {"allow": st.one_of(st.just(["*"]), _unique_subset(RESIDENCY))},
            optional={"deny": _unique_subset(RESIDENCY, 2)},
        ),
        "retention": st.fixed_dictionaries(
            {"max_days": st.sampled_from(["any", "zero", "any", 0, 7, 30])},
            optional={"training": st.booleans()},
        ),
        "fallback": fallback(base),
    }
    optional = {
        "providers": _lists(PROVIDERS),
        "backends": _lists([f"{t}{i}" for t in "bh" for i in range(5)]),
        "models": _lists(NAMES),
        "require": st.sampled_from([[], ["attested_facts"]]),
    }
    if base:  # `models` always: the names a client may play with are the point here
        models = optional.pop("models")
        return st.fixed_dictionaries({**required, "models": models}, optional=optional)
    return st.fixed_dictionaries({}, optional={**optional, **required})


@st.composite
def policies(draw: st.DrawFn) -> dict[str, Any]:
    spec = draw(sections(base=True))
    spec["tenants"] = ["t"]
    classes = draw(_unique_subset(["phi", "pii"], 2))
    spec["data_classes"] = {c: draw(sections(base=False)) for c in classes}
    if draw(st.booleans()) and classes:
        spec["default_data_class"] = draw(st.sampled_from(classes))
    if draw(st.booleans()) and classes:
        spec["default_data_class_by_tenant"] = {"t": draw(st.sampled_from(classes))}
    return spec


def model_names() -> st.SearchStrategy[str]:
    plain = st.sampled_from(NAMES)
    mutated = st.builds(lambda n, f: f(n), plain, st.sampled_from(MUTATIONS))
    return st.one_of(plain, mutated)


def label_headers(header: str) -> st.SearchStrategy[list[tuple[str, str]]]:
    names = st.sampled_from([header, header.upper(), header.title(), "x-data-classes"])
    return st.lists(st.tuples(names, st.sampled_from(LABELS)), max_size=3)


def gateway_choice(
    config: GatewaySettings,
    registry: Registry,
    policy: PolicySet,
    tenant_id: str,
    model: str,
    headers: list[Any],
    saturated: bool,
) -> tuple[bool, Any, list[str]]:
    """(refused, the decision, the backends the plan tries in order) as the request path
    (gateway/api/proxy.py `forward`, `_decide`, `_dispatch`) takes these steps."""
    (settings,) = (t for t in config.tenants if t.id == tenant_id)
    key = {"api_key_hashes": (hash_api_key(f"og-{tenant_id}-key"),)}  # the tenant's entry
    (tenant,) = index_keys([settings.model_copy(update=key)]).values()
    if not tenant.may_use(model) or registry.routes.get(model) is None:
        return True, None, []
    # ASGI servers lower-case header names; values are bytes, read as latin-1.
    scope = {"headers": [(k.lower().encode(), v.encode()) for k, v in headers]}
    try:
        label = read_label(scope, policy.data_class_header.encode())
        decision = policy.decide(tenant.id, model, label)
    except (InvalidLabel, UnknownDataClass):
        return True, None, []
    if decision.refusal is not None:
        return True, decision, []
    load = BackendLoad(running=1, waiting=64, kv_usage=None, slots_total=1) if saturated else None
    router = Router(registry, config.routing, lambda _id: load, 1.0, MemoryState())
    plan = asyncio.run(router.plan(model, decision, {}, time.perf_counter()))
    tried = []
    for attempt in plan:
        tried.append(attempt.backend.id)
        plan.report(attempt, Outcome.failed, "scripted failure")
    return False, decision, tried


def assert_agrees(
    verdict: Verdict, saturated: bool, refused: bool, decision: Any, tried: list[str]
) -> None:
    assert refused == (verdict.refused is not None), (verdict, decision)
    if refused:
        assert tried == []
        return
    assert set(decision.private) == verdict.private, (verdict, decision.trace)
    assert set(decision.hosted) == verdict.hosted, (verdict, decision.trace)
    assert decision.fallback == verdict.mode
    assert set(tried) <= verdict.anywhere  # the promise: nowhere else, ever
    private = [b for b in tried if b in verdict.private]
    hosted = [b for b in tried if b not in verdict.private]
    assert sorted(private) == sorted(verdict.private)  # each private one, once
    assert len(set(hosted)) == len(hosted) == min(HOSTED_MAX_ATTEMPTS, len(verdict.hosted))
    if saturated and verdict.mode == "when_private_saturated" and private:
        assert tried == hosted + private  # hosted first, then the private tier
    else:
        assert tried == private + hosted  # hosted only once every private one failed


@settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    declared=backends(),
    spec=policies(),
    header=st.sampled_from(HEADERS),
    data=st.data(),
)
def test_no_request_reaches_a_backend_the_documentation_forbids(
    declared: list[dict[str, Any]],
    spec: dict[str, Any],
    header: str,
    data: st.DataObject,
) -> None:
    served = sorted({n for b in declared for m in b["models"] for n in (m["name"], *m["aliases"])})
    tenant_models = data.draw(st.one_of(st.just(["*"]), _unique_subset(served)), label="models")
    tenants: list[dict[str, Any]] = [
        {"id": "t", "models": tenant_models, "api_key_hashes": [hash_api_key("og-t-key")]},
        {"id": "nobody", "models": ["*"], "api_key_hashes": [hash_api_key("og-nobody-key")]},
    ]
    config = GatewaySettings.model_validate(
        {
            "backends": declared,
            "tenants": tenants,
            # Every private backend tried; no queue: saturation falls back or goes on.
            "routing": {"failover": {"max_attempts": 10}, "default": {"queue": {"size": 0}}},
        }
    )
    documents = [
        {
            "apiVersion": "policy.owngate.dev/v1",
            "kind": "Policy",
            "metadata": {"id": "p"},
            "spec": spec,
        },
        {
            "apiVersion": "policy.owngate.dev/v1",
            "kind": "PolicySet",
            "metadata": {"id": "s"},
            "spec": {"data_class_header": header.title()},
        },
    ]
    policy = parse_policies([("p.yaml", yaml.safe_dump_all(documents))], backend_facts(config))
    registry = Registry.build(config, environ={"HOSTED_KEY": "k"}, clock=lambda: 0.0)
    for _ in range(4):
        model = data.draw(model_names(), label="model")
        headers = data.draw(label_headers(header), label="headers")
        tenant = data.draw(st.sampled_from(tenants), label="tenant")
        verdict = allowed(declared, tenant, spec, model, headers, header)
        saturated = data.draw(st.booleans(), label="saturated")
        choice = gateway_choice(config, registry, policy, tenant["id"], model, headers, saturated)
        assert_agrees(verdict, saturated, *choice)


EXAMPLE = REPO_ROOT / "deploy" / "gateway.example.yaml"
EXAMPLE_LABELS: list[list[tuple[str, str]]] = [
    [],
    [("x-data-class", "phi")],
    [("X-Data-Class", "deidentified")],
    [("x-data-class", "confidential")],
    [("x-data-class", "PHI, phi")],
    [("x-data-class", "deidentified"), ("x-data-class", "phi")],
    [("x-data-class", "")],
    [("x-label", "deidentified")],
]


@pytest.mark.parametrize("saturated", [False, True])
def test_the_shipped_example_routes_as_its_documentation_says(saturated: bool) -> None:
    """deploy/gateway.example.yaml and policies/, every tenant, every served name and its
    hostile variants, every label: the gateway and the oracle agree."""
    raw = yaml.safe_load(EXAMPLE.read_text())
    # Every private backend tried; no queue: saturation falls back or goes on.
    routing = {"failover": {"max_attempts": 10}, "default": {"queue": {"size": 0}}}
    config = load_config(EXAMPLE, env={})
    config = config.model_copy(update={"routing": RoutingSettings.model_validate(routing)})
    policy = load_policies([REPO_ROOT / "policies"], backend_facts(config))
    specs = {}
    for path in sorted((REPO_ROOT / "policies").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc["kind"] == "Policy":
                specs.update(dict.fromkeys(doc["spec"]["tenants"], doc["spec"]))
    registry = Registry.build(config, environ=_example_keys(raw), clock=lambda: 0.0)
    names = sorted(registry.routes)
    requested = sorted({*names, *(f(n) for n in names for f in MUTATIONS[:-1])})
    for tenant in raw["tenants"]:
        for model in requested:
            for headers in EXAMPLE_LABELS:
                verdict = allowed(raw["backends"], tenant, specs.get(tenant["id"]), model, headers)
                choice = gateway_choice(
                    config, registry, policy, tenant["id"], model, headers, saturated
                )
                assert_agrees(verdict, saturated, *choice)


def _example_keys(raw: dict[str, Any]) -> dict[str, str]:
    return {b["api_key_env"]: "k" for b in raw["backends"] if "api_key_env" in b}
