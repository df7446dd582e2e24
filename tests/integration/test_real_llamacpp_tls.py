"""The gateway in front of a real llama.cpp `llama-server` over authenticated TLS: the
server behind the test TLS front (tests/helpers/tls.py; the PyPI build of llama-server
has no TLS of its own), certificates from `gateway.pki`, key pinned, facts attested; and
behind its `owngate attest` sidecar as the mutual-TLS endpoint, all three layers at once."""

from __future__ import annotations

import base64
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from gateway.provenance import load_signer, write_signing_key
from tests.helpers.attest import SidecarTLS, start_sidecar
from tests.helpers.gateways import Gateway, backend, logged_gateway
from tests.helpers.provenance import completion_record, request_records, run_audit
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


def test_a_real_llama_server_behind_its_sidecar_over_mutual_tls_gives_two_party_receipts(
    real_llamacpp: LlamaServer,
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    # The sidecar terminates mutual TLS in front of the real server (its certificate
    # states the facts, its key pinned; the gateway's client certificate pinned on the
    # sidecar), and countersigns: each record names the sidecar's key as the peer,
    # attested, and carries an accepted countersignature; both audits and each client's
    # receipt check pass with the backend's key.
    pki = Pki.create(tmp_path / "pki")
    cert = pki.server(region="eu-west-1", owner="test", retention="none")
    client = pki.client()
    client_cert, client_key = pki.write("gateway", client)
    ca = pki.directory / "ca.pem"
    probe = ssl.create_default_context(cafile=ca)
    probe.load_cert_chain(client_cert, client_key)
    sidecar = start_sidecar(
        tmp_path / "sidecar",
        "cpu-llama",
        real_llamacpp.base_url,
        tls=SidecarTLS(pki.write("sidecar", cert), ca, probe),
        client_pins=[client.pin],
    )
    try:
        tls = {
            "ca_file": str(ca),
            "client_cert_file": str(client_cert),
            "client_key_file": str(client_key),
            "pin_spki_sha256": [cert.pin],
        }
        attested = backend(
            "cpu-llama",
            sidecar.url,
            real_llamacpp.alias,
            kind="llamacpp",
            tls=tls,
            identity="certificate",
            retention={"days": 0, "zero_data_retention": True},
            attest={"key": sidecar.vkey},
        )
        gateway = logged_gateway(start_gateway, tmp_path, [attested], "test.owngate/tls-llama/2")
        answers = []
        for stream in (False, True):
            body = {
                "model": real_llamacpp.alias,
                "messages": [{"role": "user", "content": "Hello"}],
                "max_tokens": 4,
                "stream": stream,
            }
            answer = httpx.post(
                f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers, timeout=60
            )
            assert answer.status_code == 200, answer.text
            answers.append(answer)
    finally:
        assert sidecar.stop() == 0
    log, log_key = tmp_path / "log", load_signer(tmp_path / "log.key").vkey
    for answer in answers:
        request_id = answer.headers["x-request-id"]
        (dispatch,) = request_records(log, request_id, "dispatch")
        assert dispatch["backend"]["peer"] == {"spki_sha256": cert.pin, "attested": True}
        assert completion_record(log, request_id)["attestation"]["failure"] is None
    keys = ["--backend-key", f"cpu-llama={sidecar.vkey}"]
    verify = ["verify", str(log), "--key", log_key, *keys]
    assert run_audit([*verify, "--attest-log", f"cpu-llama={sidecar.log}"]) == 0
    whole, streamed = answers
    (tmp_path / "whole.json").write_bytes(whole.content)
    (tmp_path / "whole-receipt.json").write_bytes(
        base64.b64decode(whole.headers["x-owngate-receipt"])
    )
    check = ["receipt", "verify", str(tmp_path / "whole-receipt.json"), "--key", log_key]
    check += ["--log", str(log), *keys, "--response-body", str(tmp_path / "whole.json")]
    assert run_audit(check) == 0
    assert b": owngate-attest" not in streamed.content
