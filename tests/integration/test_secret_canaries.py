"""Secrets never reach an output: a real `owngate serve` at `debug`, every output on,
holding a canary for each secret it keeps (the hosted providers' keys, AWS credentials
(access key id, secret key, session token: botocore signs the Bedrock calls), a private
backend's key, the Redis password, the OTLP
exporter's auth header, the tenant's key, the admin token, the log's signing key),
driven into every failure that might repeat one: providers answering 401/403/400/500
with a body that echoes the request's headers and path (the key, `?key=`), a hosted
`base_url` that refuses, does not resolve or fails TLS, a "Redis" that
answers every command with an error quoting it, an OTLP endpoint that answers 401
echoing its request. Then the client's answers (bodies and headers), stdout/stderr,
the provenance log's files, `/metrics` and the admin API's views are searched for
every canary, in any letter case. (A password in a `base_url`'s userinfo is refused at
load, naming the host only: tests/unit/test_base_url_userinfo.py.)
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.provenance import write_signing_key
from gateway.tenants import hash_api_key
from tests.helpers.gateways import LITELLM_WARNINGS
from tests.helpers.net import free_port, free_ports
from tests.helpers.processes import GatewayProcess
from tests.helpers.raw_backend import Answer, Post, RawBackend

pytestmark = LITELLM_WARNINGS

SECRETS = {
    "OPENAI_KEY": "sk-SecOpenai4c1d",
    "AZURE_KEY": "SecAzure93ab",
    "ANTHROPIC_KEY": "sk-ant-SecAnthropic77e2",
    "GEMINI_KEY": "AIzaSecGemini5f0e",
    "PRIVATE_KEY": "SecPrivate2b8c",
    "HOST_PASSWORD": "SecUserinfo61d0",
    "REDIS_PASSWORD": "SecRedis0a4f",
    "OTLP_TOKEN": "SecOtlp8e3b",
    # botocore reads these for the Bedrock backends; the access key id is sent, in the
    # Authorization header's credential scope, to the provider, which echoes it back.
    "AWS_ACCESS_KEY_ID": "AKIASECAWSKEYID5d9c",
    "AWS_SECRET_ACCESS_KEY": "SecAwsSecret" + "s" * 28,
    "AWS_SESSION_TOKEN": "SecAwsSession" + "t" * 30,
}
TENANT_KEY = "og-SecTenant-" + "t" * 24
ADMIN_TOKEN = "og-SecAdmin-0123456789abcdef"
BEDROCK_MODEL = "bedrock/converse/anthropic.claude-3-haiku-20240307-v1:0"
EU = {"region": "eu-west-1", "retention": {"days": 0, "zero_data_retention": True}}
STATUSES = (401, 403, 400, 500)


async def _echo(writer: asyncio.StreamWriter, post: Post) -> bool:
    """A provider that answers an error quoting the request it got, headers and all."""
    line = post.head.split(b"\r\n", 1)[0]
    status = next((s for s in STATUSES if b"/s%d/" % s in line), 401)
    echo = (post.head + post.body).decode("utf-8", "replace")
    body = orjson.dumps(
        {"error": {"message": f"bad key: {echo}", "type": "invalid_request_error", "code": echo}}
    )
    quoted = echo.encode("ascii", "replace").replace(b"\r\n", b" ")[:4000]
    writer.write(
        b"HTTP/1.1 %d Echo %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"x-echo: %s\r\n\r\n" % (status, quoted, len(body), quoted) + body
    )
    await writer.drain()
    return False


class _EchoingRedis:
    """A TCP server at the Redis URL that answers every read with a RESP error quoting
    what it read (a proxy, another service, a Redis that echoes the arguments)."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> _EchoingRedis:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(1)
                try:
                    data = conn.recv(4096)
                    conn.sendall(b"-ERR got " + data.replace(b"\r\n", b" ")[:1000] + b"\r\n")
                except OSError:
                    pass


def _hosted(id: str, url: str, provider: str, model: str, key_env: str | None) -> dict[str, Any]:
    backend: dict[str, Any] = {
        "id": id,
        "kind": "hosted",
        "provider": provider,
        "base_url": url,
        "models": [{"name": id, "provider_model": model}],
    }
    if key_env is not None:  # AWS: botocore's credential chain (the environment)
        backend["api_key_env"] = key_env
    if provider == "azure":
        backend["unsafe_unchecked_azure_host"] = True
    return backend


def _backends(echo: RawBackend, private: RawBackend) -> list[dict[str, Any]]:
    closed = free_port()
    hosted = []
    for status in STATUSES:
        root = f"{echo.url}/s{status}"
        hosted += [
            _hosted(f"openai-{status}", root + "/v1", "openai", "openai/m", "OPENAI_KEY"),
            _hosted(f"azure-{status}", root, "azure", "azure/m", "AZURE_KEY"),
            _hosted(f"anthropic-{status}", root, "anthropic", "anthropic/m", "ANTHROPIC_KEY"),
            _hosted(f"gemini-{status}", root, "gemini", "gemini/gemini-1.5-pro", "GEMINI_KEY"),
            _hosted(f"bedrock-{status}", root, "aws", BEDROCK_MODEL, None),
        ]
    bases = {
        "refused": f"http://127.0.0.1:{closed}/v1",
        "unresolved": "http://owngate-no-such-host.invalid/v1",
        "tls": f"https://127.0.0.1:{echo.port}/v1",
        "echo": f"http://127.0.0.1:{echo.port}/s500/v1",
    }
    hosted += [
        _hosted(f"unreached-{n}", url, "openai", "openai/m", "OPENAI_KEY")
        for n, url in bases.items()
    ]
    private_backend = {
        "id": "gpu",
        "kind": "vllm",
        "base_url": private.url,
        "api_key": "${PRIVATE_KEY}",
        "models": [{"name": "gpu"}],
    }
    return [{**b, "owner": "t", **EU} for b in (private_backend, *hosted)]


POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: secrets, version: "1"}
spec:
  tenants: [acme]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback:
    mode: when_private_unavailable
    to: [%s]
"""


@pytest.fixture
def redis_echo() -> Iterator[_EchoingRedis]:
    with _EchoingRedis() as server:
        yield server


def test_no_secret_reaches_a_client_a_log_or_a_view(
    start_raw: Callable[[Answer], RawBackend], redis_echo: _EchoingRedis, tmp_path: Path
) -> None:
    echo, private, otlp = start_raw(_echo), start_raw(_echo), start_raw(_echo)
    backends = _backends(echo, private)
    hosted_ids = [b["id"] for b in backends if b["kind"] == "hosted"]
    directory = tmp_path / "gw"
    (directory / "policies").mkdir(parents=True)
    (directory / "policies" / "p.yaml").write_text(
        POLICY % ", ".join(f"{{backend: {i}}}" for i in hosted_ids)
    )
    write_signing_key(directory / "log.key", "secrets.test/log")
    signing_key = (directory / "log.key").read_text().split("+")[-1].strip()
    port, admin_port = free_ports(2)
    redis_url = f"redis://:{SECRETS['REDIS_PASSWORD']}@127.0.0.1:{redis_echo.port}/0"
    config = {
        "listen": {"host": "127.0.0.1", "port": port},
        "logging": {"format": "json", "level": "debug", "access_log": True},
        "backends": backends,
        "policy": {"paths": ["policies"]},
        "state": {"backend": "redis", "url": "${REDIS_URL}"},
        "provenance": {
            "dir": "log",
            "origin": "secrets.test/log",
            "signing_key_file": "log.key",
            "checkpoint_interval_ms": 50,
        },
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["*"]}],
        "admin": {
            "listen": {"host": "127.0.0.1", "port": admin_port},
            "token_hashes": [hash_api_key(ADMIN_TOKEN)],
        },
    }
    env = {
        "NO_COLOR": "1",
        **SECRETS,
        "REDIS_URL": redis_url,
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url,
        "OTEL_EXPORTER_OTLP_HEADERS": f"x-honeycomb-team={SECRETS['OTLP_TOKEN']}",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,  # the canaries above, not a profile
        "AWS_CONFIG_FILE": os.devnull,
    }
    gateway = GatewayProcess(config, directory, env=env)
    client: list[bytes] = []
    headers = {"authorization": f"Bearer {TENANT_KEY}"}
    admin = f"http://127.0.0.1:{admin_port}"
    try:
        gateway.start()
        for model in ("gpu", *hosted_ids):
            for stream in (False, True):
                body = {"model": model, "stream": stream}
                body["messages"] = [{"role": "user", "content": "hi"}]
                answer = httpx.post(
                    gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=60
                )
                client.append(repr(answer.headers.raw).encode() + answer.content)
        client.append(httpx.get(gateway.url + "/metrics", timeout=10).content)
        admin_headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        for path in ("status", "tenants", "policies", "config", "keys", "timeline/backends"):
            answer = httpx.get(f"{admin}/admin/v1/{path}", headers=admin_headers, timeout=30)
            assert answer.status_code == 200, (path, answer.text)
            client.append(answer.content)
        client.append(httpx.get(f"{admin}/admin/status", headers=admin_headers, timeout=30).content)
    finally:
        assert gateway.stop() == 0, gateway.output()
    outputs = {"client": b"\n".join(client), "gateway": b"\n".join(gateway.written())}
    assert b'"event":"request"' in outputs["gateway"]
    assert len(echo.posts) >= 4 * len(STATUSES)  # the providers were reached
    assert otlp.posts  # the exporter sent (and was refused)
    token = SECRETS["AWS_SESSION_TOKEN"].encode()  # botocore signed with the canaries
    signed = [p for p in echo.posts if p.header_values(b"x-amz-security-token") == [token]]
    assert len(signed) >= len(STATUSES)
    canaries = [*SECRETS.values(), TENANT_KEY, ADMIN_TOKEN, signing_key]
    found = [
        (name, canary, data[max(0, at - 300) : at + 60])
        for name, data in outputs.items()
        for canary in canaries
        if (at := data.upper().find(canary.upper().encode())) >= 0
    ]
    assert not found, found
