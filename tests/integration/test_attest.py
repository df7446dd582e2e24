"""Two-party receipts end to end: a simulator, `owngate attest` sidecars (processes) and a
gateway on loopback, then `owngate audit verify --backend-key` on what they wrote, and on
logs rewritten as a compromised gateway or backend host could (docs/provenance.md,
layer 3). Each tamper case must be caught with a message naming what is wrong.
"""

from __future__ import annotations

import base64
import copy
import json
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.provenance import commit, load_signer
from tests.helpers.attest import Sidecar, SidecarTLS, rewrite_log, start_sidecar
from tests.helpers.gateways import Gateway, Sim, backend, logged_gateway, served
from tests.helpers.provenance import completion_record, records, request_records, run_audit
from tests.helpers.real_backend.server import LlamaServer
from tests.helpers.tls import Pki

ORIGIN = "gw.test/attest"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


@pytest.fixture
def sim(start_sim: Callable[..., Sim]) -> Sim:
    return start_sim("vllm", models=("m",), zero_latency=True)


@pytest.fixture
def sidecars(tmp_path: Path) -> Iterator[Callable[..., Sidecar]]:
    """Start `owngate attest` processes in `tmp_path` (see `start_sidecar`); killed at
    the end if a test did not stop them."""
    started: list[Sidecar] = []

    def start(name: str, backend_url: str, **options: Any) -> Sidecar:
        sidecar = start_sidecar(tmp_path, name, backend_url, **options)
        started.append(sidecar)
        return sidecar

    yield start
    for sidecar in started:
        sidecar.process.kill()


def _gateway(
    start_gateway: Callable[..., Gateway], tmp_path: Path, backends: list[dict[str, Any]]
) -> Gateway:
    return logged_gateway(start_gateway, tmp_path, backends, ORIGIN)


def _attested(id: str, sidecar: Sidecar, key: str | None = None) -> dict[str, Any]:
    return backend(id, sidecar.url, "m", attest={"key": key or sidecar.vkey})


def _ask(gateway: Gateway, *, stream: bool = False, model: str = "m") -> httpx.Response:
    body = {**CHAT, "model": model, "stream": stream}
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers, timeout=30
    )
    assert response.status_code == 200, response.text
    return response


def _audit(tmp_path: Path, *extra: str, log: Path | None = None) -> int:
    return run_audit(["verify", str(log or tmp_path / "log"), "--key", _log_vkey(tmp_path), *extra])


def _log_vkey(tmp_path: Path) -> str:
    return load_signer(tmp_path / "log.key").vkey


def _key_id(vkey: str) -> str:
    return "+".join(vkey.split("+")[:2])


def _stream_receipt(text: str) -> bytes:
    line = next(line for line in text.splitlines() if line.startswith(": owngate-receipt "))
    return base64.b64decode(line.removeprefix(": owngate-receipt "))


def test_an_attested_answer_is_a_two_party_statement(
    sim: Sim,
    start_gateway: Callable[..., Gateway],
    sidecars: Callable[..., Sidecar],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sidecar = sidecars("gpu-a", sim.url)
    gateway = _gateway(start_gateway, tmp_path, [_attested("gpu", sidecar)])
    whole = _ask(gateway)
    streamed = _ask(gateway, stream=True)

    # The client's stream is the backend's, without the sidecar's comment line.
    assert ": owngate-attest" not in streamed.text
    assert "data: [DONE]" in streamed.text
    for response, receipt in (
        (whole, base64.b64decode(whole.headers["x-owngate-receipt"])),
        (streamed, _stream_receipt(streamed.text)),
    ):
        request_id = response.headers["x-request-id"]
        record = completion_record(tmp_path / "log", request_id)
        attestation = record["attestation"]
        assert attestation["failure"] is None and attestation["key"] == _key_id(sidecar.vkey)
        assert json.loads(receipt)["attestation"]["payloadType"].endswith("attestation+json")
        # Both parties committed to exactly the bytes the client got (before the receipt).
        seen = response.content.split(b": owngate-receipt ")[0]
        salt = bytes.fromhex(
            json.loads(base64.b64decode(json.loads(receipt)["payload"]))["salts"]["response"]
        )
        assert commit("response", salt, seen) == record["response_commitment"]
        path = tmp_path / f"{request_id}.receipt"
        path.write_bytes(receipt)
        (tmp_path / f"{request_id}.request").write_bytes(response.request.content)
        (tmp_path / f"{request_id}.response").write_bytes(seen)
        receipt_check = ["receipt", "verify", str(path), "--key", _log_vkey(tmp_path)]
        receipt_check += ["--backend-key", f"gpu={sidecar.vkey}", "--log", str(tmp_path / "log")]
        receipt_check += ["--request-body", str(tmp_path / f"{request_id}.request")]
        receipt_check += ["--response-body", str(tmp_path / f"{request_id}.response")]
        assert run_audit(receipt_check) == 0
        said = capsys.readouterr().out
        assert "countersigned by backend gpu's key" in said
        # The client alone (its receipt and its bytes) sees the backend signed exactly them.
        assert "ok: the backend countersigned this request body" in said
        assert "ok: the backend countersigned this response body" in said

    assert sidecar.stop() == 0
    assert (
        _audit(tmp_path, "--backend-key", f"gpu={sidecar.vkey}", "--attest-log", str(sidecar.log))
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "backend gpu: 2 answer(s) countersigned by its key; its sidecar's log (2 entries) agrees"
        in out
    )


def test_the_sidecar_is_the_backends_mutual_tls_endpoint(
    sim: Sim,
    start_gateway: Callable[..., Gateway],
    sidecars: Callable[..., Sidecar],
    tmp_path: Path,
) -> None:
    """All three layers on one connection: the gateway reaches the sidecar over mutual
    TLS with its key pinned, reads the backend's facts from its certificate, and gets each
    answer countersigned; a gateway without the client certificate gets nothing."""
    pki = Pki.create(tmp_path / "pki")
    cert = pki.server(region="eu-west-1", owner="test", retention="none")
    client_cert, client_key = pki.write("gateway", pki.client())
    ca = pki.directory / "ca.pem"
    probe = ssl.create_default_context(cafile=ca)
    probe.load_cert_chain(client_cert, client_key)
    sidecar = sidecars("gpu-a", sim.url, tls=SidecarTLS(pki.write("sidecar", cert), ca, probe))
    assert sidecar.url.startswith("https://")
    tls = {"ca_file": str(ca), "pin_spki_sha256": [cert.pin]}
    mutual = {**tls, "client_cert_file": str(client_cert), "client_key_file": str(client_key)}
    facts: dict[str, Any] = {
        "identity": "certificate",
        "retention": {"days": 0, "zero_data_retention": True},
    }

    def gpu(tls: dict[str, Any]) -> dict[str, Any]:
        return backend("gpu", sidecar.url, "m", tls=tls, attest={"key": sidecar.vkey}, **facts)

    gateway = _gateway(start_gateway, tmp_path, [gpu(mutual)])
    request_id = _ask(gateway).headers["x-request-id"]
    (dispatch,) = request_records(tmp_path / "log", request_id, "dispatch")
    assert dispatch["backend"]["peer"] == {"spki_sha256": cert.pin, "attested": True}
    attestation = completion_record(tmp_path / "log", request_id)["attestation"]
    assert attestation["failure"] is None and attestation["key"] == _key_id(sidecar.vkey)
    assert served(sim) == 1

    # Without a client certificate the sidecar completes no exchange: not the gateway's
    # request, not a direct one.
    (tmp_path / "anonymous").mkdir()
    anonymous = _gateway(start_gateway, tmp_path / "anonymous", [gpu(tls)])
    refused = httpx.post(
        f"{anonymous.url}/v1/chat/completions", json=CHAT, headers=anonymous.headers, timeout=30
    )
    assert refused.status_code == 503, refused.text
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{sidecar.url}/health", verify=ssl.create_default_context(cafile=ca))
    assert served(sim) == 1
    assert httpx.get(f"{sidecar.url}/health", verify=probe).status_code == 200


def _failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str, log: Path | None = None
) -> str:
    """Run `audit verify` expecting it to fail; what it said."""
    capsys.readouterr()
    assert _audit(tmp_path, *extra, log=log) == 1
    return capsys.readouterr().err


def _forge(tmp_path: Path, edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> Path:
    """The gateway's log rewritten by whoever holds the gateway's key."""
    forged = tmp_path / "forged"
    rewrite_log(tmp_path / "log", forged, tmp_path / "log.key", ORIGIN, edit)
    return forged


def _served(gateway: Gateway, tmp_path: Path, *models: str) -> list[str]:
    """Ask once per model; the request ids, once their completions are signed."""
    ids = [_ask(gateway, model=model).headers["x-request-id"] for model in models]
    for request_id in ids:
        completion_record(tmp_path / "log", request_id)
    return ids


def test_a_backend_that_did_not_countersign_is_not_claimed(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    sidecars: Callable[..., Sidecar],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Tamper case 1, gateway claims backend A but B countersigned: forged (a record
    rewritten to name A) and live (a base_url that leads to B's sidecar)."""
    sim = start_sim("vllm", models=("m", "n"), zero_latency=True)
    a, b = sidecars("gpu-a", sim.url), sidecars("gpu-b", sim.url)
    gateway = _gateway(
        start_gateway,
        tmp_path,
        [_attested("a", a), backend("b", b.url, "n", attest={"key": b.vkey})],
    )
    _, via_b = _served(gateway, tmp_path, "m", "n")
    keys = ("--backend-key", f"a={a.vkey}", "--backend-key", f"b={b.vkey}")
    assert _audit(tmp_path, *keys) == 0

    claimed_a = next(
        r["backend"] for r in records(tmp_path / "log") if r.get("backend", {}).get("id") == "a"
    )
    forged = _forge(
        tmp_path,
        lambda entries: [
            {**r, "backend": claimed_a}
            if r["type"] == "dispatch" and r["request_id"] == via_b
            else r
            for r in entries
        ],
    )
    said = _failed(tmp_path, capsys, *keys, log=forged)
    assert (
        f"request {via_b!r} (backend a): countersigned by key {_key_id(b.vkey)}, "
        "not by backend a's key" in said
    )

    # Another gateway declares A, but A's base_url leads to B's sidecar (a typo, a DNS
    # change). (One gateway cannot hold both: two attested backends with one key are
    # refused, since either one's answers would pass for the other's.)
    wrong = tmp_path / "misrouted"
    wrong.mkdir()
    misrouting = _gateway(start_gateway, wrong, [backend("a", b.url, "m", attest={"key": a.vkey})])
    (misrouted,) = _served(misrouting, wrong, "m")
    assert completion_record(wrong / "log", misrouted)["attestation"] == {
        "key": _key_id(a.vkey),
        "counter": None,
        "time": None,
        "sig": None,
        "failure": "wrong_key",
    }
    metrics = httpx.get(f"{misrouting.url}/metrics", timeout=10).text
    assert 'owngate_attestations_total{backend="a",result="wrong_key"} 1.0' in metrics
    said = _failed(wrong, capsys, "--backend-key", f"a={a.vkey}")
    assert (
        f"request {misrouted!r} (backend a): the log says backend a served it, but the "
        f"record carries no countersignature by {_key_id(a.vkey)} (the gateway recorded failure "
        "wrong_key)" in said
    )


def test_an_answer_changed_after_the_countersignature_is_caught(
    sim: Sim,
    start_gateway: Callable[..., Gateway],
    sidecars: Callable[..., Sidecar],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Tamper case 2: the gateway's record commits to another answer than the one the
    backend countersigned (a gateway that changed what the client got, and logged that)."""
    sidecar = sidecars("gpu", sim.url)
    gateway = _gateway(start_gateway, tmp_path, [_attested("gpu", sidecar)])
    (_, second) = _served(gateway, tmp_path, "m", "m")
    forged = _forge(
        tmp_path,
        lambda entries: [
            {**r, "response_commitment": "0" * 64}
            if r["type"] == "completion" and r["request_id"] == second
            else r
            for r in entries
        ],
    )
    said = _failed(tmp_path, capsys, "--backend-key", f"gpu={sidecar.vkey}", log=forged)
    assert (
        f"request {second!r} (backend gpu): backend gpu's countersignature does not verify over "
        "the request id and commitments this log records (the request or response was changed "
        "after it was signed" in said
    )


def test_an_answer_logged_without_its_response_commitment_is_still_claimed(
    sim: Sim,
    start_gateway: Callable[..., Gateway],
    sidecars: Callable[..., Sidecar],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A gateway that answered 200 but logs no response commitment and no attestation
    (what it would write for an answer that came from somewhere else) still says backend
    gpu served it: the record must carry gpu's countersignature like any other answer."""
    sidecar = sidecars("gpu", sim.url)
    gateway = _gateway(start_gateway, tmp_path, [_attested("gpu", sidecar)])
    (_, second) = _served(gateway, tmp_path, "m", "m")

    def hide(record: dict[str, Any]) -> dict[str, Any]:
        hidden = {k: v for k, v in record.items() if k != "attestation"}
        return {**hidden, "response_commitment": None}

    forged = _forge(
        tmp_path,
        lambda entries: [
            hide(r) if r["type"] == "completion" and r["request_id"] == second else r
            for r in entries
        ],
    )
    assert _audit(tmp_path, log=forged) == 0  # a well-formed log of its own
    said = _failed(tmp_path, capsys, "--backend-key", f"gpu={sidecar.vkey}", log=forged)
    assert (
        f"request {second!r} (backend gpu): the log says backend gpu served it, but the record "
        "carries no countersignature" in said
    )


def test_the_sidecar_log_and_the_gateway_log_must_agree(
    sim: Sim,
    start_gateway: Callable[..., Gateway],
    sidecars: Callable[..., Sidecar],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Tamper case 3, an entry missing from the sidecar's log (a backend host hiding that
    it served a request), and the other way round: a request the sidecar served that the
    gateway's log does not have (someone bypassing the gateway)."""
    sidecar = sidecars("gpu", sim.url)
    gateway = _gateway(start_gateway, tmp_path, [_attested("gpu", sidecar)])
    (first, _) = _served(gateway, tmp_path, "m", "m")
    bypass = httpx.post(f"{sidecar.url}/v1/chat/completions", json=CHAT, timeout=30)
    assert bypass.status_code == 200 and "x-owngate-attest" in bypass.headers
    assert sidecar.stop() == 0
    keys = ("--backend-key", f"gpu={sidecar.vkey}")

    said = _failed(tmp_path, capsys, *keys, "--attest-log", str(sidecar.log))
    assert "the sidecar countersigned request 'attest-" in said
    assert "which the gateway's log never dispatched to backend gpu" in said

    hidden = tmp_path / "hidden"
    rewrite_log(
        sidecar.log,
        hidden,
        sidecar.key_file,
        "gpu",
        lambda entries: [r for r in entries if r["request_id"] != first][:1],
    )
    said = _failed(tmp_path, capsys, *keys, "--attest-log", str(hidden))
    assert (
        f"the gateway's log records request {first!r} as countersigned by backend gpu "
        "(counter 0), but the sidecar's log" in said
    )
    assert "an entry is missing from the sidecar's log (1 in all)" in said


def test_a_request_that_bypassed_the_gateway_with_a_dispatched_id_is_caught(
    sim: Sim,
    start_gateway: Callable[..., Gateway],
    sidecars: Callable[..., Sidecar],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A client of the gateway knows its own request id: sent straight to a sidecar
    without mutual TLS under that id, its request is countersigned and logged. The
    cross-check must not take that statement for one of the gateway's that it did not
    accept (the client left): the gateway dispatched that id there once, not twice."""
    sidecar = sidecars("gpu", sim.url)
    gateway = _gateway(start_gateway, tmp_path, [_attested("gpu", sidecar)])
    (first,) = _served(gateway, tmp_path, "m")
    bypass = httpx.post(
        f"{sidecar.url}/v1/chat/completions", json=CHAT, headers={"x-request-id": first}, timeout=30
    )
    assert bypass.status_code == 200 and "x-owngate-attest" in bypass.headers
    assert sidecar.stop() == 0
    said = _failed(
        tmp_path, capsys, "--backend-key", f"gpu={sidecar.vkey}", "--attest-log", str(sidecar.log)
    )
    assert f"the sidecar countersigned request {first!r} (counter 1)" in said
    assert "more often than the gateway's log dispatched it to backend gpu (1)" in said


def test_a_replayed_countersignature_is_caught(
    sim: Sim,
    start_gateway: Callable[..., Gateway],
    sidecars: Callable[..., Sidecar],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Tamper case 4: one countersignature for two requests. Forged: a served request
    logged twice; live: a sidecar that lost its log and counts from 0 again."""
    sidecar = sidecars("gpu", sim.url)
    gateway = _gateway(start_gateway, tmp_path, [_attested("gpu", sidecar)])
    (first,) = _served(gateway, tmp_path, "m")
    keys = ("--backend-key", f"gpu={sidecar.vkey}")
    twice = _forge(
        tmp_path,
        lambda entries: entries + [copy.deepcopy(r) for r in entries if r["request_id"] == first],
    )
    said = _failed(tmp_path, capsys, *keys, log=twice)
    assert (
        f"request {first!r} (backend gpu): counter 0 of key {_key_id(sidecar.vkey)} was already "
        f"used for request {first!r}: a replayed countersignature" in said
    )

    assert sidecar.stop() == 0
    fresh = start_sidecar(
        tmp_path, "gpu", sim.url, log=tmp_path / "fresh-log", port=sidecar.process.port
    )
    (again,) = _served(gateway, tmp_path, "m")
    assert completion_record(tmp_path / "log", again)["attestation"]["failure"] == "replayed"
    said = _failed(tmp_path, capsys, *keys)
    assert f"request {again!r} (backend gpu)" in said and "failure replayed" in said
    fresh.stop()


@pytest.mark.real_backend
def test_a_real_llamacpp_server_countersigns_through_its_sidecar(
    real_llamacpp: LlamaServer,
    start_gateway: Callable[..., Gateway],
    sidecars: Callable[..., Sidecar],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The sidecar in front of a real llama.cpp `llama-server`: whole answers and streams
    come back countersigned and the two logs agree."""
    sidecar = sidecars("cpu-llama", real_llamacpp.base_url)
    attested = backend(
        "cpu-llama", sidecar.url, real_llamacpp.alias, kind="llamacpp", attest={"key": sidecar.vkey}
    )
    gateway = _gateway(start_gateway, tmp_path, [attested])
    ids = [
        _ask(gateway, model=real_llamacpp.alias, stream=stream).headers["x-request-id"]
        for stream in (False, True)
    ]
    for request_id in ids:
        assert completion_record(tmp_path / "log", request_id)["attestation"]["failure"] is None
    assert sidecar.stop() == 0
    keys = ("--backend-key", f"cpu-llama={sidecar.vkey}", "--attest-log", str(sidecar.log))
    assert _audit(tmp_path, *keys) == 0
    assert "backend cpu-llama: 2 answer(s) countersigned" in capsys.readouterr().out


def test_nothing_is_countersigned_for_a_client_that_left(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    sidecars: Callable[..., Sidecar],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A client that leaves mid-stream: the gateway drops the sidecar's connection, the
    sidecar drops the backend's and signs nothing; the logs still agree."""
    slow = start_sim("vllm", models=("m",), decode_tokens_per_s=20.0)
    sidecar = sidecars("gpu", slow.url)
    gateway = _gateway(start_gateway, tmp_path, [_attested("gpu", sidecar)])
    body = {**CHAT, "stream": True, "max_tokens": 400}  # some 20 s of decoding
    with httpx.stream(
        "POST", f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers
    ) as response:
        request_id = response.headers["x-request-id"]
        next(response.iter_raw())  # the first chunk, then the client leaves
    assert completion_record(tmp_path / "log", request_id)["status"] == 499
    assert sidecar.stop() == 0
    assert records(sidecar.log) == []
    keys = ("--backend-key", f"gpu={sidecar.vkey}", "--attest-log", str(sidecar.log))
    assert _audit(tmp_path, *keys) == 0
