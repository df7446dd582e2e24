"""On a real `owngate serve` process with `admin.allow_loopback` (the demo's setting), a
loopback client without a token reads the admin API but changes nothing: before, a
tokenless `POST /admin/v1/keys` from any local process minted a tenant key (stored in the
keys file, served at once, and an admin record naming token "loopback"). The listener
also takes no PROXY protocol line: a peer cannot name itself a loopback client that way
(forwarding headers: tests/unit/test_admin_forwarded.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.tenants import hash_api_key
from tests.helpers.admin import Served, serve_admin
from tests.helpers.processes import KEY
from tests.helpers.provenance import records
from tests.helpers.raw_http import build_request, exchange


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve_admin(tmp_path_factory.mktemp("admin-loopback"), allow_loopback=True) as gateway:
        yield gateway


def _keys_file(served: Served) -> Path:
    return served.process.path.parent / "keys.yaml"


def test_a_tokenless_loopback_client_cannot_mint_or_revoke_a_key(served: Served) -> None:
    before = _keys_file(served).read_bytes() if _keys_file(served).exists() else None
    minted = served.post("/admin/v1/keys", None, {"tenant": "acme"})
    assert minted.status_code == 401, minted.text
    assert minted.json()["error"]["code"] == "missing_api_key"
    assert "key" not in minted.json()
    digest = hash_api_key(KEY).removeprefix("sha256:")
    revoked = httpx.delete(f"{served.admin}/admin/v1/keys/{digest}", timeout=10)
    assert revoked.status_code == 401, revoked.text
    after = _keys_file(served).read_bytes() if _keys_file(served).exists() else None
    assert after == before
    assert served.chat().status_code == 200  # the tenant's key still works
    listed = served.get("/admin/v1/keys")  # reading stays open to the loopback client
    assert listed.status_code == 200, listed.text
    assert [k["tenant"] for k in listed.json()["keys"]] == ["acme"]
    reloaded = served.post("/admin/v1/reload", "operator")  # every earlier record is in
    assert reloaded.status_code == 200, reloaded.text
    served.wait_for_size(reloaded.json()["log_index"] + 1)
    admins = [r for r in records(served.log) if r["type"] == "admin"]
    assert [(r["action"], r["role"]) for r in admins] == [("reload", "operator")], admins


@pytest.mark.parametrize("path", ["/admin/v1/reload", "/admin/v1/drain"])
def test_a_tokenless_loopback_client_cannot_reload_or_drain(served: Served, path: str) -> None:
    answer = served.post(path, None)
    assert answer.status_code == 401, answer.text
    status = served.get("/admin/v1/status")
    assert status.status_code == 200, status.text
    assert status.json()["draining"] is False


def test_a_proxy_protocol_line_is_not_believed(served: Served) -> None:
    """A PROXY v1 line naming another client is a malformed request, never a new peer
    address (uvicorn speaks no PROXY protocol): were it believed, a remote peer could
    claim 127.0.0.1 the same way."""
    port = int(served.admin.rsplit(":", 1)[1])
    request = build_request(b"POST", b"/admin/v1/drain", [b"host: 127.0.0.1", b"content-length: 0"])
    for line in (b"PROXY TCP4 127.0.0.1 127.0.0.1 40000 9090\r\n", b"PROXY UNKNOWN\r\n"):
        outcome = exchange(port, line + request, half_close=True)
        assert [r.status for r in outcome.final] == [400], outcome.describe()
    status = served.get("/admin/v1/status")
    assert status.json()["draining"] is False, status.text
