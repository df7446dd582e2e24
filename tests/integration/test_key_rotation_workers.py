"""A key rotation through `owngate serve --workers 2`: each worker's log (`ORIGIN/worker-i`,
signed by the key named ORIGIN) keeps the rotation order, and the receipts of each phase
verify against their worker's log with both keys.

The rotation checks of `audit verify` and `audit receipt verify --log` (`audit.rotation`,
`audit.receipt_keys`: a key first signing later must carry an earlier key's name, a
retired key never signs alone again) must not refuse an honest log of a gateway whose
worker logs' origins name no key. The workers answer from one socket (SO_REUSEPORT), so
each phase sends requests until both workers answered one (bounded)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import yaml

from gateway.provenance import load_verifiers, verify_log, verify_receipt, write_signing_key
from tests.helpers.processes import KEY, GatewayProcess, listening_sockets
from tests.helpers.provenance import run_audit
from tests.helpers.waiting import until

ORIGIN = "test.owngate/rotated-workers"
REQUEST = json.dumps(
    {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
).encode()


def _serve(gateway: GatewayProcess, most: int = 60) -> dict[str, bytes]:
    """Start, wait until both workers listen, send chats until each worker's log signed a
    receipt (at most `most`), stop (final checkpoints); returns one receipt per log origin.

    `/readyz` answers once one worker serves: before, under load, the second could still
    be starting after `most` requests, all answered by the first (the stop then found it
    starting)."""
    gateway.start()
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    receipts: dict[str, bytes] = {}
    try:
        until(lambda: listening_sockets(gateway.port) == 2, "both workers listen", timeout=60)
        with httpx.Client(base_url=gateway.url, headers=headers, timeout=10) as client:
            for _ in range(most):
                if len(receipts) == 2:
                    break
                # a fresh connection each time, so the kernel may pick either worker
                answer = client.post(
                    "/v1/chat/completions", content=REQUEST, headers={"connection": "close"}
                )
                assert answer.status_code == 200, answer.text
                envelope = base64.b64decode(answer.headers["x-owngate-receipt"])
                payload = json.loads(base64.b64decode(json.loads(envelope)["payload"]))
                receipts.setdefault(payload["log"], envelope)
    finally:
        assert gateway.stop() == 0, gateway.output()
    assert len(receipts) == 2, f"only {sorted(receipts)} answered in {most} requests"
    return receipts


def _reconfigure(gateway: GatewayProcess, **provenance: object) -> None:
    config = yaml.safe_load(gateway.path.read_text())
    config["provenance"] = {"dir": "log", "origin": ORIGIN, **provenance}
    gateway.path.write_text(yaml.safe_dump(config))


def test_an_honest_rotation_by_two_workers_verifies(
    process: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    vkey_a = write_signing_key(tmp_path / "a.key", ORIGIN)
    vkey_b = write_signing_key(tmp_path / "b.key", ORIGIN)
    # the fixture's config (a simulator serving `m`), served by two workers
    single = process(provenance={"dir": "log", "origin": ORIGIN, "signing_key_file": "a.key"})
    gateway = GatewayProcess(yaml.safe_load(single.path.read_text()), tmp_path, "--workers", "2")
    phases = [_serve(gateway)]
    _reconfigure(gateway, signing_key_file="b.key", previous_signing_key_files=["a.key"])
    phases.append(_serve(gateway))
    _reconfigure(gateway, signing_key_file="b.key")
    phases.append(_serve(gateway))

    keys = load_verifiers([vkey_a, vkey_b])
    for worker in (1, 2):
        logdir = tmp_path / "log" / f"worker-{worker}"
        origin = f"{ORIGIN}/worker-{worker}"
        assert len(verify_log(logdir, keys).signed_by) == 2
        argv = ["verify", str(logdir), "--key", vkey_a, "--key", vkey_b]
        assert run_audit(argv) == 0
        only_b = [*argv[:2], "--key", vkey_b, "--accept-earlier-keys"]
        assert run_audit(only_b) == 0
        for number, phase in enumerate(phases):
            receipt = tmp_path / f"receipt-{worker}-{number}.json"
            receipt.write_bytes(phase[origin])
            verify_receipt(phase[origin], keys)
            check = ["receipt", "verify", str(receipt), "--key", vkey_a, "--key", vkey_b]
            assert run_audit([*check, "--log", str(logdir)]) == 0, (worker, number)
