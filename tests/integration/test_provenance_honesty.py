"""The log tells what the client saw, over real sockets (issue 12, items 10 and 11).

- A refusal is recorded as data: the refusing decision's rule and per-backend trace, and
  the commitment to the request body, which the client's receipt opens.
- A request that was dispatched and then failed has completion records only, never also
  a refusal, and the client gets the backend's failure (not a 503 blaming the policy).
- The last record of every request has the status the client got: read back with the
  project's reader after the log verifies, over a set of scenarios.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.api import GatewayApp
from gateway.app import create_app
from gateway.cli.main import main
from gateway.errors import ErrorCode
from gateway.provenance import (
    LogDirectory,
    load_verifiers,
    verify_commitment,
    verify_log,
    verify_receipt,
    write_signing_key,
)
from gateway.serving import ServerThread
from gateway.sim import Faults
from tests.helpers.gateways import EU_ZERO, TENANT_KEY, Sim, backend, gateway_config, hosted_backend
from tests.helpers.net import free_port
from tests.helpers.waiting import until

ORIGIN = "test.owngate/log/honesty"
POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: eu, version: "1"}
spec:
  tenants: [acme]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback:
    mode: when_private_unavailable
    to: [{backend: hosted-503}, {backend: hosted-ok}]
  data_classes:
    phi:
      fallback: {mode: never}
"""


@dataclass
class Logged:
    app: GatewayApp
    server: ServerThread
    log_dir: Path
    vkey: str

    @property
    def url(self) -> str:
        return self.server.url

    def post(
        self, model: str, *, data_class: str | None = None, timeout: float = 30
    ) -> tuple[httpx.Response, bytes]:
        headers = {"authorization": f"Bearer {TENANT_KEY}"}
        if data_class is not None:
            headers["x-data-class"] = data_class
        body = orjson.dumps(
            {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        )
        response = httpx.post(
            f"{self.url}/v1/chat/completions", content=body, headers=headers, timeout=timeout
        )
        return response, body

    def records(self) -> list[tuple[int, dict[str, Any]]]:
        """Every record, once the log verifies (stop the server first: the final
        checkpoint covers them all)."""
        summary = verify_log(self.log_dir, load_verifiers([self.vkey]))
        assert summary.unsigned_entries == 0
        return [(i, r.data) for i, r in LogDirectory(self.log_dir).records(summary.size)]


@pytest.fixture
def logged_gateway(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> Iterator[Callable[[list[dict[str, Any]]], Logged]]:
    started: list[ServerThread] = []

    def start(backends: list[dict[str, Any]], **extra: Any) -> Logged:
        vkey = write_signing_key(tmp_path / "log.key", ORIGIN)
        policies = tmp_path / "policies"
        policies.mkdir(exist_ok=True)
        (policies / "policy.yaml").write_text(POLICY)
        config = gateway_config(
            backends,
            policy={"paths": ["policies"]},
            provenance={"dir": "log", "origin": ORIGIN, "signing_key_file": "log.key"},
            **extra,
        )
        app = create_app(config, environ={"HOSTED_KEY": "k"}, config_dir=tmp_path)
        server = ServerThread(app).start()
        started.append(server)
        return Logged(app, server, tmp_path / "log", vkey)

    yield start
    for server in started:
        server.stop()


def _receipt(response: httpx.Response, vkey: str) -> Any:
    envelope = base64.b64decode(response.headers["x-owngate-receipt"])
    return verify_receipt(envelope, load_verifiers([vkey]))


def test_refusals_keep_the_decision_trace_and_the_request_commitment(
    start_sim: Callable[..., Sim],
    logged_gateway: Callable[..., Logged],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    us = start_sim("vllm", models=("m", "us-only"), zero_latency=True)
    gateway = logged_gateway(
        [
            # Admitted by the policy, but down (nothing listens): no compliant backend.
            backend("gpu-eu", f"http://127.0.0.1:{free_port()}", "m", **EU_ZERO),
            backend("gpu-us", us.url, "m", "us-only", region="us-east-1"),
        ],
    )
    denied, denied_body = gateway.post("us-only")
    unknown, unknown_body = gateway.post("m", data_class="bogus")
    unavailable, unavailable_body = gateway.post("m", data_class="phi")
    gateway.server.stop()
    # `us-only` is not in acme's `/v1/models` (the policy refuses it unlabelled): the 404
    # of a model that does not exist, its record naming the rule (docs/security.md).
    assert (denied.status_code, unknown.status_code, unavailable.status_code) == (404, 400, 503)
    assert us.app.captured("/v1/chat/completions") == []  # nothing went anywhere

    records = dict(gateway.records())
    assert [r["type"] for r in records.values()] == ["refusal"] * 3
    expected = {
        "model_not_found": (denied, denied_body, "eu/residency", {("gpu-us", "excluded")}),
        "unknown_data_class": (
            unknown,
            unknown_body,
            "eu/data_classes",
            {("gpu-eu", "excluded"), ("gpu-us", "excluded")},
        ),
        "no_compliant_backend": (
            unavailable,
            unavailable_body,
            "eu/data_classes.phi/fallback",
            {("gpu-eu", "admitted"), ("gpu-us", "excluded")},
        ),
    }
    for index, record in records.items():
        response, body, rule, verdicts = expected[record["reason"]]
        assert response.json()["error"]["code"] == record["reason"]
        assert record["request_id"] == response.headers["x-request-id"]
        assert record["rule"] == rule
        assert {(t["backend"], t["verdict"]) for t in record["trace"]} == verdicts
        assert all(t["rule"] for t in record["trace"])
        # The client's receipt names the refusal record and opens its commitment.
        receipt = _receipt(response, gateway.vkey)
        assert (receipt.index, receipt.backend) == (index, "")
        verify_commitment("request", record["request_commitment"], receipt.salts.request, body)
        # ... as the audit CLI checks it: the log holds it, and its salt opens the body.
        saved, body_file = tmp_path / f"{index}.receipt", tmp_path / f"{index}.json"
        saved.write_bytes(base64.b64decode(response.headers["x-owngate-receipt"]))
        body_file.write_bytes(body)
        log, key = str(gateway.log_dir), gateway.vkey
        assert main(["audit", "receipt", "verify", str(saved), "--key", key, "--log", log]) == 0
        assert "refusal entry" in capsys.readouterr().out
        opened = ["audit", "open", str(body_file), "--receipt", str(saved), "--log", log]
        assert main([*opened, "--key", key]) == 0


@dataclass(frozen=True)
class Seen:
    """What the client saw of one request."""

    request_id: str | None  # None: the client left before any answer
    status: int


def test_the_last_record_of_every_request_has_the_status_the_client_got(
    start_sim: Callable[..., Sim], logged_gateway: Callable[..., Logged]
) -> None:
    healthy = start_sim("vllm", models=("ok", "rescued"), zero_latency=True)
    dying = start_sim(
        "vllm",
        models=("flaky", "rescued"),
        zero_latency=True,
        faults=Faults(die_mid_stream_rate=1.0),
    )
    hanging = start_sim("vllm", models=("slow",), faults=Faults(hang_rate=1.0))
    loading = start_sim(  # a provider answering 503 to every completion
        "vllm", models=("flaky", "hosted-only"), faults=Faults(slow_start_s=3600.0)
    )
    gateway = logged_gateway(
        [
            backend("gpu", healthy.url, "ok", **EU_ZERO),
            backend("dies", dying.url, "flaky", **EU_ZERO),
            backend("dies-too", dying.url, "rescued", **EU_ZERO),
            backend("hangs", hanging.url, "slow", **EU_ZERO),
            backend("gpu-us", healthy.url, "us-only", region="us-east-1"),
            hosted_backend("hosted-503", f"{loading.url}/v1", "flaky", "hosted-only"),
            hosted_backend("hosted-ok", f"{healthy.url}/v1", "rescued"),
        ],
        limits={"first_byte_timeout_s": 60.0},
    )
    seen: dict[str, Seen] = {}

    def ask(name: str, model: str, data_class: str | None = None) -> httpx.Response:
        response, _ = gateway.post(model, data_class=data_class)
        seen[name] = Seen(response.headers["x-request-id"], response.status_code)
        return response

    assert ask("success", "ok").status_code == 200
    never = ask("private fails, fallback never", "flaky", "phi")
    assert (never.status_code, never.json()["error"]["code"]) == (503, "backend_unavailable")
    both = ask("private fails, hosted fails", "flaky")
    assert (both.status_code, both.json()["error"]["code"]) == (503, "backend_unavailable")
    assert ask("hosted answers 503", "hosted-only").status_code == 503
    assert ask("private fails, hosted serves", "rescued").status_code == 200
    assert ask("policy denied", "us-only").status_code == 404  # a model acme cannot see
    assert ask("unknown data class", "ok", "bogus").status_code == 400
    with pytest.raises(httpx.ReadTimeout):  # the client leaves while the backend hangs
        gateway.post("slow", timeout=0.5)
    seen["client disconnect"] = Seen(None, 499)  # the gateway's status for it (nginx's)
    until(lambda: not gateway.app.serving, "the gateway seeing the client leave", timeout=30.0)
    gateway.server.stop()

    by_request: dict[str, list[dict[str, Any]]] = {}
    for _, record in gateway.records():
        by_request.setdefault(record["request_id"], []).append(record)
    for request_id, records in by_request.items():
        kinds = {r["type"] for r in records}
        assert not {"dispatch", "refusal"} <= kinds, f"{request_id}: dispatched and refused"
    (left,) = [i for i, rs in by_request.items() if rs[0].get("backend", {}).get("id") == "hangs"]
    seen["client disconnect"] = Seen(left, 499)
    for name, client in seen.items():
        assert client.request_id in by_request, name
        last = by_request[client.request_id][-1]
        if last["type"] == "completion":
            logged = last["status"]
        else:
            assert last["type"] == "refusal", name
            logged = ErrorCode(last["reason"]).status
        assert logged == client.status, f"{name}: client got {client.status}, log says {logged}"
    # Every attempt of "private fails, hosted fails" is in the log, each with its outcome.
    both_records = by_request[seen["private fails, hosted fails"].request_id or ""]
    assert [(r["type"], r.get("status")) for r in both_records] == [
        ("dispatch", None),
        ("completion", 503),
        ("dispatch", None),
        ("completion", 503),
    ]
    # The attempt that served says so: the earlier attempt's error is not carried into it.
    rescued = by_request[seen["private fails, hosted serves"].request_id or ""]
    assert [(r["type"], r.get("status"), r.get("error")) for r in rescued][2:] == [
        ("dispatch", None, None),
        ("completion", 200, None),
    ]
    assert rescued[1]["type"] == "completion" and rescued[1]["error"]
