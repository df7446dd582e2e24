"""What the admin API tells a client when the provenance log cannot be read: why, never
where the log lives on the gateway's host (a reader's error names its files by their
absolute paths)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from gateway.admin.receipts import _check
from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from gateway.provenance import LogDirectory, Receipt, make_receipt
from gateway.provenance.formats.commitments import Salts
from gateway.provenance.formats.merkle import leaf_hash
from gateway.provenance.testing import CountingRandom, seeded_signer
from tests.helpers.gateways import backend

TOKEN = "og-admin-log-errors-token"
ORIGIN = "admin-errors.test/log"


def test_a_request_lookup_on_an_unreadable_log_names_no_host_path(tmp_path: Path) -> None:
    answer = _lookup(tmp_path, "req-1")
    assert answer.status_code == 404, answer.text
    message = answer.json()["error"]["message"]
    assert message == "the log cannot be read: log has no checkpoint file"
    assert str(tmp_path) not in answer.text


def test_a_receipt_the_log_cannot_prove_names_no_host_path(tmp_path: Path) -> None:
    signer = seeded_signer(ORIGIN)
    receipt = Receipt(
        request_id="req-1",
        log=ORIGIN,
        index=0,
        dispatch_hash=leaf_hash(b"x"),
        backend="gpu",
        policy_digest="sha256:ab",
        salts=Salts.generate(CountingRandom()),
    )
    verdict = _check(make_receipt(receipt, signer), LogDirectory(tmp_path), [signer.verifier()])
    assert verdict["valid"] is False
    assert verdict["problems"] == ["the log does not hold it: log has no checkpoint file"]


@pytest.mark.parametrize("request_id", ["req_0123", "attest-0a1b", "tenant:job.7"])
def test_a_request_lookup_takes_the_request_id_form_of_the_log(
    tmp_path: Path, request_id: str
) -> None:
    """What a record or a sidecar takes as a request id (`:` too) is looked up in the log;
    anything else is not a request id, before the log is read."""
    answer = _lookup(tmp_path, request_id)
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["message"] == (
        "the log cannot be read: log has no checkpoint file"
    )


@pytest.mark.parametrize("request_id", ["a b", "x" * 129, "r\u00e9q", "req%1b"])
def test_a_request_lookup_refuses_what_is_not_a_request_id(tmp_path: Path, request_id: str) -> None:
    answer = _lookup(tmp_path, request_id)
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["message"] == "not a request id"


def _lookup(tmp_path: Path, request_id: str) -> httpx.Response:
    """The admin API's answer to a lookup of `request_id` in a log with no checkpoint yet."""
    (tmp_path / "log").mkdir()
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "provenance": {"dir": "log", "origin": ORIGIN, "signing_key_file": "log.key"},
        "admin": {"token_hashes": ["sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()]},
    }
    app = admin_app(create_app(GatewaySettings.model_validate(config), config_dir=tmp_path))

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as http:
            return await http.get(
                f"/admin/v1/log/requests/{quote(request_id)}",
                headers={"authorization": f"Bearer {TOKEN}"},
            )

    return asyncio.run(run())
