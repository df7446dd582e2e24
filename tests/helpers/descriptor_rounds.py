"""Bursts that fill a gateway's backend connections under a low open-file limit.

Shared by tests/integration/test_out_of_descriptors.py (private backends) and
test_hosted_sockets.py / test_hosted_connector_share.py (hosted providers): a gateway
started under an open-file limit of 128 (its connection cap derived: 32), and rounds of
30 requests at once to one model, each on a client connection of its own.
"""

from __future__ import annotations

import resource
import socket
from pathlib import Path
from typing import Any

from gateway.config.schema import BackendSettings
from gateway.tenants import hash_api_key
from gateway.upstream.hosted import HostedClient
from tests.helpers.gateways import Sim
from tests.helpers.net import free_port
from tests.helpers.processes import KEY, GatewayProcess
from tests.helpers.raw_socket import WAIT_S, parse, read_answer

__all__ = ["burst", "hosted_client", "start_at_128", "three_backends"]


def _chat(model: str) -> bytes:
    """A chat request for `model` that takes its backend (20 tokens a second) 2 s."""
    body = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40}'
    body %= model.encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer " + KEY.encode() + b"\r\n"
    )
    return head + b"content-length: %d\r\n\r\n" % len(body) + body


def three_backends(sims: dict[str, Sim]) -> dict[str, Any]:
    """A gateway config with one vLLM backend per simulator, each serving its key."""
    return {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "warning", "access_log": False},
        "backends": [
            {"id": m, "kind": "vllm", "base_url": sim.url, "models": [{"name": m}]}
            | {"region": "eu", "owner": "t"}
            for m, sim in sims.items()
        ],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
    }


def start_at_128(config: dict[str, Any], directory: Path) -> GatewayProcess:
    """`owngate serve` with `config`, under an open-file limit of 128."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))  # inherited by the gateway
    try:
        return GatewayProcess(config, directory).start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def burst(gateway: GatewayProcess, model: str) -> None:
    """30 requests at once to `model`, each on a client connection of its own; all 200."""
    clients = [socket.create_connection(("127.0.0.1", gateway.port), WAIT_S) for _ in range(30)]
    try:
        for sock in clients:
            sock.sendall(_chat(model))
        statuses = [parse(read_answer(sock))[0] for sock in clients]
    finally:
        for sock in clients:
            sock.close()
    assert statuses == [200] * 30, (model, statuses)


def hosted_client(host: str, port: int) -> HostedClient:
    """A hosted OpenAI backend at `http://host:port/v1`, model `public`."""
    backend = BackendSettings.model_validate(
        {
            "id": "openai-hosted",
            "kind": "hosted",
            "provider": "openai",
            "base_url": f"http://{host}:{port}/v1",
            "models": [{"name": "public", "provider_model": "openai/gpt-sim"}],
            "region": "us",
            "owner": "openai",
            "api_key_env": "SIM_OPENAI_KEY",
        }
    )
    return HostedClient(backend, environ={"SIM_OPENAI_KEY": "sk-sim"}, timeout_s=WAIT_S)
