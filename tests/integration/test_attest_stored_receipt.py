"""The receipt a client fetches again (`GET /v1/provenance/receipts/{id}`) of an answer an
attested backend countersigned is the two-party statement its answer carried: the
backend's countersignature is in it, and it verifies with `--backend-key` and the
client's own bytes exactly as the receipt in the answer does (issue 15: "every receipt it
hands out verifies as a two-party statement").

Before, the kept receipt was the one signed at dispatch, before the answer: `owngate
audit receipt verify --backend-key` refused it (`backend gpu is attested, but the receipt
carries no countersignature`), although the answer's own receipt and the log's completion
record carried the countersignature.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.provenance import load_signer
from tests.helpers.attest import Sidecar, start_sidecar
from tests.helpers.gateways import Gateway, Sim, backend, logged_gateway
from tests.helpers.provenance import completion_record, run_audit

ORIGIN = "gw.test/attest-stored"


@pytest.fixture
def sidecar(start_sim: Callable[..., Sim], tmp_path: Path) -> Iterator[Sidecar]:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    started = start_sidecar(tmp_path, "gpu-a", sim.url)
    yield started
    started.process.kill()


def _answer_receipt(response: httpx.Response) -> bytes:
    if "x-owngate-receipt" in response.headers:
        return base64.b64decode(response.headers["x-owngate-receipt"])
    line = next(x for x in response.text.splitlines() if x.startswith(": owngate-receipt "))
    return base64.b64decode(line.removeprefix(": owngate-receipt "))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_fetched_receipt_of_a_countersigned_answer_is_two_party(
    stream: bool,
    sidecar: Sidecar,
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    attested = backend("gpu", sidecar.url, "m", attest={"key": sidecar.vkey})
    gateway = logged_gateway(start_gateway, tmp_path, [attested], ORIGIN)
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    answer = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={**body, "stream": stream},
        headers=gateway.headers,
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    request_id = answer.headers["x-request-id"]
    # The completion record (which accepted the countersignature) is in the log.
    assert completion_record(tmp_path / "log", request_id)["attestation"]["failure"] is None

    fetched = httpx.get(
        f"{gateway.url}/v1/provenance/receipts/{request_id}", headers=gateway.headers, timeout=30
    )
    assert fetched.status_code == 200, fetched.text
    carried = json.loads(_answer_receipt(answer))["attestation"]
    assert json.loads(fetched.content).get("attestation") == carried

    (tmp_path / "receipt.json").write_bytes(fetched.content)
    (tmp_path / "request.json").write_bytes(answer.request.content)
    (tmp_path / "response.bin").write_bytes(answer.content)
    check = ["receipt", "verify", str(tmp_path / "receipt.json")]
    check += ["--key", load_signer(tmp_path / "log.key").vkey, "--log", str(tmp_path / "log")]
    check += ["--backend-key", f"gpu={sidecar.vkey}"]
    check += ["--request-body", str(tmp_path / "request.json")]
    check += ["--response-body", str(tmp_path / "response.bin")]
    capsys.readouterr()
    assert run_audit(check) == 0, capsys.readouterr()
    said = capsys.readouterr().out
    assert "ok: the backend countersigned this response body" in said
    assert "its completion, recorded this countersignature" in said
