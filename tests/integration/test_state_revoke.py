"""`owngate keys revoke` without Redis: the digest leaves the keys file atomically and a
gateway loading that file refuses the key (401, OpenAI error format); unknown keys,
keys listed in gateway.yaml itself and an unreachable Redis are reported, not ignored.
(With Redis, every running replica refuses the key: tests/integration/test_replicas.py.)"""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.app import create_app
from gateway.cli.main import main
from gateway.config import load_config
from gateway.serving import ServerThread
from gateway.tenants import hash_api_key, read_keys_file
from tests.helpers.gateways import Sim, backend
from tests.helpers.net import free_port

INLINE_KEY = "og-revoke-inline-key-0123456789"


@pytest.fixture
def config_path(tmp_path: Path, start_sim: Callable[..., Sim]) -> Path:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    config: dict[str, Any] = {
        "logging": {"format": "json", "level": "warning"},
        "backends": [backend("gpu", sim.url, "m")],
        "tenants": [
            {"id": "acme", "models": ["*"], "api_key_hashes": [hash_api_key(INLINE_KEY)]},
            {"id": "beta", "models": ["*"]},
        ],
        "keys_file": "keys.yaml",
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def serve(config_path: Path) -> Iterator[Callable[[], str]]:
    """Start a gateway from the config file as it is now (as a restart would)."""
    servers: list[ServerThread] = []

    def start() -> str:
        app = create_app(load_config(config_path), environ={}, config_dir=config_path.parent)
        servers.append(ServerThread(app).start())
        return servers[-1].url

    yield start
    for server in servers:
        server.stop()


def new_key(config_path: Path, tenant: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["keys", "new", "--tenant", tenant, "--config", str(config_path)]) == 0
    return capsys.readouterr().out.strip()


def chat(url: str, key: str) -> httpx.Response:
    body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30)


@pytest.mark.parametrize("given_as", ["key", "hash"])
def test_revoked_key_leaves_the_file_and_is_refused(
    config_path: Path,
    serve: Callable[[], str],
    capsys: pytest.CaptureFixture[str],
    given_as: str,
) -> None:
    doomed = new_key(config_path, "acme", capsys)
    kept = new_key(config_path, "acme", capsys)
    before = serve()
    assert chat(before, doomed).status_code == 200

    argument = doomed if given_as == "key" else hash_api_key(doomed)
    assert main(["keys", "revoke", argument, "--config", str(config_path)]) == 0
    err = capsys.readouterr().err
    assert "removed" in err and "SIGHUP" in err
    stored = read_keys_file(config_path.parent / "keys.yaml")
    assert stored == {"acme": [hash_api_key(kept)]}
    assert not list(config_path.parent.glob(".keys.yaml.*"))  # no temp file left behind

    after = serve()
    refused = chat(after, doomed)
    assert refused.status_code == 401
    error = refused.json()["error"]
    assert (error["code"], error["type"]) == ("invalid_api_key", "invalid_request_error")
    assert chat(after, kept).status_code == 200


def test_unknown_key_is_an_error_and_changes_nothing(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kept = new_key(config_path, "beta", capsys)
    before = (config_path.parent / "keys.yaml").read_bytes()
    assert main(["keys", "revoke", "og-never-issued", "--config", str(config_path)]) == 1
    assert "no tenant" in capsys.readouterr().err
    assert (config_path.parent / "keys.yaml").read_bytes() == before
    assert main(["keys", "revoke", " ", "--config", str(config_path)]) == 2
    assert read_keys_file(config_path.parent / "keys.yaml") == {"beta": [hash_api_key(kept)]}


def test_a_key_in_gateway_yaml_itself_needs_an_edit(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "revoke", INLINE_KEY, "--config", str(config_path)]) == 1
    err = capsys.readouterr().err
    assert "api_key_hashes" in err and "acme" in err


def test_unreachable_redis_fails_but_still_cleans_the_file(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doomed = new_key(config_path, "beta", capsys)
    config = yaml.safe_load(config_path.read_text())
    config["state"] = {"backend": "redis", "url": f"redis://127.0.0.1:{free_port()}/0"}
    config_path.write_text(yaml.safe_dump(config))
    assert main(["keys", "revoke", doomed, "--config", str(config_path)]) == 1
    err = capsys.readouterr().err
    assert "could not store the revocation in Redis" in err
    assert read_keys_file(config_path.parent / "keys.yaml") == {"beta": []}


class _ForgingRedis(socketserver.BaseRequestHandler):
    """Answers every command with an error whose text would clear the operator's screen."""

    def handle(self) -> None:
        while data := self.request.recv(65536):
            commands = data.count(b"\r\n*") + data.startswith(b"*")
            self.request.sendall(b"-ERR \x1b[2J\x1b]0;owned\x07\r\n" * commands)


def test_what_redis_answers_is_withheld(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doomed = new_key(config_path, "beta", capsys)
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), _ForgingRedis) as server:
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        config = yaml.safe_load(config_path.read_text())
        url = f"redis://127.0.0.1:{server.server_address[1]}/0"
        config["state"] = {"backend": "redis", "url": url}
        config_path.write_text(yaml.safe_dump(config))
        try:
            assert main(["keys", "revoke", doomed, "--config", str(config_path)]) == 1
        finally:
            server.shutdown()
            thread.join(timeout=10)
    err = capsys.readouterr().err
    assert "could not store the revocation in Redis" in err
    # A server's own words are withheld (they may echo a password: docs/security.md),
    # told by their class and length; never printed, raw or escaped.
    assert "ResponseError: [message withheld: 14 characters]" in err
    assert "owned" not in err
    assert [c for line in err.split("\n") for c in line if not c.isprintable()] == []
