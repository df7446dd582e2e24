"""The gateway in front of a real llama.cpp `llama-server` over authenticated TLS: the
server behind the test TLS front (tests/helpers/tls.py; the PyPI build of llama-server
has no TLS of its own), certificates from `gateway.pki`, key pinned, facts attested."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from gateway.provenance import write_signing_key
from tests.helpers.gateways import Gateway, backend
from tests.helpers.provenance import request_records
from tests.helpers.real_backend.server import LlamaServer
from tests.helpers.tls import Pki, TLSFront, server_context

pytestmark = pytest.mark.real_backend


@pytest.fixture
def front(real_llamacpp: LlamaServer, tmp_path: Path) -> Iterator[tuple[TLSFront, Pki, str]]:
    pki = Pki.create(tmp_path / "pki")
    cert = pki.server(region="eu-west-1", owner="test", retention="0d")
    relay = TLSFront(("127.0.0.1", real_llamacpp.port), server_context(pki, cert)).start()
    try:
        yield relay, pki, cert.pin
    finally:
        relay.stop()


def test_a_real_llama_server_behind_pinned_attested_tls(
    front: tuple[TLSFront, Pki, str],
    real_llamacpp: LlamaServer,
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    relay, pki, pin = front
    write_signing_key(tmp_path / "log.key", "test.owngate/tls-llama/1")
    tls = {"ca_file": str(pki.directory / "ca.pem"), "pin_spki_sha256": [pin]}
    gateway = start_gateway(
        [
            backend(
                "cpu-llama",
                relay.url,
                real_llamacpp.alias,
                kind="llamacpp",
                tls=tls,
                identity="certificate",
            )
        ],
        scrape={"interval_s": 60, "staleness_s": 120},  # one probe, at the start
        provenance={
            "dir": str(tmp_path / "log"),
            "origin": "test.owngate/tls-llama/1",
            "signing_key_file": str(tmp_path / "log.key"),
            "checkpoint_interval_ms": 20,
        },
    )
    body = {
        "model": real_llamacpp.alias,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 4,
    }
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers, timeout=60
    )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]
    dispatch = request_records(tmp_path / "log", response.headers["x-request-id"], "dispatch")[0]
    assert dispatch["backend"]["peer"] == {"spki_sha256": pin, "attested": True}
    assert relay.handshakes >= 1

    relay.swap(server_context(pki, pki.server(region="eu-west-1", owner="test", retention="0d")))
    refused = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers, timeout=60
    )
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "backend_unavailable"
    assert "cpu-llama" not in refused.json()["error"]["message"]  # the operator's, not the client's
