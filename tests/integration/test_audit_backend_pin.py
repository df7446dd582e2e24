"""`owngate audit verify --backend-pin ID=PIN` (issue 15, layer 1): an auditor holding the
keys a backend's owner publishes checks that every dispatch the signed log says went to
that backend names one of them as the key its connection presented.

A real `owngate serve` process (tests/helpers/processes.py) dispatches to `gpu`, a
simulator behind a TLS front (tests/helpers/tls.py) whose certificate the test makes, and
to `plain`, a simulator over plain HTTP; then it stops (its final checkpoint signs
everything) and the CLI checks the log it wrote.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gateway.provenance import write_signing_key
from gateway.serving import ServerThread
from gateway.sim import SimSettings, create_sim_app
from gateway.tenants import hash_api_key
from tests.helpers.gateways import ADMIN, backend
from tests.helpers.net import free_port
from tests.helpers.processes import KEY, GatewayProcess
from tests.helpers.provenance import request_records, run_audit
from tests.helpers.tls import Pki, TLSFront, server_context

ORIGIN = "test.owngate/pin/1"


@dataclass(frozen=True)
class PinnedLog:
    logdir: Path
    vkey: str
    pin: str  # the key gpu's certificate holds
    other: str  # a key of the same CA's, never presented
    gpu_request: str
    plain_request: str
    gpu_receipt: Path
    plain_receipt: Path


@pytest.fixture(scope="module")
def pinned_log(tmp_path_factory: pytest.TempPathFactory) -> PinnedLog:
    tmp = tmp_path_factory.mktemp("pinned")
    pki = Pki.create(tmp / "pki")
    cert, other = pki.server(), pki.server()
    sims = []
    for model in ("m", "p"):
        settings = SimSettings.for_kind("vllm", models=(model,))
        app = create_sim_app(dataclasses.replace(settings, zero_latency=True))
        sims.append(ServerThread(app).start())
    gpu_sim, plain_sim = sims
    front = TLSFront((gpu_sim.host, gpu_sim.port), server_context(pki, cert)).start()
    vkey = write_signing_key(tmp / "log.key", ORIGIN)
    tls = {"ca_file": str(pki.directory / "ca.pem"), "pin_spki_sha256": [cert.pin]}
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "warning", "access_log": False},
        "backends": [
            backend("gpu", front.url, "m", tls=tls),
            backend("plain", plain_sim.url, "p"),
        ],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
        "admin": ADMIN,
        "provenance": {
            "dir": str(tmp / "log"),
            "origin": ORIGIN,
            "signing_key_file": str(tmp / "log.key"),
            "checkpoint_interval_ms": 20,
            "receipts": "single",
        },
    }
    gateway = GatewayProcess(config, tmp / "gateway")
    try:
        gateway.start()
        ids, receipts = [], []
        for model in ("m", "p"):
            answer = httpx.post(
                f"{gateway.url}/v1/chat/completions",
                json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": f"Bearer {KEY}"},
                timeout=10,
            )
            assert answer.status_code == 200, answer.text
            ids.append(answer.headers["x-request-id"])
            receipt = tmp / f"{model}.receipt.json"
            receipt.write_bytes(base64.b64decode(answer.headers["x-owngate-receipt"]))
            receipts.append(receipt)
        assert gateway.stop() == 0, gateway.output()  # drained: the last checkpoint signed
    finally:
        gateway.stop()
        front.stop()
        for sim in sims:
            sim.stop()
    logdir = tmp / "log"
    # The scene is what the test says it is: gpu's record names its key, plain's none.
    assert request_records(logdir, ids[0], "dispatch")[0]["backend"]["peer"]["spki_sha256"] == (
        cert.pin
    )
    assert "peer" not in request_records(logdir, ids[1], "dispatch")[0]["backend"]
    return PinnedLog(logdir, vkey, cert.pin, other.pin, ids[0], ids[1], *receipts)


def _verify(log: PinnedLog, *pins: str, json_out: bool = False) -> int:
    argv = ["verify", str(log.logdir), "--key", log.vkey]
    for pin in pins:
        argv += ["--backend-pin", pin]
    return run_audit(argv + (["--json"] if json_out else []))


def test_the_key_the_owner_publishes_passes(
    pinned_log: PinnedLog, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _verify(pinned_log, f"gpu={pinned_log.pin}") == 0
    out = capsys.readouterr().out
    assert "ok: backend gpu: 1 dispatch(es), each over a connection presenting one of its " in out
    assert _verify(pinned_log, f"gpu={pinned_log.pin}", json_out=True) == 0
    assert json.loads(capsys.readouterr().out)["pinned"] == {"gpu": 1}


def test_another_key_fails_naming_the_request_the_key_and_the_pin(
    pinned_log: PinnedLog, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _verify(pinned_log, f"gpu={pinned_log.other}") == 1
    err = capsys.readouterr().err
    assert err.startswith("FAILED: entry ")
    assert repr(pinned_log.gpu_request) in err
    assert f"presented key {pinned_log.pin}" in err
    assert f"not one of its pins ({pinned_log.other})" in err


def test_the_keys_of_a_rotation_pass_together(
    pinned_log: PinnedLog, capsys: pytest.CaptureFixture[str]
) -> None:
    rotation = (f"gpu={pinned_log.other}", f"gpu={pinned_log.pin}")
    assert _verify(pinned_log, *rotation) == 0
    assert "one of its 2 pinned key(s)" in capsys.readouterr().out


def test_a_pinned_backend_reached_over_plain_http_fails(
    pinned_log: PinnedLog, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _verify(pinned_log, f"plain={pinned_log.pin}") == 1
    err = capsys.readouterr().err
    assert repr(pinned_log.plain_request) in err
    assert "(backend plain): the record carries no backend.peer, so no key" in err
    assert pinned_log.pin in err


def test_other_backends_records_are_not_affected(
    pinned_log: PinnedLog, capsys: pytest.CaptureFixture[str]
) -> None:
    # The log holds plain's record without a key: a pin for gpu alone does not look at it.
    assert _verify(pinned_log, f"gpu={pinned_log.pin}", f"cpu={pinned_log.other}") == 0
    out = capsys.readouterr().out
    assert "plain" not in out
    assert "ok: backend cpu: 0 dispatch(es)" in out
    assert "(the log dispatched nothing to it: is the id right?)" in out


@pytest.mark.parametrize(
    "item",
    [
        "gpu",  # no =
        "=sha256//AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",  # no id
        "gpu=",
        "gpu=sha256//short=",
        "gpu=sha1//AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        "gpu=sha256//AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAB=",  # not canonical base64
        "gpu=sha256//AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",  # no padding
    ],
)
def test_a_malformed_pin_is_refused_with_a_clear_error(
    pinned_log: PinnedLog, item: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _verify(pinned_log, item) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --backend-pin ")
    assert "wants ID=PIN" in err or "is not a key pin: give sha256// followed by" in err


def _receipt(log: PinnedLog, receipt: Path, *pins: str, logged: bool = True) -> int:
    argv = ["receipt", "verify", str(receipt), "--key", log.vkey]
    for pin in pins:
        argv += ["--backend-pin", pin]
    return run_audit(argv + (["--log", str(log.logdir)] if logged else []))


def test_a_receipt_checks_the_pin_against_the_record_it_names(
    pinned_log: PinnedLog, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _receipt(pinned_log, pinned_log.gpu_receipt, f"gpu={pinned_log.pin}") == 0
    out = capsys.readouterr().out
    assert "ok: backend gpu presented one of its 1 pinned key(s)" in out
    assert _receipt(pinned_log, pinned_log.gpu_receipt, f"gpu={pinned_log.other}") == 1
    err = capsys.readouterr().err
    assert f"presented key {pinned_log.pin}" in err
    assert f"not one of its pins ({pinned_log.other})" in err
    assert _receipt(pinned_log, pinned_log.plain_receipt, f"plain={pinned_log.pin}") == 1
    assert "the record carries no backend.peer" in capsys.readouterr().err


def test_a_receipt_pin_needs_the_log_and_says_when_it_checks_nothing(
    pinned_log: PinnedLog, capsys: pytest.CaptureFixture[str]
) -> None:
    # The receipt carries no key: without the log there is nothing to hold the pin to.
    assert _receipt(pinned_log, pinned_log.gpu_receipt, f"gpu={pinned_log.pin}", logged=False) == 2
    assert "add --log LOGDIR" in capsys.readouterr().err
    assert _receipt(pinned_log, pinned_log.plain_receipt, f"gpu={pinned_log.other}") == 0
    out = capsys.readouterr().out
    assert "no --backend-pin is given (gpu given): the key it presented is not checked" in out
    assert _receipt(pinned_log, pinned_log.gpu_receipt, "gpu=sha256//x") == 2
    assert "is not a key pin" in capsys.readouterr().err


def test_attempts_refused_before_sending_do_not_fail_the_pin_audit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The gateway writes a dispatch record for an attempt whose connection it could not
    open (refused, or the certificate refused: layer 1 working), naming no key, and its
    completion says why. `--backend-pin` failed the whole log on it ("the request went
    over a connection that named none (plain HTTP ...)"), so any log in which a pinned
    backend once went down, or presented a certificate the gateway refused, failed the
    audit. Such a record now passes, counted apart; one naming no key whose attempt did
    send still fails (test_a_pinned_backend_reached_over_plain_http_fails)."""
    pki = Pki.create(tmp_path / "pki")
    cert, other = pki.server(), pki.server()
    settings = SimSettings.for_kind("vllm", models=("m", "d"))
    sim = ServerThread(create_sim_app(dataclasses.replace(settings, zero_latency=True))).start()
    fronts = [TLSFront((sim.host, sim.port), server_context(pki, cert)).start() for _ in "ab"]
    vkey = write_signing_key(tmp_path / "log.key", ORIGIN)
    tls = {"ca_file": str(pki.directory / "ca.pem"), "pin_spki_sha256": [cert.pin]}
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "warning", "access_log": False},
        "backends": [
            backend("gpu", fronts[0].url, "m", tls=tls),
            backend("down", fronts[1].url, "d", tls=tls),
        ],
        # No probe between the failures and the requests: their breakers learn of them
        # from the requests, whose attempts are then made (and recorded).
        "scrape": {"interval_s": 3600, "staleness_s": 7200},
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
        "admin": ADMIN,
        "provenance": {
            "dir": str(tmp_path / "log"),
            "origin": ORIGIN,
            "signing_key_file": str(tmp_path / "log.key"),
            "checkpoint_interval_ms": 20,
        },
    }
    gateway = GatewayProcess(config, tmp_path / "gateway")

    def ask(model: str) -> httpx.Response:
        return httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=10,
        )

    try:
        gateway.start()
        assert ask("m").status_code == 200
        fronts[0].swap(server_context(pki, other))  # a key not pinned: the TLS check refuses
        fronts[1].stop()  # the backend goes down: the connection is refused
        refused = [ask("m"), ask("d")]
        assert [r.status_code for r in refused] == [503, 503], [r.text for r in refused]
        assert gateway.stop() == 0, gateway.output()
    finally:
        gateway.stop()
        for front in fronts:
            front.stop()
        sim.stop()
    logdir = tmp_path / "log"
    for answer, error in zip(refused, ("gpu: tls", "down: connect"), strict=True):
        request_id = answer.headers["x-request-id"]
        (dispatch,) = request_records(logdir, request_id, "dispatch")
        assert "peer" not in dispatch["backend"]  # the scene: records naming no key
        assert request_records(logdir, request_id, "completion")[0]["error"] == error
    argv = ["verify", str(logdir), "--key", vkey, "--backend-pin", f"gpu={cert.pin}"]
    assert run_audit([*argv, "--backend-pin", f"down={cert.pin}"]) == 0
    out = capsys.readouterr().out
    assert "ok: backend gpu: 1 dispatch(es)" in out and "1 more attempt(s) sent nothing" in out
    assert "ok: backend down: 0 dispatch(es)" in out
    assert "(the log dispatched nothing to it" not in out
    # The served request's key is still held to the pins.
    assert (
        run_audit(["verify", str(logdir), "--key", vkey, "--backend-pin", f"gpu={other.pin}"]) == 1
    )
    assert f"presented key {cert.pin}" in capsys.readouterr().err
    # So is the client's own check of its receipt: a 503 whose attempt sent nothing.
    for answer, name in zip(refused, ("gpu", "down"), strict=True):
        receipt = tmp_path / f"{name}.receipt.json"
        receipt.write_bytes(base64.b64decode(answer.headers["x-owngate-receipt"]))
        check = ["receipt", "verify", str(receipt), "--key", vkey, "--log", str(logdir)]
        assert run_audit([*check, "--backend-pin", f"{name}={cert.pin}"]) == 0
        assert f"ok: the attempt at backend {name} sent nothing" in capsys.readouterr().out
