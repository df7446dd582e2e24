"""The admin API reads its own log's files as an auditor reads a log: a regular file,
bounded, never through a symbolic link (gateway/admin/tiles.py, gateway/admin/cosignatures.py).

`GET /admin/v1/log/cosignatures`, `/log/checkpoint` and `/log/tile/...` read `checkpoint`,
`cosigned/<size>` and the tiles with `read_bytes()`: a FIFO there (whoever may write in
the log directory can make one) held the reading thread for good, waiting for a writer,
and a symbolic link served the file it names (the log's signing key) to an auditor's
token. Now each answers at once: a FIFO or a link is 503 `provenance_unavailable` naming
the file (a `cosigned/` one: that witness's cosignature is not valid), its content unread.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from gateway.provenance.formats.layout import cosigned_path
from gateway.provenance.formats.tiles import entries_path
from tests.helpers.admin import WITNESS, Served, bearer, serve_admin
from tests.helpers.net import free_port

AUDITOR = bearer("auditor")


@contextmanager
def fifo_instead_of(path: Path) -> Iterator[None]:
    """A FIFO at `path` (the file there set aside), its write end held, so a read of it
    waits for bytes that never come; afterwards every reader reads its end and the file
    is back."""
    aside = path.with_name(path.name + ".aside")
    if path.exists():
        path.rename(aside)
    os.mkfifo(path)
    held = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    try:
        yield
    finally:
        path.unlink()
        os.close(held)  # the last writer gone: a blocked reader reads its end
        if aside.exists():
            aside.rename(path)


@contextmanager
def link_instead_of(path: Path, target: Path) -> Iterator[None]:
    aside = path.with_name(path.name + ".aside")
    path.rename(aside)
    path.symlink_to(target)
    try:
        yield
    finally:
        path.unlink()
        aside.rename(path)


def get(served: Served, path: str) -> httpx.Response:
    """The answer, or the test fails when none comes within 10 s (a read that hangs)."""
    return httpx.get(f"{served.admin}{path}", headers=AUDITOR, timeout=10)


def refused(response: httpx.Response, name: str) -> str:
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "provenance_unavailable", error
    assert f"log/{name}" in error["message"], error
    return str(error["message"])


def test_fifos_and_links_in_the_log_are_answered_at_once_unread(tmp_path: Path) -> None:
    witness = {"url": f"http://127.0.0.1:{free_port()}", "vkey": WITNESS.vkey, "timeout_s": 1}
    with serve_admin(tmp_path, provenance={"witnesses": [witness]}) as served:
        assert served.chat().status_code == 200
        served.wait_for_size(2)
        log = served.log

        cosigned = cosigned_path(log, 2)
        cosigned.parent.mkdir(exist_ok=True)
        with fifo_instead_of(cosigned):
            answer = get(served, "/admin/v1/log/cosignatures")
        assert answer.status_code == 200, answer.text
        [seen] = answer.json()["witnesses"]
        assert (seen["valid"], seen["cosigned_size"]) == (False, None), seen

        with fifo_instead_of(log / "checkpoint"):
            message = refused(get(served, "/admin/v1/log/cosignatures"), "checkpoint")
            assert "not a regular file" in message
            refused(get(served, "/log/checkpoint"), "checkpoint")

        name = entries_path(0, 2)  # the bundle of the two entries: tile/entries/000.p/2
        assert (log / name).is_file()
        with fifo_instead_of(log / name):
            refused(get(served, f"/log/{name}"), name)

        key = (tmp_path / "log.key").read_text()
        with link_instead_of(log / "checkpoint", tmp_path / "log.key"):
            answer = get(served, "/log/checkpoint")
            assert "symbolic link" in refused(answer, "checkpoint")
            assert key.split("+")[-1].strip() not in answer.text
            refused(get(served, "/admin/v1/log/cosignatures"), "checkpoint")
        assert get(served, "/log/checkpoint").status_code == 200  # the file back, served
