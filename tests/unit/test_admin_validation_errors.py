"""A body the admin API refuses is named by where it went wrong (`body.tenant: ...`), and
that location can hold a key the caller chose (an unknown field's name): the message
quotes at most an escaped excerpt of it, like every other error that quotes a caller."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import httpx

from gateway.api.labels import EXCERPT_CHARS
from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from tests.helpers.gateways import backend

TOKEN = "og-admin-validation-token"


def _explain(body: dict[str, Any]) -> httpx.Response:
    return _post("/admin/v1/policies/explain", body)


def _post(path: str, body: dict[str, Any]) -> httpx.Response:
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "admin": {"token_hashes": ["sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()]},
    }
    app = admin_app(create_app(GatewaySettings.model_validate(config)))

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as http:
            headers = {"authorization": f"Bearer {TOKEN}"}
            return await http.post(path, headers=headers, json=body)

    return asyncio.run(run())


def test_a_chosen_key_in_the_location_is_bounded_and_escaped() -> None:
    key = "\u202e\x1b[31m" + "k" * 10_000
    answer = _explain({"tenant": "acme", "model": "m", key: 1})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request"
    message = error["message"]
    assert "\u202e" not in message and "\x1b" not in message
    assert "\\u202e" in message and "\\x1b" in message
    assert "k" * (EXCERPT_CHARS + 1) not in message
    assert len(message) < 400, message


def test_an_ordinary_location_still_reads_plainly() -> None:
    answer = _explain({"tenant": "acme"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"].startswith("body.model: ")


def test_a_key_for_a_tenant_that_is_no_tenant_id_does_not_echo_it() -> None:
    """`POST /admin/v1/keys` quoted the whole tenant it was sent (`{tenant!r}`: up to the
    1 MiB body) in its 400; a tenant id has a shape (config `Identifier`), and anything
    else is refused as a field, quoting none of it."""
    tenant = "\u202e\x1b[31m" + "t" * 10_000
    answer = _post("/admin/v1/keys", {"tenant": tenant})
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]["message"]
    assert message.startswith("body.tenant: "), message[:200]
    assert "t" * (EXCERPT_CHARS + 1) not in message and "\x1b" not in message
    assert len(message) < 400, message[:200]
