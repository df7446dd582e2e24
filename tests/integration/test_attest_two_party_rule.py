"""Issue 15's acceptance check played by an independent verifier: a demo-like run (a
gateway reaching an `owngate attest` sidecar over mutual TLS with its key pinned and
`identity: certificate`, whole answers and streams) checked with docs/provenance.md's
recipes and audit rule written from the page alone (tests/helpers/two_party_rule.py,
receipts with the page's own recipe code), and `owngate audit verify --backend-key
--attest-log` must give the same verdict on it and on each log a gateway holding its
key could write instead (tests/helpers/attest.rewrite_log).
"""

from __future__ import annotations

import base64
import copy
import json
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.provenance import load_signer
from tests.helpers.attest import CHAT, SidecarTLS, rewrite_log, start_sidecar
from tests.helpers.c2sp_verifier import from_directory, note_key, read_log
from tests.helpers.doc_recipes import provenance_recipes
from tests.helpers.gateways import Gateway, Sim, backend, logged_gateway
from tests.helpers.provenance import completion_record, run_audit
from tests.helpers.tls import Pki
from tests.helpers.two_party_rule import Verdict, two_party_verdict

ORIGIN = "gw.test/two-party-rule"
Records = list[dict[str, Any]]


def _receipt(response: httpx.Response) -> bytes:
    if "x-owngate-receipt" in response.headers:
        return base64.b64decode(response.headers["x-owngate-receipt"])
    line = next(
        line for line in response.text.splitlines() if line.startswith(": owngate-receipt ")
    )
    return base64.b64decode(line.removeprefix(": owngate-receipt "))


def _completion_of(records: Records, request_id: str) -> dict[str, Any]:
    return next(r for r in records if r["type"] == "completion" and r["request_id"] == request_id)


def _unattested(status: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def edit(record: dict[str, Any]) -> dict[str, Any]:
        kept = {name: value for name, value in record.items() if name != "attestation"}
        return {**kept, "status": status}

    return edit


def _forgeries(ids: list[str]) -> dict[str, Callable[[Records], Records]]:
    """Logs a gateway holding the log key could write instead, by name."""

    def on(
        request_id: str, edit: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> Callable[[Records], Records]:
        def forge(records: Records) -> Records:
            return [
                edit(copy.deepcopy(r))
                if r["type"] == "completion" and r["request_id"] == request_id
                else r
                for r in records
            ]

        return forge

    def borrowed(records: Records) -> Records:  # the first answer's countersignature twice
        first = _completion_of(records, ids[0])["attestation"]
        return on(ids[1], lambda r: {**r, "attestation": first})(records)

    def renamed(records: Records) -> Records:  # a dispatch names another backend
        return [
            {**r, "backend": {**r["backend"], "id": "gpu-other"}}
            if r["type"] == "dispatch" and r["request_id"] == ids[2]
            else r
            for r in records
        ]

    return {
        "changed-response": on(ids[1], lambda r: {**r, "response_commitment": "0" * 64}),
        "no-countersignature": on(ids[2], _unattested(200)),
        "as-399": on(ids[2], _unattested(399)),
        "as-error-502": on(ids[3], _unattested(502)),  # docs: counted, not a failure
        "as-error-499": on(ids[0], _unattested(499)),
        "borrowed": borrowed,
        "renamed": renamed,
    }


def _owngate(log: Path, vkey: str, sidecar_vkey: str, sidecar_log: Path) -> int:
    argv = ["verify", str(log), "--key", vkey, "--backend-key", f"gpu={sidecar_vkey}"]
    return run_audit([*argv, "--attest-log", f"gpu={sidecar_log}"])


def _independent(log: Path, vkey: str, sidecar_vkey: str, sidecar_log: Path) -> Verdict:
    _, gateway_entries = read_log(from_directory(log), [note_key(vkey)], ORIGIN)
    _, sidecar_entries = read_log(from_directory(sidecar_log), [note_key(sidecar_vkey)], "gpu")
    return two_party_verdict(gateway_entries, sidecar_entries, "gpu", sidecar_vkey)


def test_an_independent_verifier_and_audit_verify_agree_on_a_demo_like_run(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    pki = Pki.create(tmp_path / "pki")
    cert = pki.server(region="eu-west-1", owner="test", retention="none")
    client_cert, client_key = pki.write("gateway", pki.client())
    ca = pki.directory / "ca.pem"
    probe = ssl.create_default_context(cafile=ca)
    probe.load_cert_chain(client_cert, client_key)
    tls = SidecarTLS(pki.write("sidecar", cert), ca, probe)
    sidecar = start_sidecar(tmp_path, "gpu", sim.url, tls=tls)
    mutual = {
        "ca_file": str(ca),
        "pin_spki_sha256": [cert.pin],
        "client_cert_file": str(client_cert),
        "client_key_file": str(client_key),
    }
    gpu = backend(
        "gpu",
        sidecar.url,
        "m",
        tls=mutual,
        attest={"key": sidecar.vkey},
        identity="certificate",
        retention={"days": 0, "zero_data_retention": True},
    )
    verify = provenance_recipes()["verify_countersignature"]
    try:
        gateway = logged_gateway(start_gateway, tmp_path, [gpu], ORIGIN)
        log_vkey = load_signer(tmp_path / "log.key").vkey
        ids = []
        for stream in (False, True, False, True):
            sent = json.dumps({**CHAT, "stream": stream}).encode()
            response = httpx.post(
                f"{gateway.url}/v1/chat/completions",
                content=sent,
                headers={**gateway.headers, "content-type": "application/json"},
                timeout=30,
            )
            assert response.status_code == 200, response.text
            # the client's own check, with the docs' recipe: the backend's statement over
            # exactly the bytes it sent and received
            statement = verify(
                _receipt(response), log_vkey, {"gpu": sidecar.vkey}, sent, response.content
            )
            assert statement["request_id"] == response.headers["x-request-id"]
            ids.append(response.headers["x-request-id"])
        for request_id in ids:
            completion_record(tmp_path / "log", request_id)
    finally:
        assert sidecar.stop() == 0

    truth = _independent(tmp_path / "log", log_vkey, sidecar.vkey, sidecar.log)
    assert truth.problems == [] and truth.carried == 4 and truth.uncarried == 0
    assert _owngate(tmp_path / "log", log_vkey, sidecar.vkey, sidecar.log) == 0

    verdicts = {}
    for name, forge in _forgeries(ids).items():
        forged = tmp_path / f"forged-{name}"
        rewrite_log(tmp_path / "log", forged, tmp_path / "log.key", ORIGIN, forge)
        independent = _independent(forged, log_vkey, sidecar.vkey, sidecar.log)
        capsys.readouterr()
        owngate = _owngate(forged, log_vkey, sidecar.vkey, sidecar.log)
        said = capsys.readouterr()
        verdicts[name] = (independent.ok, owngate == 0)
        assert independent.ok == (owngate == 0), (name, independent, said)
    assert verdicts == {
        "changed-response": (False, False),
        "no-countersignature": (False, False),
        "as-399": (False, False),
        "as-error-502": (True, True),
        "as-error-499": (True, True),
        "borrowed": (False, False),
        "renamed": (False, False),
    }
