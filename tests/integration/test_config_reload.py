"""Reloading gateway.yaml in a real `owngate serve` process, with streams in flight."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.tenants import hash_api_key
from tests.helpers.gateways import ADMIN, ADMIN_HEADERS, Sim, backend, readiness
from tests.helpers.net import free_port
from tests.helpers.processes import KEY, GatewayProcess
from tests.helpers.waiting import until

NEW_KEY = "og-reload-new-tenant-key-424242"
STREAM = {
    "model": "m",
    "stream": True,
    "max_tokens": 15,  # at 10 tokens/s: 1.5 s
    "messages": [{"role": "user", "content": "long"}],
}
SHORT = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}


def settings(backends: list[dict[str, Any]], port: int, **extra: Any) -> dict[str, Any]:
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "logging": {"format": "json", "level": "warning", "access_log": False},
        "backends": backends,
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
        "admin": ADMIN,
        **extra,
    }


@pytest.fixture
def gateway(start_sim: Callable[..., Sim], tmp_path: Path) -> Iterator[tuple[GatewayProcess, Sim]]:
    slow = start_sim("vllm", models=("m",), decode_tokens_per_s=10.0, batch_slowdown=0.0)
    process = GatewayProcess(
        settings([backend("old", slow.url, "m")], free_port()), tmp_path
    ).start()
    yield process, start_sim("vllm", models=("m",), zero_latency=True)
    process.stop(signal.SIGKILL)


def rewrite(process: GatewayProcess, config: dict[str, Any] | str) -> None:
    text = config if isinstance(config, str) else yaml.safe_dump(config)
    partial = process.path.with_suffix(".tmp")
    partial.write_text(text)
    partial.replace(process.path)  # atomic, as an operator's deploy tool would do it


def readyz(process: GatewayProcess) -> dict[str, Any]:
    return readiness(process.url)


async def streams_across_reload(process: GatewayProcess, reload: Callable[[], None]) -> list[bytes]:
    headers = {"authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=process.url, headers=headers, timeout=30) as client:
        started = [asyncio.Event() for _ in range(5)]

        async def one(event: asyncio.Event) -> bytes:
            body = b""
            async with client.stream("POST", "/v1/chat/completions", json=STREAM) as response:
                assert response.status_code == 200
                async for data in response.aiter_bytes():
                    body += data
                    event.set()
            return body

        tasks = [asyncio.create_task(one(event)) for event in started]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 20)
        await asyncio.to_thread(reload)
        assert not any(task.done() for task in tasks)  # the reload happened mid-stream
        return await asyncio.gather(*tasks)


def test_reload_swaps_backends_and_tenants_without_dropping_streams(
    gateway: tuple[GatewayProcess, Sim],
) -> None:
    process, fresh = gateway
    assert process.proc is not None
    config = settings([backend("new", fresh.url, "m")], process.port)
    config["tenants"].append({"id": "beta", "api_key_hashes": [hash_api_key(NEW_KEY)]})
    config["tenants"][1]["models"] = ["m"]

    def reload() -> None:
        rewrite(process, config)
        process.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        until(
            lambda: list(readyz(process)["backends"]) == ["new"], "the new backends", timeout=15.0
        )

    # Streams to the removed backend, running while the reload happens, all finish.
    bodies = asyncio.run(streams_across_reload(process, reload))
    for body in bodies:
        assert body.count(b'"delta":{"content":') == 15
        assert body.rstrip().endswith(b"data: [DONE]")
    # The new tenant's key works, and is served by the new backend.
    answer = httpx.post(
        f"{process.url}/v1/chat/completions",
        json=SHORT,
        headers={"authorization": f"Bearer {NEW_KEY}"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    assert fresh.app.captured("/v1/chat/completions")  # the new backend served it


def test_a_bad_config_keeps_the_running_one(gateway: tuple[GatewayProcess, Sim]) -> None:
    process, _ = gateway
    assert process.proc is not None
    good = readyz(process)["config"]
    rewrite(process, yaml.safe_dump(settings([], process.port)) + "surprise: 1\n")
    process.proc.send_signal(signal.SIGHUP)
    until(
        lambda: readyz(process)["config"]["reload_failures"] == 1, "a failed reload", timeout=15.0
    )
    state = readyz(process)
    assert state["status"] == "ready"  # still serving, with the old config
    assert "backends" in state["config"]["last_reload_error"]
    assert list(state["backends"]) == ["old"]
    metrics = httpx.get(f"{process.url}/metrics", headers=ADMIN_HEADERS, timeout=5).text
    assert "owngate_config_reload_failures_total 1.0" in metrics
    headers = {"authorization": f"Bearer {KEY}"}
    answer = httpx.post(f"{process.url}/v1/chat/completions", json=SHORT, headers=headers)
    assert answer.status_code == 200
    assert good["reload_failures"] == 0


def test_a_tagged_fact_fails_the_sighup_reload_and_keeps_the_running_config(
    gateway: tuple[GatewayProcess, Sim],
) -> None:
    # `days: !foo 3` made the loader raise PyYAML's ConstructorError, which the reload
    # (it catches ConfigError) let escape: no reason given, the signal's task died.
    process, fresh = gateway
    assert process.proc is not None
    config = settings([backend("new", fresh.url, "m", retention={"days": 0})], process.port)
    text = yaml.safe_dump(config, sort_keys=False)
    assert text.count("days: 0") == 1
    rewrite(process, text.replace("days: 0", "days: !foo 3"))
    process.proc.send_signal(signal.SIGHUP)
    until(
        lambda: readyz(process)["config"]["reload_failures"] >= 1, "a failed reload", timeout=30.0
    )
    state = readyz(process)
    assert state["status"] == "ready"
    assert list(state["backends"]) == ["old"]  # the running config kept
    error = state["config"]["last_reload_error"]
    assert "backends[0].retention.days: YAML tags" in error and "line " in error
    headers = {"authorization": f"Bearer {KEY}"}
    answer = httpx.post(f"{process.url}/v1/chat/completions", json=SHORT, headers=headers)
    assert answer.status_code == 200


def test_restart_only_settings_keep_their_value_and_the_file_is_polled(
    gateway: tuple[GatewayProcess, Sim],
) -> None:
    process, fresh = gateway
    assert process.proc is not None
    # No SIGHUP: the file poll notices. The port cannot move; the backend can.
    rewrite(process, settings([backend("new", fresh.url, "m")], free_port()))
    until(lambda: list(readyz(process)["backends"]) == ["new"], "the polled change", timeout=15.0)
    process.proc.send_signal(signal.SIGTERM)
    assert process.wait(timeout_s=30) == 0
    stderr = process.stderr()
    assert "needs restart" in stderr and '"setting":"listen"' in stderr


def test_a_request_whose_body_arrives_after_a_reload_is_routed_by_the_new_config(
    gateway: tuple[GatewayProcess, Sim],
) -> None:
    """The decision and the plan are made with the config active once the body is read: a
    reload that replaces a backend (or a policy) binds every request decided after it,
    including one whose headers came before it."""
    process, fresh = gateway
    assert process.proc is not None
    body = json.dumps(SHORT).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {KEY}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", process.port), timeout=15) as sock:
        sock.sendall(head + body[:10])  # the gateway now waits for the rest of the body
        # A head start for the head (no observable says it was read): if it was not read
        # yet, the request simply arrives after the reload and the test proves less; it
        # cannot fail the correct code.
        time.sleep(0.3)
        rewrite(process, settings([backend("new", fresh.url, "m")], process.port))
        process.proc.send_signal(signal.SIGHUP)
        until(lambda: list(readyz(process)["backends"]) == ["new"], "the new backends")
        sock.sendall(body[10:])
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert len(fresh.app.captured("/v1/chat/completions")) == 1  # the new backend served it
