"""DELETE /admin/v1/keys/{digest} with `state: redis` while Redis is down, on a real
`owngate serve` and a real redis-server stopped mid-test.

Found by review: the answer was a 503 "retry", though the keys file had already changed
and this replica already refused the key, so the retry got a 404; the signed admin record
said "done" as if every replica refused it. The answer is now a 202 whose body says what
happened (`propagated: false`: revoked here and in the keys file, other replicas accept
the key until Redis is back), the record's `outcome` is "local", and the queued
revocation reaches Redis when it answers again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.tenants import hash_api_key, read_keys_file
from tests.helpers.admin import Served, bearer, serve_admin
from tests.helpers.provenance import records, run_audit
from tests.helpers.redis_server import RedisServer
from tests.helpers.waiting import until

WAIT_S = 30.0

pytestmark = pytest.mark.redis


@pytest.fixture
def served(tmp_path: Path, redis_server: RedisServer) -> Iterator[Served]:
    state = {"backend": "redis", "url": redis_server.url, "timeout_ms": 500}
    (tmp_path / "gateway").mkdir()  # beside redis-server's own directory
    with serve_admin(tmp_path / "gateway", state=state) as gateway:
        yield gateway


def _state(served: Served) -> dict[str, Any]:
    answer = served.get("/admin/v1/status", "operator")
    assert answer.status_code == 200, answer.text
    state: dict[str, Any] = answer.json()["state"]
    return state


def _revoke(served: Served, key: str) -> httpx.Response:
    digest = hash_api_key(key).removeprefix("sha256:")
    return httpx.delete(
        f"{served.admin}/admin/v1/keys/{digest}", headers=bearer("security"), timeout=WAIT_S
    )


def _admin_record(served: Served, index: int) -> dict[str, Any]:
    served.wait_for_size(index + 1)
    return records(served.log)[index]


def test_a_revocation_while_redis_is_down_says_it_is_local(
    tmp_path: Path, served: Served, redis_server: RedisServer
) -> None:
    until(lambda: _state(served)["healthy"], "the gateway on Redis", timeout=WAIT_S)
    shared = served.post("/admin/v1/keys", "security", {"tenant": "acme"}).json()["key"]
    local = served.post("/admin/v1/keys", "security", {"tenant": "acme"}).json()["key"]
    assert served.chat(local).status_code == 200

    revoked = _revoke(served, shared)  # Redis up: every replica refuses it
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["propagated"] is True
    assert _admin_record(served, revoked.json()["log_index"])["outcome"] == "done"

    redis_server.stop()
    until(lambda: not _state(served)["healthy"], "Redis seen down", timeout=WAIT_S)
    answer = _revoke(served, local)
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert body["propagated"] is False and body["changed"] is True
    assert "revoked on this replica" in body["detail"] and "Do not retry" in body["detail"]
    record = _admin_record(served, body["log_index"])
    assert record["action"] == "key_revoke" and record["outcome"] == "local"
    assert served.chat(local).status_code == 401  # it is revoked here, as said
    assert hash_api_key(local) not in read_keys_file(tmp_path / "gateway" / "keys.yaml")["acme"]
    assert _state(served)["pending_revocations"] == 1
    assert _revoke(served, local).status_code == 404  # what a retry gets: nothing to do
    assert run_audit(["verify", str(served.log), "--key", served.vkey]) == 0  # it reads "local"

    redis_server.start()  # the same port: the queued revocation is sent
    until(
        lambda: _state(served)["healthy"] and _state(served)["pending_revocations"] == 0,
        "the queued revocation stored in Redis",
        timeout=WAIT_S,
    )
