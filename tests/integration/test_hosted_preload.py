"""LiteLLM is loaded before traffic needs it where the policies may send a request to a
hosted backend: at startup, before the gateway is ready, at a config reload, before the
new config is installed, and at a reload of the policy files alone (their watcher's),
before the new set is installed. Imported beside traffic, on a worker thread, it starved the
event loop of the GIL: a fresh gateway's first hosted call held private requests sent
every 10 ms for up to 0.8 s each, several times over the seconds the import took
(gateway/upstream/litellm_runtime.py). Where no policy falls back it is never imported
(tests/integration/test_supply_chain.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers.gateways import EU_FALLBACK_POLICY

NEVER_POLICY = EU_FALLBACK_POLICY.replace(
    "mode: when_private_unavailable\n    to: [{backend: hosted}]", "mode: never"
)
assert NEVER_POLICY != EU_FALLBACK_POLICY

# A fresh interpreter (this one may have imported LiteLLM already) runs the app's lifespan
# on its own loop, reloads gateway.yaml with the policy directory it names, and says
# when LiteLLM and the modules its first call imported (`_FIRST_CALL_MODULES`) were loaded.
_SCRIPT = """
import asyncio, os, sys, time
from pathlib import Path
import yaml
from gateway.app import create_app
from gateway.config.loader import load_config
from gateway.serving import bind_socket
from gateway.tenants import hash_api_key

directory, first = Path(sys.argv[1]), sys.argv[2]
closed = bind_socket("127.0.0.1", 0, listen=False)  # refuses connections: no backend up
url = "http://127.0.0.1:%d" % closed.getsockname()[1]
facts = {"region": "eu-west-1", "retention": {"days": 0, "zero_data_retention": True}}
config = {
    "backends": [
        {"id": "gpu", "kind": "vllm", "base_url": url, "owner": "o", "models": [{"name": "m"}],
         **facts},
        {"id": "hosted", "kind": "hosted", "provider": "openai", "base_url": url + "/v1",
         "api_key_env": "HOSTED_KEY", "owner": "openai",
         "models": [{"name": "h", "provider_model": "openai/h"}], **facts},
    ],
    "logging": {"level": "error"},
    "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key("og-k" * 8)], "models": ["*"]}],
}
path = directory / "gateway.yaml"
def write(policy):
    named = {"policy": {"paths": ["policies"], "reload_interval_s": 0.05}} if policy else {}
    path.write_text(yaml.safe_dump({**config, **named}))
write(first != "builtin")

def loaded():
    return ["litellm" in sys.modules, "litellm.proxy._types" in sys.modules]

async def main():
    app = create_app(load_config(path), environ={"HOSTED_KEY": "k"}, config_dir=directory,
                     config_file=path)
    inbox, outbox = asyncio.Queue(), asyncio.Queue()
    lifespan = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}},
                                       inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    print("= startup:", (await outbox.get())["type"])
    print("= loaded when ready:", loaded())
    if first == "watched":  # the policy file alone changes: its watcher installs it
        os.replace(directory / "next.yaml", directory / "policies" / "eu.yaml")
        deadline = time.monotonic() + 60
        while not app.policies.current.falls_back() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        print("= watched falls back:", app.policies.current.falls_back())
    else:
        write(True)
        print("= reloaded:", await app.reloader.reload())
    print("= loaded when installed:", loaded())
    await inbox.put({"type": "lifespan.shutdown"})
    print("= shutdown:", (await outbox.get())["type"])
    await lifespan

asyncio.run(main())
"""


def _run(tmp_path: Path, first: str) -> dict[str, str]:
    """`first`: `fallback` (started with a policy that falls back), `builtin` (no policy
    files, then a config reload naming one that does), `watched` (started with a policy
    that never falls back; its file then replaced by one that does, seen by the watcher)."""
    (tmp_path / "policies").mkdir()
    eu = NEVER_POLICY if first == "watched" else EU_FALLBACK_POLICY
    (tmp_path / "policies" / "eu.yaml").write_text(eu)
    (tmp_path / "next.yaml").write_text(EU_FALLBACK_POLICY)  # outside the policy directory
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path), first],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line[2:] for line in done.stdout.splitlines() if line.startswith("= ")]  # not logs
    return dict(line.split(": ", 1) for line in said)


def test_a_gateway_whose_policy_falls_back_loads_litellm_before_it_is_ready(
    tmp_path: Path,
) -> None:
    lines = _run(tmp_path, "fallback")
    assert lines["startup"] == "lifespan.startup.complete"
    assert lines["loaded when ready"] == "[True, True]"
    assert lines["shutdown"] == "lifespan.shutdown.complete"


def test_a_reload_that_first_allows_a_fallback_loads_litellm_before_it_is_installed(
    tmp_path: Path,
) -> None:
    """Started without policy files (the built-in policy never falls back): LiteLLM is not
    imported, hosted backend or not; the reload that names a policy falling back to it
    loads LiteLLM before its config takes a request."""
    lines = _run(tmp_path, "builtin")
    assert lines["startup"] == "lifespan.startup.complete"
    assert lines["loaded when ready"] == "[False, False]"
    assert lines["reloaded"] == "True"
    assert lines["loaded when installed"] == "[True, True]"


def test_a_policy_file_that_first_allows_a_fallback_loads_litellm_before_it_is_installed(
    tmp_path: Path,
) -> None:
    """The policy file alone changes (no config reload): its watcher compiles the set
    that falls back and loads LiteLLM before installing it. Before, the first hosted call
    imported it beside traffic, the stall the preload at startup had fixed."""
    lines = _run(tmp_path, "watched")
    assert lines["startup"] == "lifespan.startup.complete"
    assert lines["loaded when ready"] == "[False, False]"
    assert lines["watched falls back"] == "True"
    assert lines["loaded when installed"] == "[True, True]"
    assert lines["shutdown"] == "lifespan.shutdown.complete"
