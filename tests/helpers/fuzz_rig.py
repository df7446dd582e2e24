"""The fuzz suite's rig: `owngate serve` as its own process, with simulated backends.

The gateway runs as production runs it (`GatewayProcess`: `python -m gateway serve`,
uvicorn with httptools and uvloop), so the raw bytes a fuzzer sends meet the real HTTP
parser, and its resident memory can be read from /proc. Its provenance log is on, so
what it records can be searched too.

Backends are simulators in the test process (`gateway.sim` on real sockets):

- `gpu-ok` serves `m` (alias `m-alias`), healthy: any 5xx for `m` is the gateway's;
- `gpu-bad` serves `f` and answers every inference request it accepts with 500 (it
  still refuses malformed ones with 400, as vLLM does), so requests for `f` are tried,
  fail, and take the fallback path wherever their policy allows one;
- `gpu-down` serves `g` at an address where nothing listens, so every request for `g`,
  well formed or not, goes straight to the fallback (LiteLLM's own checks included);
- `hosted-open` is an OpenAI-shaped provider reached through LiteLLM (the simulator
  again, as in the demo), healthy, serving `f` and `g`; `HostedCounter` counts every
  POST it receives, which is every request a hosted provider ever saw.

Tenants: `open` may fall back to `hosted-open` unless the request is labelled `phi`;
`never` (policy `fallback: never`) may not, whatever it sends; `clinic` (its own gateway,
`CLINIC_POLICIES`) treats an unlabelled request as `phi` (`default_data_class`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from gateway.asgi import Receive, Scope, Send
from gateway.provenance import write_signing_key
from gateway.serving import ServerThread, bind_socket
from gateway.sim import Faults, SimSettings, create_sim_app
from gateway.tenants import hash_api_key
from tests.helpers.net import free_port
from tests.helpers.processes import GatewayProcess

__all__ = [
    "CLINIC_POLICIES",
    "KEYS",
    "POLICIES",
    "Backends",
    "HostedCounter",
    "fuzz_gateway",
    "gateway_config",
    "start_backends",
]

KEYS: Final = {
    "open": "og-fuzz-open-0123456789abcdefghij",
    "never": "og-fuzz-never-0123456789abcdefghi",
    "clinic": "og-fuzz-clinic-0123456789abcdefgh",
}
HOSTED_KEY_ENV: Final = "OWNGATE_FUZZ_HOSTED_KEY"
HOSTED_KEY: Final = "sk-fuzz-hosted-0123456789"
_ZERO_RETENTION: Final = {"days": 0, "zero_data_retention": True}

# Declared classes are `phi` and `public`: the only values that may be recorded.
POLICIES: Final = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: open, version: "1"}
spec:
  tenants: [open]
  residency: {allow: ["*"]}
  retention: {max_days: any}
  fallback: {mode: when_private_unavailable, to: [{backend: hosted-open}]}
  data_classes:
    phi: {description: never leaves our servers, fallback: {mode: never}}
    public: {description: may use the hosted fallback}
---
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: never, version: "1"}
spec:
  tenants: [never]
  residency: {allow: ["*"]}
  retention: {max_days: any}
  fallback: {mode: never}
  data_classes:
    phi: {description: never leaves our servers}
    public: {description: the tenant never falls back anyway}
"""

# Issue 12, item 2: a request without a label is treated as `default_data_class`.
CLINIC_POLICIES: Final = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: clinic, version: "1"}
spec:
  tenants: [clinic]
  default_data_class: phi
  residency: {allow: ["*"]}
  retention: {max_days: any}
  fallback: {mode: when_private_unavailable, to: [{backend: hosted-open}]}
  data_classes:
    phi: {description: never leaves our servers, fallback: {mode: never}}
    public: {description: may use the hosted fallback}
"""


@dataclasses.dataclass(eq=False)
class HostedCounter:
    """An ASGI wrapper that counts the POSTs reaching the app it wraps (thread-safe enough:
    one int, incremented in the server's thread before the request is answered)."""

    app: Any
    posts: int = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            self.posts += 1
        await self.app(scope, receive, send)


@dataclasses.dataclass
class Backends:
    ok_url: str
    bad_url: str
    down_url: str
    hosted_url: str
    hosted: HostedCounter


def start_backends() -> Iterator[Backends]:
    """The simulators, and a port nobody listens on (a generator: a fixture's body)."""
    ok = create_sim_app(SimSettings.for_kind("vllm", models=("m",), zero_latency=True))
    bad = create_sim_app(
        SimSettings.for_kind(
            "vllm", models=("f",), zero_latency=True, faults=Faults(error_rate=1.0)
        )
    )
    hosted = HostedCounter(
        create_sim_app(
            SimSettings.for_kind("vllm", models=("f", "g"), zero_latency=True, api_key=HOSTED_KEY)
        )
    )
    # Bound and never listening: connections are refused, and no other test takes the port.
    down = bind_socket("127.0.0.1", 0, listen=False)
    down_url = f"http://127.0.0.1:{down.getsockname()[1]}"
    servers = [ServerThread(app).start() for app in (ok, bad, hosted)]
    try:
        yield Backends(servers[0].url, servers[1].url, down_url, servers[2].url, hosted)
    finally:
        for server in servers:
            server.stop()
        down.close()


def gateway_config(backends: Backends, port: int, tenants: tuple[str, ...]) -> dict[str, Any]:
    def private(id: str, url: str, models: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": id,
            "kind": "vllm",
            "base_url": url,
            "models": models,
            "region": "eu-west-1",
            "owner": "fuzz",
            "retention": _ZERO_RETENTION,
        }

    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "logging": {"format": "json", "level": "info", "access_log": True},
        "limits": {"max_body_bytes": 256 * 1024, "drain_timeout_s": 10},
        "backends": [
            private("gpu-ok", backends.ok_url, [{"name": "m", "aliases": ["m-alias"]}]),
            private("gpu-bad", backends.bad_url, [{"name": "f"}]),
            private("gpu-down", backends.down_url, [{"name": "g"}]),
            {
                "id": "hosted-open",
                "kind": "hosted",
                "provider": "openai",
                "base_url": f"{backends.hosted_url}/v1",
                "api_key_env": HOSTED_KEY_ENV,
                "models": [
                    {"name": "f", "provider_model": "openai/f"},
                    {"name": "g", "provider_model": "openai/g"},
                ],
                "region": "eu-west-1",
                "owner": "provider",
                "retention": _ZERO_RETENTION,
            },
        ],
        "policy": {"paths": ["policies"], "reload_interval_s": 3600},
        "provenance": {
            "dir": "log",
            "origin": "fuzz.owngate/log",
            "signing_key_file": "log.key",
        },
        "tenants": [
            {"id": t, "api_key_hashes": [hash_api_key(KEYS[t])], "models": ["*"]} for t in tenants
        ],
    }


def fuzz_gateway(
    directory: Path, backends: Backends, policies: str, tenants: tuple[str, ...]
) -> GatewayProcess:
    """`owngate serve` in a directory of its own, not started: gateway.yaml, policies/,
    the log's signing key (log.key; the log goes to log/), the hosted provider's key."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "policies").mkdir(exist_ok=True)
    (directory / "policies" / "policies.yaml").write_text(policies)
    write_signing_key(directory / "log.key", "fuzz.owngate/log")
    config = gateway_config(backends, free_port(), tenants)
    return GatewayProcess(config, directory, env={HOSTED_KEY_ENV: HOSTED_KEY, "NO_COLOR": "1"})
