"""A real `owngate serve` process with its admin API open, for the admin API's tests:
one simulated vLLM backend `gpu` serving `m`, tenant `acme` (key `KEY`), a keys file,
the provenance log in `log/`, and an admin token per role (`TOKENS`, `bearer`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from gateway.provenance import load_signer, write_signing_key
from gateway.provenance.formats.cosignature import Cosigner
from gateway.provenance.testing import seeded_signer
from gateway.provenance.witness.app import create_witness_app
from gateway.provenance.witness.witness import Witness
from gateway.serving import ServerThread
from gateway.sim import SimSettings, create_sim_app
from gateway.tenants import hash_api_key
from tests.helpers.net import free_ports
from tests.helpers.processes import KEY, GatewayProcess
from tests.helpers.waiting import until

__all__ = ["CASES", "ORIGIN", "TOKENS", "WITNESS", "Served", "bearer", "serve_admin"]

TOKENS = {
    "operator": "og-admin-operator-token-0123456789",
    "security": "og-admin-security-token-0123456789",
    "auditor": "og-admin-auditor-token-0123456789",
    "admin": "og-admin-full-access-token-0123456789",
}
ORIGIN = "admin-api.test/log"
WITNESS = Cosigner(seeded_signer("witness.example/admin-api"))
# Policy test cases for the gateway's built-in policy set: one passes, one fails.
CASES = """
apiVersion: policy.owngate.dev/v1
kind: PolicyTest
metadata: {id: admin-cases}
cases:
  - name: private only
    input: {tenant: acme, model: m}
    expect: {private: [gpu], hosted: [], refusal: null}
  - name: expects a hosted fallback that is not there
    input: {tenant: acme, model: m}
    expect: {hosted: [openai]}
"""


def bearer(role: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[role]}"}


class Served:
    def __init__(self, process: GatewayProcess, admin_url: str, vkey: str, log: Path) -> None:
        self.process = process
        self.admin = admin_url
        self.vkey = vkey
        self.log = log

    def get(self, path: str, role: str | None = None) -> httpx.Response:
        headers = bearer(role) if role else {}
        return httpx.get(f"{self.admin}{path}", headers=headers, timeout=10)

    def post(
        self, path: str, role: str | None, body: Any = None, *, timeout: float = 10
    ) -> httpx.Response:
        headers = bearer(role) if role else {}
        return httpx.post(f"{self.admin}{path}", headers=headers, json=body, timeout=timeout)

    def chat(self, key: str = KEY) -> httpx.Response:
        return httpx.post(
            f"{self.process.url}/v1/chat/completions",
            headers={"authorization": f"Bearer {key}"},
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            timeout=10,
        )

    def size(self) -> int:
        note = self.log / "checkpoint"
        return int(note.read_text().split("\n")[1]) if note.exists() else 0

    def wait_for_size(self, size: int) -> None:
        until(lambda: self.size() >= size, f"the log's checkpoint at {size} entries", timeout=20)


@contextmanager
def serve_admin(
    directory: Path,
    *,
    witness: bool = False,
    listen: dict[str, Any] | None = None,
    backend: dict[str, Any] | None = None,
    provenance: dict[str, Any] | None = None,
    origin: str = ORIGIN,
    state: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    **admin: Any,
) -> Iterator[Served]:
    """The gateway in `directory` (`admin`: more admin settings; `listen`: more `listen`
    settings, for both listeners; `backend`, `provenance`: settings that replace those of
    the backend `gpu` and of the log; `state`: its shared state (memory when none);
    `origin`: the log's, and its key's name; `witness`:
    a witness, `WITNESS`, cosigns its checkpoints; `env`: more environment variables of
    the `owngate serve` process); on exit it must stop cleanly (both
    listeners closed, the log's last checkpoint signed)."""
    with contextlib.ExitStack() as stack:
        vkey = write_signing_key(directory / "log.key", origin)
        witnesses = []
        if witness:
            log_verifier = load_signer(directory / "log.key").verifier()
            cosigning = Witness.open(directory / "witness.db", WITNESS, [log_verifier], new=True)
            stack.callback(cosigning.close)
            server = ServerThread(create_witness_app(cosigning)).start()
            stack.callback(server.stop)
            witnesses.append({"url": server.url, "vkey": WITNESS.vkey, "timeout_s": 2})
        provenance = {"origin": origin, **(provenance or {})}
        extra = {"backend": backend or {}, "provenance": provenance, "listen": listen or {}}
        extra["state"] = state or {}
        yield stack.enter_context(_serve(directory, vkey, witnesses, admin, extra, env))


@contextmanager
def _serve(
    directory: Path,
    vkey: str,
    witnesses: list[dict[str, Any]],
    admin: dict[str, Any],
    extra: dict[str, dict[str, Any]],
    env: dict[str, str] | None = None,
) -> Iterator[Served]:
    sim = ServerThread(create_sim_app(SimSettings.for_kind("vllm", models=("m",)))).start()
    admin_port, port = free_ports(2)  # distinct: two free_port calls once gave the same
    config = {
        "listen": {"host": "127.0.0.1", "port": port, **extra["listen"]},
        "logging": {"format": "json", "level": "warning"},
        "backends": [
            {
                "id": "gpu",
                "kind": "vllm",
                "base_url": sim.url,
                "models": [{"name": "m"}],
                "region": "eu-west-1",
                "owner": "test",
                **extra["backend"],
            }
        ],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
        "keys_file": "keys.yaml",
        "provenance": {
            "dir": "log",
            "origin": ORIGIN,
            "signing_key_file": "log.key",
            "checkpoint_interval_ms": 20,
            "witnesses": witnesses,
            **extra["provenance"],
        },
        "admin": {
            "listen": {"host": "127.0.0.1", "port": admin_port},
            "token_hashes": [hash_api_key(TOKENS["admin"])],
            "tokens": [
                {"hash": hash_api_key(TOKENS[role]), "role": role}
                for role in ("operator", "security", "auditor")
            ],
            **admin,
        },
    }
    if extra["state"]:
        config["state"] = extra["state"]
    process = GatewayProcess(config, directory, env=env).start()
    try:
        yield Served(process, f"http://127.0.0.1:{admin_port}", vkey, directory / "log")
    finally:
        code = process.stop()
        sim.stop()
    assert code == 0, process.output()
