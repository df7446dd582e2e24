"""A config reload racing the running policy set's own watcher never brings back an older
set than the one in force (gateway/api/reload.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.app import create_app
from gateway.config import load_config
from tests.helpers.gateways import backend, gateway_config
from tests.helpers.reload_files import POLICY, POLICY_SECTION, write


def test_a_policy_loaded_while_a_config_was_built_is_not_undone_by_a_failed_reread(
    tmp_path: Path,
) -> None:
    """A config reload compiles the policy files (version 1), then probes the backends.
    Meanwhile the running set's watcher loads version 2 (narrower), and the file is then
    caught invalid (the next edit, half written). The reload reads the files again before
    its swap and that read fails: it must not install the version 1 it compiled first,
    older than what is enforced; it keeps the running config whole (the breaker settings
    the new config's assembly gave the backend it keeps too) and says why."""
    (tmp_path / "policies").mkdir()
    policy = tmp_path / "policies" / "p.yaml"
    policy.write_text(POLICY)
    probed, answer = asyncio.Event(), asyncio.Event()

    async def slow_backend(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        probed.set()
        await answer.wait()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    async def scenario() -> tuple[str, bool, int | None, int, str | None]:
        server = await asyncio.start_server(slow_backend, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        def text(concurrent: int) -> str:
            data = gateway_config(
                [backend("gpu", f"http://127.0.0.1:{port}", "m")],
                scrape={"timeout_s": 10.0, "staleness_s": 20.0},
            ).model_dump(mode="json", exclude_none=True)
            data["tenants"][0]["limits"] = {"concurrent_requests": concurrent}
            data["routing"] = {"breaker": {"failure_threshold": concurrent * 3}}
            return yaml.safe_dump(data) + POLICY_SECTION

        path = tmp_path / "gateway.yaml"
        write(path, text(1), 1_000_000_000)
        app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
        assert app.reloader is not None
        write(path, text(2), 2_000_000_000)
        reloading = asyncio.create_task(app.reloader.reload())
        await asyncio.wait_for(probed.wait(), 10.0)  # built, probing before the swap
        write(policy, POLICY.replace('version: "1"', 'version: "2"'), 3_000_000_000)
        assert app.policies.reload()  # what the running set's watcher does meanwhile
        write(policy, "apiVersion: [", 4_000_000_000)  # the next edit, caught half written
        answer.set()
        installed = await asyncio.wait_for(reloading, 15.0)
        server.close()
        limit = app.parts.config.tenants[0].limits.concurrent_requests
        breaker = app.parts.registry.backends["gpu"].breaker.settings.failure_threshold
        return (
            app.policies.latest().compiled("p").version,
            installed,
            limit,
            breaker,
            app.reloader.last_error,
        )

    version, installed, limit, breaker, error = asyncio.run(scenario())
    assert version == "2", "the reload brought back a policy set older than the one in force"
    assert not installed
    assert (limit, breaker) == (1, 3), "part of the config not installed was applied"
    assert error is not None


TAIL = "  backends: {deny: [gpu]}\n"  # the last line: a file cut before it admits gpu


def _torn_rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Path]:
    """A gateway whose policy (version 1) denies gpu, served from its file; its policy
    file then caught being written: version 2 read without its last line (a weaker set,
    still valid), the line written once the read is done (the next read only)."""
    import gateway.policy.loader
    import gateway.policy_set

    (tmp_path / "policies").mkdir()
    policy = tmp_path / "policies" / "p.yaml"
    write(policy, POLICY + TAIL, 1_000_000_000)
    path = tmp_path / "gateway.yaml"
    config = gateway_config([backend("gpu", "http://127.0.0.1:9", "m")])
    data = config.model_dump(mode="json", exclude_none=True)
    write(path, yaml.safe_dump(data) + POLICY_SECTION, 1_000_000_000)
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    write(policy, POLICY.replace('version: "1"', 'version: "2"'), 2_000_000_000)
    real = gateway.policy.loader.load_policies
    calls: list[int] = []

    def read_then_finished(*args: Any, **kwargs: Any) -> Any:
        read = real(*args, **kwargs)
        if not calls:
            calls.append(1)
            text = POLICY.replace('version: "1"', 'version: "2"') + TAIL
            write(policy, text, 3_000_000_000)
        return read

    monkeypatch.setattr(gateway.policy_set, "load_policies", read_then_finished)
    return app, path


def test_a_sighup_never_loads_a_policy_file_caught_being_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGHUP (and the admin API's reload) read the policy files at once, without
    waiting for them to hold still: one read while it was being written, cut short but
    still valid and weaker (gpu admitted), was enforced until the next change."""
    app, _path = _torn_rig(tmp_path, monkeypatch)
    assert not asyncio.run(app.reloader.reload())
    trust = app.policies.latest()
    assert trust.compiled("p").version == "1", "a policy file caught half written was loaded"
    assert trust.decide("acme", "m", None).private == ()
    assert app.policies.last_error is not None
    assert "changed while they were read" in app.policies.last_error


def test_a_config_reload_never_installs_a_policy_file_caught_being_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same when gateway.yaml changed too: the new config is built with the files
    as read; it is not installed (a reload failure, retried when they change)."""
    app, path = _torn_rig(tmp_path, monkeypatch)
    data = yaml.safe_load(path.read_text())
    data["tenants"][0]["limits"] = {"concurrent_requests": 7}
    write(path, yaml.safe_dump(data), 2_000_000_000)
    assert not asyncio.run(app.reloader.reload())
    trust = app.policies.latest()
    assert trust.compiled("p").version == "1", "a policy file caught half written was loaded"
    assert trust.decide("acme", "m", None).private == ()
    assert app.parts.config.tenants[0].limits.concurrent_requests is None
    assert app.reloader.last_error == "policy files: they changed while they were read"
