"""The admin API's key changes when the keys file cannot be changed (gateway/admin/
key_changes.py), on a real `owngate serve` process: another change holding the file's
lock past `LOCK_WAIT_S`, or a file that cannot be read, is a 503 in OpenAI's error format
before anything is recorded, stored or changed: the key stays as it was, and no admin
record says it changed.

Found by review: the lock was a file of its own (`.keys.yaml.lock`, 0600, made by
whichever user changed keys first), so the gateway running as another user than the
operator's `owngate keys` got PermissionError, and DELETE /admin/v1/keys/{digest}
raised after its admin record said "changed" and the revocation was stored in the
shared state. A change also waited for the lock without bound in a thread of the
default pool, which backend connections need for `getaddrinfo`."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.tenants import hash_api_key, read_keys_file
from tests.helpers.admin import Served, bearer, serve_admin
from tests.helpers.provenance import records

WAIT_S = 30.0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve_admin(tmp_path_factory.mktemp("admin-keys")) as gateway:
        yield gateway


def _keys(served: Served) -> Path:
    return served.process.path.parent / "keys.yaml"


def _new_key(served: Served) -> str:
    created = served.post("/admin/v1/keys", "security", {"tenant": "acme"})
    assert created.status_code == 201, created.text
    key: str = created.json()["key"]
    return key


def _revoke(served: Served, key: str) -> httpx.Response:
    digest = hash_api_key(key).removeprefix("sha256:")
    return httpx.delete(
        f"{served.admin}/admin/v1/keys/{digest}", headers=bearer("security"), timeout=WAIT_S
    )


def _unavailable(response: httpx.Response) -> str:
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "backend_unavailable"
    assert "nothing was" in error["message"]
    message: str = error["message"]
    return message


def _admin_actions_after_a_reload(served: Served) -> list[str]:
    """The admin records' actions, up to a reload made now (so every earlier one is in)."""
    reloaded = served.post("/admin/v1/reload", "operator")
    assert reloaded.status_code == 200, reloaded.text
    served.wait_for_size(reloaded.json()["log_index"] + 1)
    return [r["action"] for r in records(served.log) if r["type"] == "admin"]


def test_key_changes_while_another_holds_the_lock_are_503_with_nothing_done(
    served: Served,
) -> None:
    key = _new_key(served)
    keys = _keys(served)
    stored = read_keys_file(keys)
    fd = os.open(keys.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another change, stuck
        revoked = _revoke(served, key)
        message = _unavailable(revoked)
        assert "held its lock" in message
        assert revoked.headers["retry-after"] == "1"
        created = httpx.post(
            f"{served.admin}/admin/v1/keys",
            headers=bearer("security"),
            json={"tenant": "acme"},
            timeout=WAIT_S,
        )
        _unavailable(created)
        assert "key" not in created.json()
    finally:
        os.close(fd)
    assert read_keys_file(keys) == stored  # neither change was made
    assert served.chat(key).status_code == 200  # not revoked here, nor in the shared state
    actions = _admin_actions_after_a_reload(served)
    assert actions[-2:] == ["key_create", "reload"], actions  # no record of either
    assert _revoke(served, key).status_code == 200  # the lock free: it works
    assert served.chat(key).status_code == 401


def test_a_keys_file_that_cannot_be_read_is_503_before_anything_is_recorded(
    served: Served,
) -> None:
    key = _new_key(served)
    keys = _keys(served)
    kept = keys.with_name("keys.yaml.kept")
    shutil.copy2(keys, kept)
    keys.unlink()
    keys.mkdir()  # not a file: OSError on any read, for root too
    try:
        _unavailable(_revoke(served, key))
        assert served.chat(key).status_code == 200  # not revoked: not in the shared state
    finally:
        keys.rmdir()
        kept.rename(keys)
    actions = _admin_actions_after_a_reload(served)
    assert actions[-2:] == ["key_create", "reload"], actions  # no "key_revoke: changed"
    assert _revoke(served, key).status_code == 200
    assert served.chat(key).status_code == 401
