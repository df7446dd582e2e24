"""`owngate demo`: the gateway, two simulated private backends and a simulated hosted
provider in one process, with the bundled config. No Redis, GPU or network needed.

The private backends run behind `owngate attest` sidecars over mutual TLS with a
throwaway CA (`gateway.demo.attested`), so every answer they serve is a two-party
statement; the banner prints the command that verifies the log as one.

The admin API (docs/admin-api.md) and its web console (docs/console.md) run beside it on
a free loopback port (never a fixed one, so a demo does not collide with a gateway or
another demo), with a fresh token per role, printed with the rest."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import TextIO

from gateway.app import admin_server, create_app
from gateway.config import GatewaySettings, load_config, parse_config
from gateway.demo.attested import PRIVATE, Sidecar, start_sidecars
from gateway.logs import configure_logging
from gateway.provenance import write_signing_key
from gateway.serving import (
    CleanExitServer,
    ServerThread,
    bind_socket,
    run_beside,
    uvicorn_config,
)
from gateway.sim import SimSettings, create_sim_app
from gateway.tenants import hash_api_key, new_admin_token, new_api_key

__all__ = ["demo_config", "demo_env", "run_demo"]


DEMO_DIR = Path(str(resources.files("gateway.demo")))
ADMIN_ROLES = ("operator", "security", "auditor")


def demo_config(
    hosted_url: str,
    sidecars: Mapping[str, Sidecar],
    key_hashes: tuple[str, str],
    log_dir: Path,
    *,
    admin_port: int,
    admin_hashes: Mapping[str, str],
) -> GatewaySettings:
    """The demo's gateway.yaml filled in: the hosted simulator's URL, the private
    backends' `sidecars` (URL, pin, key), the tenant keys' digests, the log and the PKI in
    `log_dir`, the admin API's port and its token digest per role."""
    text = (DEMO_DIR / "gateway.yaml").read_text(encoding="utf-8")
    return parse_config(
        text,
        source="gateway/demo/gateway.yaml",
        env=demo_env(
            hosted_url,
            sidecars,
            key_hashes,
            log_dir,
            admin_port=admin_port,
            admin_hashes=admin_hashes,
        ),
    )


def demo_env(
    hosted_url: str,
    sidecars: Mapping[str, Sidecar],
    key_hashes: tuple[str, str],
    log_dir: Path,
    *,
    admin_port: int,
    admin_hashes: Mapping[str, str],
) -> dict[str, str]:
    """The values of the `${OWNGATE_DEMO_...}` variables the demo's gateway.yaml names."""
    env = {
        "OWNGATE_DEMO_POLICY_DIR": str(DEMO_DIR / "policies"),
        "OWNGATE_DEMO_KEYS_FILE": str(log_dir / "keys.yaml"),
        "OWNGATE_DEMO_LOG_DIR": str(log_dir / "log"),
        "OWNGATE_DEMO_LOG_KEY": str(log_dir / "log.key"),
        "OWNGATE_DEMO_PKI_DIR": str(log_dir / "pki"),
        "OWNGATE_DEMO_HOSTED_URL": hosted_url + "/v1",
        "OWNGATE_DEMO_KEY_HASH": key_hashes[0],
        "OWNGATE_DEMO_EU_KEY_HASH": key_hashes[1],
        "OWNGATE_DEMO_ADMIN_PORT": str(admin_port),
        **{f"OWNGATE_DEMO_{role.upper()}_TOKEN_HASH": admin_hashes[role] for role in ADMIN_ROLES},
    }
    for backend, sim in PRIVATE.items():
        prefix = f"OWNGATE_DEMO_{sim.upper()}"
        env[f"{prefix}_URL"] = sidecars[backend].url
        env[f"{prefix}_PIN"] = sidecars[backend].pin
        env[f"{prefix}_ATTEST_KEY"] = sidecars[backend].vkey
    return env


def run_demo(host: str, port: int, out: TextIO = sys.stdout) -> int:
    configure_logging("console", "info")
    # uvicorn's start/stop lines for four servers would bury the banner.
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    key, eu_key = new_api_key(), new_api_key()
    tokens = {role: new_admin_token() for role in ADMIN_ROLES}
    sims = {
        "vllm": SimSettings.for_kind("vllm", models=("llama-3.1-8b", "bge-small"), seed=1),
        "llamacpp": SimSettings.for_kind("llamacpp", models=("llama-3.1-8b",), seed=2),
        "hosted": SimSettings.for_kind("vllm", models=("gpt-4o-mini",), seed=3),
    }
    with contextlib.ExitStack() as stack:
        urls = {
            name: stack.enter_context(ServerThread(create_sim_app(settings))).url
            for name, settings in sims.items()
        }
        log_dir = Path(tempfile.mkdtemp(prefix="owngate-demo-"))
        vkey = write_signing_key(log_dir / "log.key", "owngate-demo/log")
        # Entered after the simulators: the sidecars stop (and sign their logs' final
        # checkpoints) before the servers they front.
        sidecars = start_sidecars(stack, log_dir, urls)
        try:
            sock = stack.enter_context(bind_socket(host, port))
        except OSError as exc:
            print(
                f"error: cannot listen on {host}:{port}: {exc.strerror}; pick another with --port",
                file=sys.stderr,
            )
            return 1
        admin_sock = stack.enter_context(bind_socket("127.0.0.1", 0))
        admin_port = admin_sock.getsockname()[1]
        values = demo_env(
            urls["hosted"],
            sidecars,
            (hash_api_key(key), hash_api_key(eu_key)),
            log_dir,
            admin_port=admin_port,
            admin_hashes={role: hash_api_key(token) for role, token in tokens.items()},
        )
        # The simulated provider needs no key; LiteLLM wants one to be set.
        environ = {
            **os.environ,
            "OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "demo"),
            **values,
        }
        # Run from a copy of the bundled gateway.yaml, reloaded as `owngate serve` reloads
        # its file: the admin API's reload and key creation (which stores the key in
        # `keys_file` and reloads) work as they do on a real gateway. With the bundled
        # file's mtime: one stamped just before the reading began may have been written
        # during it (gateway/settling.py), and the demo would refuse until a look read it.
        config_file = log_dir / "gateway.yaml"
        shutil.copy2(DEMO_DIR / "gateway.yaml", config_file)
        read_at = time.time()
        config = load_config(config_file, env=environ)
        url = f"http://{host}:{sock.getsockname()[1]}"
        log = log_dir / "log"
        app = create_app(
            config,
            environ=environ,
            config_dir=log_dir,
            config_file=config_file,
            config_read_at=read_at,
            config_env=environ,
        )
        # Ctrl-C or SIGTERM ends the servers, then `stack` stops the sidecars, which sign
        # their logs' final checkpoints: the banner's audit passes only after that. The
        # server takes both signals before the banner tells anyone they may send one:
        # uvicorn takes them only once it runs, and a SIGTERM sent in between killed
        # the demo (-15) before the sidecars signed, a Ctrl-C ended it with exit 130.
        server = CleanExitServer(uvicorn_config(app, config.listen))
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, server.handle_exit)
        out.write(_banner(url, key, eu_key, urls, sidecars, log, vkey))
        out.write(_admin_banner(f"http://127.0.0.1:{admin_port}", tokens, vkey, sidecars))
        out.flush()
        run_beside(server, [sock], admin_server(app), [admin_sock])
    return 0


def _command(name: str) -> str:
    """`name` (owngate, python) of the environment the demo runs from, as a user types it:
    the bare name where PATH finds that very file, else its path (a checkout's
    `.venv/bin/owngate`, relative to the working directory when under it). A bare name
    that PATH resolves to another install (a system python without openai) would fail."""
    path = Path(sys.executable).absolute().parent / name
    if not path.is_file():
        return name
    found = shutil.which(name)
    if found is not None and Path(found).absolute() == path:
        return name
    cwd = Path.cwd()
    shown = path.relative_to(cwd) if path.is_relative_to(cwd) else path
    return shlex.quote(str(shown))


def _backend_keys(sidecars: Mapping[str, Sidecar]) -> str:
    return " \\\n    ".join(f"--backend-key {s.backend}={s.vkey}" for s in sidecars.values())


def _audit(log: Path, vkey: str, sidecars: Mapping[str, Sidecar]) -> str:
    """The command that verifies the demo's log as two-party: every answer a private
    backend served countersigned by its sidecar, and each sidecar's log agreeing."""
    logs = " \\\n    ".join(f"--attest-log {s.backend}={s.log}" for s in sidecars.values())
    return (
        f"{_command('owngate')} audit verify {log} --key {vkey} \\\n"
        f"    {_backend_keys(sidecars)} \\\n    {logs}"
    )


def _banner(
    url: str,
    key: str,
    eu_key: str,
    sims: dict[str, str],
    sidecars: Mapping[str, Sidecar],
    log: Path,
    vkey: str,
) -> str:
    gpu, cpu = sidecars["gpu-vllm"], sidecars["cpu-llamacpp"]
    owngate = _command("owngate")
    return f"""
owngate demo is running at {url}
  simulated private backends: gpu-vllm (vLLM-like, {sims["vllm"]}),
                              cpu-llamacpp (llama.cpp-like, 4 slots, {sims["llamacpp"]}),
      each behind an `owngate attest` sidecar ({gpu.url}, {cpu.url}):
      mutual TLS with a throwaway CA, the sidecar's key pinned, region/owner/retention
      read from its certificate, every answer countersigned by the backend's own key
  simulated hosted provider:  openai ({sims["hosted"]}), reached through LiteLLM
      (cannot countersign: its response and request ids are recorded instead)
  trust policies:             gateway/demo/policies/demo.yaml
  demo API key (shown once):  {key}
      tenant demo: private first; gpt-4o-mini (hosted only) allowed as a fallback
  EU tenant key (shown once): {eu_key}
      tenant demo-eu: EU and zero retention only; gpt-4o-mini is not among its models
      (404, as for a model that does not exist; the signed log names the rule)

Try it:
  curl -s {url}/v1/chat/completions \\
    -H "Authorization: Bearer {key}" -H "Content-Type: application/json" \\
    -d '{{"model": "llama-3.1-8b", "messages": [{{"role": "user", "content": "Hello!"}}]}}'

{_command("python")} - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="{url}/v1", api_key="{key}")
reply = client.chat.completions.create(
    model="llama-3.1-8b", messages=[{{"role": "user", "content": "Hello!"}}])
print(reply.choices[0].message.content)
PY

Models: curl -s {url}/v1/models -H "Authorization: Bearer {key}"
Metrics: curl -s {url}/metrics
Backends: {owngate} status --url {url}   (no admin token: the demo lets loopback clients read)
Provenance: every request is in a signed log; the receipt is the x-owngate-receipt header.
  Verify the log as two-party (after Ctrl-C, when each log has its final checkpoint):
  {_audit(log, vkey, sidecars)}
  Verify a receipt as two-party (the header, base64-decoded, in receipt.json):
  {owngate} audit receipt verify receipt.json --key {vkey} --log {log} \\
    {_backend_keys(sidecars)}
"""


def _admin_banner(
    url: str, tokens: Mapping[str, str], vkey: str, sidecars: Mapping[str, Sidecar]
) -> str:
    auditor, security = tokens["auditor"], tokens["security"]
    return f"""
Admin API (its own listener, loopback only) at {url}
  schema: {url}/openapi.json   provenance log (C2SP tlog-tiles): {url}/log/
  web console: {url}/console/   (log in with a token below: each role sees its pages)
  Without a token a loopback client may only read (GET); reload, drain and tenant keys
  need the token of the role below, which the admin record of each change names.
  operator token (shown once): {tokens["operator"]}
      curl -s {url}/admin/v1/status -H "Authorization: Bearer {tokens["operator"]}"
      curl -s -X POST {url}/admin/v1/reload -H "Authorization: Bearer {tokens["operator"]}"
  security token (shown once): {security}
      curl -s {url}/admin/v1/policies -H "Authorization: Bearer {security}"
      curl -s {url}/admin/v1/keys -H "Authorization: Bearer {security}" \\
        -H "Content-Type: application/json" -d '{{"tenant": "demo"}}'
  auditor token (shown once):  {auditor}
      curl -s {url}/log/checkpoint -H "Authorization: Bearer {auditor}"
  Verify the live log over HTTP:
  {_command("owngate")} audit verify {url}/log/ --key {vkey} --token {auditor} \\
    {_backend_keys(sidecars)}
Ctrl-C stops everything.

"""
