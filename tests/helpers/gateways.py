"""Gateways and simulators in this process, built from plain dicts: the test tenants'
keys, backend and config builders, and what tests read back (readiness, requests served).

The fixtures that start them on real sockets (`start_sim`, `start_gateway`...) are in
tests/conftest.py; these are the plain values and functions behind them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.api import GatewayApp
from gateway.config import GatewaySettings
from gateway.policy import Decision
from gateway.provenance import write_signing_key
from gateway.routing.registry import BackendState, Registry
from gateway.serving import ServerThread
from gateway.sim import SimApp
from gateway.tenants import hash_api_key

TENANT_KEY = "og-test-tenant-key-0123456789"
OTHER_KEY = "og-test-other-tenant-key-98765"
ADMIN_TOKEN = "og-admin-test-token-0123456789"
ADMIN_HEADERS = {"authorization": f"Bearer {ADMIN_TOKEN}"}
ADMIN = {
    "token_hashes": [hash_api_key(ADMIN_TOKEN)],
    "listen": None,
}  # test gateways: no admin API port
# A backend's facts that every EU, zero-retention policy of the tests admits.
EU_ZERO: dict[str, Any] = {
    "region": "eu-west-1",
    "retention": {"days": 0, "zero_data_retention": True},
}
# Only the hosted backend `hosted` serves: the private ones are never eligible.
HOSTED_ONLY_POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: hosted-only, version: "1"}
spec:
  tenants: [acme]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback:
    mode: when_private_unavailable
    to: [{backend: hosted}]
"""

# acme's EU, zero-retention policy that falls back to the hosted backend `hosted` only when
# no private backend is available (the fallback tests' rule).
EU_FALLBACK_POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: eu, version: "1"}
spec:
  tenants: [acme]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback:
    mode: when_private_unavailable
    to: [{backend: hosted}]
"""


@dataclasses.dataclass
class Sim:
    app: SimApp
    server: ServerThread

    @property
    def url(self) -> str:
        return self.server.url


@dataclasses.dataclass
class Gateway:
    app: GatewayApp
    server: ServerThread
    key: str = TENANT_KEY

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.key}"}


def admin_status(url: str) -> dict[str, Any]:
    """`GET /admin/status` of the gateway at `url`, with the tests' admin token."""
    report: dict[str, Any] = httpx.get(
        f"{url}/admin/status", headers=ADMIN_HEADERS, timeout=10
    ).json()
    return report


def readiness(url: str) -> dict[str, Any]:
    """The readiness detail (backends, policy, provenance, state...) of the gateway at `url`."""
    detail: dict[str, Any] = admin_status(url)["readiness"]
    return detail


def backend(
    id: str, url: str, *models: str | dict[str, Any], kind: str = "vllm", **extra: Any
) -> dict[str, Any]:
    entries = [{"name": m} if isinstance(m, str) else m for m in models]
    return {
        "id": id,
        "kind": kind,
        "base_url": url,
        "models": entries,
        "region": "eu-west-1",
        "owner": "test",
        **extra,
    }


# Two pydantic warnings that LiteLLM's own code triggers while streaming, and that
# LiteLLM silences with global filters when it is imported (litellm/__init__.py). pytest
# restores the filters for each test (`filterwarnings = ["error"]`), so a module whose
# tests send requests to a hosted backend restates them (`pytestmark`); as errors they
# would be raised inside LiteLLM and break the stream.
LITELLM_WARNINGS = [
    # Lazy schema builds for LiteLLM's TypedDicts (`ChatCompletionThinkingBlock`, ...; on
    # a request it refuses, `_DeviceCode` of the GitHub Copilot module it then imports).
    pytest.mark.filterwarnings(
        "ignore:Items? '[A-Za-z_]+'.* on TypedDict class '[A-Za-z_]+' (is|are) using the "
        "`ReadOnly` qualifier:UserWarning"
    ),
    # LiteLLM's stream handler reads `model_fields` / `model_computed_fields` on instances.
    pytest.mark.filterwarnings(
        "ignore:Accessing the '[a-z_]+' attribute on the instance is deprecated"
        ":pydantic.warnings.PydanticDeprecatedSince211"
    ),
]


def hosted_backend(id: str, url: str, *models: str, **facts: Any) -> dict[str, Any]:
    """An OpenAI-shaped hosted backend at `url` (a simulator's `/v1`), keyed by the
    `HOSTED_KEY` variable, serving `models` as `openai/<name>`; EU and zero retention
    unless `facts` say otherwise."""
    return {
        "id": id,
        "kind": "hosted",
        "provider": "openai",
        "base_url": url,
        "api_key_env": "HOSTED_KEY",
        "owner": "provider",
        "models": [{"name": m, "provider_model": f"openai/{m}"} for m in models],
        **{**EU_ZERO, **facts},
    }


def anthropic_backend(id: str, url: str, **facts: Any) -> dict[str, Any]:
    """A hosted backend on LiteLLM's Anthropic adapter at `url` (tests/helpers/
    anthropic_mock.py), keyed by the `MOCK_ANTHROPIC_KEY` variable, serving `m` as
    `anthropic/claude-mock-1`; EU and zero retention unless `facts` say otherwise."""
    return hosted_backend(
        id,
        url,
        provider="anthropic",
        api_key_env="MOCK_ANTHROPIC_KEY",
        owner="anthropic",
        models=[{"name": "m", "provider_model": "anthropic/claude-mock-1"}],
        **facts,
    )


def gateway_config(backends: list[dict[str, Any]], **extra: Any) -> GatewaySettings:
    data: dict[str, Any] = {
        "logging": {"format": "json", "level": "warning"},
        "backends": backends,
        "tenants": [
            {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["*"]},
            {"id": "limited", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": []},
        ],
        "admin": ADMIN,
    }
    data.update(extra)
    # Test gateways publish /metrics to tokenless scrapes (`listen.metrics: open`) unless a
    # test sets it: the default (`admin`) is tests/integration/test_metrics_access.py's.
    data["listen"] = {"metrics": "open", **(data.get("listen") or {})}
    return GatewaySettings.model_validate(data)


def logged_private_gateway(
    start_gateway: Callable[..., Gateway], tmp_path: Path, url: str, origin: str, **extra: Any
) -> Gateway:
    """A gateway in front of one private backend `gpu` at `url` serving `m`, with the
    provenance log on in `tmp_path / "log"` (key `tmp_path / "log.key"`)."""
    return logged_gateway(start_gateway, tmp_path, [backend("gpu", url, "m")], origin, **extra)


def logged_gateway(
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    backends: list[dict[str, Any]],
    origin: str,
    **extra: Any,
) -> Gateway:
    """A gateway in front of `backends`, with the provenance log on in `tmp_path / "log"`
    (key `tmp_path / "log.key"`, a checkpoint every 20 ms)."""
    write_signing_key(tmp_path / "log.key", origin)
    provenance = {
        "dir": str(tmp_path / "log"),
        "origin": origin,
        "signing_key_file": str(tmp_path / "log.key"),
        "checkpoint_interval_ms": 20,
    }
    return start_gateway(backends, provenance=provenance, **extra)


def served(sim: Sim) -> int:
    """Chat completions a simulator has been sent (a private backend or a hosted one)."""
    return len(sim.app.captured("/v1/chat/completions"))


def decision(
    private: tuple[str, ...],
    hosted: tuple[str, ...] = (),
    fallback: str = "never",
    saturation_threshold: float | None = None,
) -> Decision:
    """A policy decision for tenant `acme` and model `m` that admits these backends."""
    return Decision(
        tenant="acme",
        model="m",
        data_class=None,
        private=private,
        hosted=hosted,
        fallback=fallback,  # type: ignore[arg-type]
        saturation_threshold=saturation_threshold,
        refusal=None,
        trace=(),
        policy_id="p",
        policy_version="1",
        policy_digest="-",
        fallback_rule="p/fallback",
    )


def lone_backend(capacity: int | None = None, **fields: Any) -> BackendState:
    """The one backend (`b`, serving `m`) of a registry built from a config, with
    `fields` set on its state; `capacity` its `max_concurrency`."""
    config = gateway_config(
        [
            backend(
                "b",
                "http://127.0.0.1:9000",
                "m",
                capacity={"max_concurrency": capacity} if capacity else {},
            )
        ]
    )
    backend_state = Registry.build(config, environ={}).backends["b"]
    for name, value in fields.items():
        setattr(backend_state, name, value)
    return backend_state


def labelled_chat(gateway: Gateway, data_class: str | None = None) -> httpx.Response:
    """A small chat for `m` as the gateway's tenant, labelled `data_class` if given."""
    headers = dict(gateway.headers)
    if data_class is not None:
        headers["x-data-class"] = data_class
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
