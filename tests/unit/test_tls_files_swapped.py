"""A backend's TLS files under faults. Its client certificate and key are loaded from the
bytes the gateway read and checked (a regular file, bounded), not opened again by name.
Before, OpenSSL opened them again by path after the check: a certificate file replaced by
a FIFO in between (or by another file) hung the reload's thread for good, holding the
reload lock (no later change, a key revoked, was ever loaded again), or loaded other
bytes than those its digest recorded. And a TLS file with invalid content is not a read
that failed (no worker turns stale over it)."""

from __future__ import annotations

import asyncio
import os
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from gateway import tls_files
from gateway.app import create_app
from gateway.config import load_config
from gateway.pki import issue, make_ca
from gateway.small_files import read_small_file
from gateway.upstream import tls as tls_module
from tests.helpers.gateways import backend, gateway_config


def test_a_client_certificate_swapped_for_a_fifo_after_its_read_is_not_opened_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    ca = make_ca("ca", now=now)
    client = issue(ca, "client", now=now, client=True)
    (tmp_path / "client.pem").write_bytes(client.cert_pem)
    (tmp_path / "client.key").write_bytes(client.key_pem)
    tls = {"client_cert_file": "client.pem", "client_key_file": "client.key"}
    settings = gateway_config(
        [{**backend("gpu", "https://127.0.0.1:9", "m"), "tls": tls}]
    ).backends[0]

    def read_then_swapped(path: Path, limit: int) -> bytes:
        data = read_small_file(path, limit)
        if path.name == "client.key":  # both read: the certificate becomes a FIFO
            (tmp_path / "client.pem").unlink()
            os.mkfifo(tmp_path / "client.pem")
        return data

    monkeypatch.setattr(tls_files, "read_small_file", read_then_swapped)
    outcome: list[object] = []

    def build() -> None:
        try:
            outcome.append(tls_module.backend_tls(settings, "127.0.0.1", tmp_path))
        except ValueError as exc:
            outcome.append(exc)

    builder = threading.Thread(target=build, daemon=True)
    builder.start()
    builder.join(timeout=20)
    hung = builder.is_alive()
    if hung:  # before: blocked opening the FIFO; a writer's close lets it end
        os.close(os.open(tmp_path / "client.pem", os.O_WRONLY | os.O_NONBLOCK))
        builder.join(timeout=20)
    assert not hung, "building the backend's TLS opened the swapped-in FIFO and hung"
    built = outcome[0]
    assert isinstance(built, tls_module.BackendTLS), built  # what was read and checked
    assert built.files == (tmp_path / "client.pem", tmp_path / "client.key")
    assert built.files_changed()  # the swap is seen: the next reload reads it again


WORKER_ENV = {"OWNGATE_WORKERS": "2", "OWNGATE_WORKER_INDEX": "1"}
BAD_PEM = b"-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n"


@pytest.mark.parametrize("file", ["ca.pem", "client.pem"])
def test_a_tls_file_that_says_something_invalid_is_not_a_failed_read(
    tmp_path: Path, file: str
) -> None:
    """A CA or client certificate rewritten with invalid content is refused and waits for
    its next change, as invalid gateway.yaml content does: every worker reads the same
    file. Before, the SSLError (an OSError) behind the refusal counted as a read that
    failed: each worker of `serve --workers N` turned stale, refusing every request 503,
    and read it again at every look, logging each."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    ca = make_ca("ca", now=now)
    client = issue(ca, "client", now=now, client=True)
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem)
    (tmp_path / "client.pem").write_bytes(client.cert_pem)
    (tmp_path / "client.key").write_bytes(client.key_pem)
    tls = {"ca_file": "ca.pem", "client_cert_file": "client.pem", "client_key_file": "client.key"}
    gpu = {**backend("gpu", "https://127.0.0.1:9", "m"), "tls": tls}
    data = gateway_config([backend("gpu", "http://127.0.0.1:9", "m")]).model_dump(
        mode="json", exclude_none=True
    )
    data["backends"] = [gpu]
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(data))
    environ = {**WORKER_ENV, "OWNGATE_WORKER_RUNTIME_DIR": str(tmp_path)}
    app = create_app(load_config(path), environ=environ, config_dir=tmp_path, config_file=path)
    reloader = app.reloader
    assert reloader is not None and reloader.among_workers

    async def looks(count: int) -> None:
        for _ in range(count):
            await reloader.poll()

    asyncio.run(looks(3))  # the first settled look after start
    running = app.parts.registry
    (tmp_path / file).write_bytes(BAD_PEM)
    asyncio.run(looks(6))  # bounded: settles in two looks; no retry after
    assert reloader.reload_failures == 1
    assert reloader.last_error is not None and "PEM" in reloader.last_error
    assert not reloader.stale  # before: stale, 503 to every request
    assert app.parts.registry is running  # the running config kept


def test_a_new_ca_file_invalid_at_the_reload_is_read_once_it_is_fixed(tmp_path: Path) -> None:
    """gateway.yaml names a new CA file (the old CA withdrawn) that is invalid when the
    reload reads it (written after gateway.yaml, or caught half written). It is refused;
    its fix is a change the reload watcher sees, as a refused config's policy files'.
    Before, only the running backends' TLS files were watched: the fixed file was never
    read, and the withdrawn CA stayed trusted until gateway.yaml changed again."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    old_ca, new_ca = make_ca("old", now=now), make_ca("new", now=now)
    (tmp_path / "ca.pem").write_bytes(old_ca.cert_pem)
    data = gateway_config([backend("gpu", "http://127.0.0.1:9", "m")]).model_dump(
        mode="json", exclude_none=True
    )
    data["backends"] = [
        {**backend("gpu", "https://127.0.0.1:9", "m"), "tls": {"ca_file": "ca.pem"}}
    ]
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(data))
    environ = {**WORKER_ENV, "OWNGATE_WORKER_RUNTIME_DIR": str(tmp_path)}
    app = create_app(load_config(path), environ=environ, config_dir=tmp_path, config_file=path)
    reloader = app.reloader
    assert reloader is not None

    async def looks(count: int) -> None:
        for _ in range(count):
            await reloader.poll()

    asyncio.run(looks(3))  # the first settled look after start
    running = app.parts.registry
    (tmp_path / "ca2.pem").write_bytes(BAD_PEM)  # not yet the new CA
    data["backends"][0]["tls"]["ca_file"] = "ca2.pem"
    path.write_text(yaml.safe_dump(data))
    asyncio.run(looks(6))  # bounded: settles in two looks
    assert reloader.reload_failures == 1
    assert app.parts.registry is running and not reloader.stale
    (tmp_path / "ca2.pem").write_bytes(new_ca.cert_pem)  # now it is
    asyncio.run(looks(6))
    assert reloader.last_error is None, reloader.last_error
    tls = app.parts.registry.backends["gpu"].tls
    assert tls is not None and tls.files == (tmp_path / "ca2.pem",)  # the old CA withdrawn
