"""LiteLLM is pinned to a vetted release and stays off the private-backend path."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

COMPROMISED = {"1.82.7", "1.82.8"}


def test_litellm_is_a_vetted_release_without_startup_hooks() -> None:
    dist = metadata.distribution("litellm")
    assert dist.version not in COMPROMISED
    # The 2026 compromise shipped a .pth file that runs code at every interpreter start.
    files = [str(f) for f in dist.files or []]
    assert files, "litellm's RECORD is missing: cannot vet what it installed"
    assert not [f for f in files if f.endswith(".pth")]


def test_private_path_never_imports_litellm() -> None:
    script = """
import sys
import httpx
from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.tenants import hash_api_key
from gateway.serving import ServerThread
from gateway.sim import SimSettings, create_sim_app

sim_settings = SimSettings.for_kind("vllm", models=("m",), zero_latency=True)
with ServerThread(create_sim_app(sim_settings)) as sim:
    private = {"id": "b", "kind": "vllm", "base_url": sim.url, "models": [{"name": "m"}],
               "region": "eu", "owner": "o"}
    hosted = {"id": "h", "kind": "hosted", "provider": "openai", "region": "us",
              "owner": "openai", "models": [{"name": "g", "provider_model": "openai/g"}]}
    tenant = {"id": "t", "api_key_hashes": [hash_api_key("og-k")], "models": ["*"]}
    config = GatewayConfig.model_validate({"backends": [private, hosted], "tenants": [tenant]})
    with ServerThread(create_app(config, environ={})) as gw:
        for stream in (False, True):
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                    "stream": stream}
            r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=10,
                           headers={"authorization": "Bearer og-k"})
            assert r.status_code == 200, r.text
print("litellm" in sys.modules, any(m.startswith("litellm") for m in sys.modules))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "False False"
