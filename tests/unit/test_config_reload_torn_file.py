"""gateway.yaml caught being written by a reload (SIGHUP, the admin API, or the watcher's
look right after it saw the file hold still) is never installed (gateway/api/reload.py).

A config cut short is often still a valid config, and a weaker one: cut before its
`policy:` section it means the built-in policy, which admits every private backend
serving the model, whatever region or retention the policy files forbid."""

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

DENY_GPU = "  backends: {deny: [gpu]}\n"  # the policy's last line: gpu is never admitted


def _rig(tmp_path: Path) -> tuple[Any, Path, str]:
    """A gateway whose policy file denies its one backend, gpu; and the text of its
    gateway.yaml's next version (a tenant limit added), whose `policy:` section is last."""
    (tmp_path / "policies").mkdir()
    write(tmp_path / "policies" / "p.yaml", POLICY + DENY_GPU, 1_000_000_000)
    path = tmp_path / "gateway.yaml"
    data = gateway_config([backend("gpu", "http://127.0.0.1:9", "m")]).model_dump(
        mode="json", exclude_none=True
    )
    write(path, yaml.safe_dump(data) + POLICY_SECTION, 1_000_000_000)
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    assert app.policies.latest().decide("acme", "m", None).private == ()
    data["tenants"][0]["limits"] = {"concurrent_requests": 7}
    return app, path, yaml.safe_dump(data) + POLICY_SECTION


def _finished_after_the_read(monkeypatch: pytest.MonkeyPatch, path: Path, text: str) -> None:
    """The reload's read of gateway.yaml finds it cut before its `policy:` section (still
    a valid config); the writer finishes it once that read is done."""
    import gateway.api.reload
    import gateway.config.loader

    real = gateway.config.loader.load_config_file
    calls: list[int] = []

    def read_then_finished(*args: Any, **kwargs: Any) -> Any:
        read = real(*args, **kwargs)
        if not calls:
            calls.append(1)
            write(path, text, 3_000_000_000)
        return read

    monkeypatch.setattr(gateway.api.reload, "load_config_file", read_then_finished)


def test_a_reload_never_installs_a_config_file_caught_being_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, path, text = _rig(tmp_path)
    write(path, text.removesuffix(POLICY_SECTION), 2_000_000_000)  # cut short, being written
    _finished_after_the_read(monkeypatch, path, text)
    assert not asyncio.run(app.reloader.reload())
    assert app.parts.config.policy is not None, "a config file caught half written was installed"
    assert app.policies.latest().decide("acme", "m", None).private == ()
    assert app.reloader.last_error is not None
    assert "changed while it was read" in app.reloader.last_error


def test_a_config_caught_being_written_is_loaded_once_it_holds_still(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refused read is no lost change: the watcher's looks find the finished file
    (another stamp than the one taken before the read) and load it once it holds still."""
    app, path, text = _rig(tmp_path)
    write(path, text.removesuffix(POLICY_SECTION), 2_000_000_000)
    _finished_after_the_read(monkeypatch, path, text)

    async def scenario() -> list[bool]:
        assert not await app.reloader.reload()
        return [await app.reloader.poll() for _ in range(2)]

    assert asyncio.run(scenario()) == [False, True]
    assert app.parts.config.tenants[0].limits.concurrent_requests == 7
    assert app.parts.config.policy is not None
    assert app.policies.latest().decide("acme", "m", None).private == ()


def test_a_look_never_installs_a_config_file_rewritten_after_it_held_still(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watcher's look sees the file hold still, then the next edit starts (truncated,
    partly written) before the reload reads it: what it reads is not what held still."""
    import gateway.api.reload
    import gateway.config.loader

    app, path, text = _rig(tmp_path)
    write(path, text, 2_000_000_000)
    real = gateway.config.loader.load_config_file

    def edited_before_the_read(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(gateway.api.reload, "load_config_file", real)
        write(path, text.removesuffix(POLICY_SECTION), 3_000_000_000)  # the next edit
        return real(*args, **kwargs)

    async def scenario() -> list[bool]:
        assert not await app.reloader.poll()  # the change seen once
        monkeypatch.setattr(gateway.api.reload, "load_config_file", edited_before_the_read)
        return [await app.reloader.poll()]  # held still: reloads, and reads the next edit

    assert asyncio.run(scenario()) == [False]
    assert app.parts.config.policy is not None, "a config file caught half written was installed"
    assert app.policies.latest().decide("acme", "m", None).private == ()


def test_a_look_never_reads_a_file_edited_again_while_it_waited_for_a_reload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look sees the file hold still, but a SIGHUP's reload holds the lock; meanwhile
    the next edit starts (cut before `policy:`, and the writer pauses). The look's reload,
    once it runs, read that edit whole (unchanged while read) and installed it: the file
    it saw hold still is not the one it read."""
    import threading

    import gateway.api.reload
    import gateway.config.loader

    app, path, text = _rig(tmp_path)
    real = gateway.config.loader.load_config_file
    reading, go_on = threading.Event(), threading.Event()

    def held(*args: Any, **kwargs: Any) -> Any:
        reading.set()
        go_on.wait(10.0)
        return real(*args, **kwargs)

    async def scenario() -> bool:
        write(path, text, 2_000_000_000)
        assert not await app.reloader.poll()  # the change seen once
        monkeypatch.setattr(gateway.api.reload, "load_config_file", held)
        sighup = asyncio.create_task(app.reloader.reload())  # holds the lock, reading
        await asyncio.to_thread(reading.wait, 10.0)
        look = asyncio.create_task(app.reloader.poll())  # held still: waits for the lock
        await asyncio.sleep(0)
        write(path, text.removesuffix(POLICY_SECTION), 3_000_000_000)  # the next edit
        monkeypatch.setattr(gateway.api.reload, "load_config_file", real)
        go_on.set()
        await sighup
        return bool(await look)

    assert not asyncio.run(scenario())
    assert app.parts.config.policy is not None, "a config file caught half written was installed"
    assert app.policies.latest().decide("acme", "m", None).private == ()


def test_a_config_read_at_start_while_it_was_written_is_not_served(tmp_path: Path) -> None:
    """`serve` (or a worker the supervisor restarted) read gateway.yaml while an editor
    was writing it: cut before `policy:`, it ran under the built-in policy (gpu admitted,
    which the policy files deny) until the first settled look reloaded it. It refuses
    requests (`stale`: 503, not ready) until that look has read the file whole."""
    import time

    app, path, text = _rig(tmp_path)  # only its files: the gateway below is started anew
    write(path, text.removesuffix(POLICY_SECTION), 1_000_000_000)
    read_at = time.time()  # `serve` begins reading: the file cut short
    torn = load_config(path)
    write(path, text, int(read_at * 1e9) + 1)  # the editor finishes, after the read began
    app = create_app(
        torn, environ={}, config_dir=tmp_path, config_file=path, config_read_at=read_at
    )
    assert app.parts.config.policy is None  # what was read: the built-in policy
    reloader = app.reloader
    assert reloader is not None
    assert reloader.stale, "a config read while it was being written was served"

    async def looks() -> list[bool]:
        return [await reloader.poll() for _ in range(2)]

    assert asyncio.run(looks()) == [False, True]
    assert not reloader.stale
    assert app.parts.config.policy is not None
    assert app.policies.latest().decide("acme", "m", None).private == ()


@pytest.mark.parametrize(
    ("stamped", "clock"),
    [
        (lambda read_at: int(read_at) * 1_000_000_000, "a whole-second file system"),
        (lambda read_at: int(read_at * 1e9) - 5_000_000, "the kernel's clock a tick behind"),
    ],
)
def test_a_config_written_during_the_read_but_stamped_before_it_is_not_served(
    tmp_path: Path, stamped: Any, clock: str
) -> None:
    """The editor finished gateway.yaml after `serve` began reading it, but the stamp it
    got is earlier than `read_at`: a file system keeping whole seconds rounds it down to
    the second, the kernel stamps from a clock that moves once a tick. Compared with no
    slack, the torn config (the built-in policy: gpu admitted) was served until the
    first settled look."""
    import time

    app, path, text = _rig(tmp_path)
    write(path, text.removesuffix(POLICY_SECTION), 1_000_000_000)
    read_at = int(time.time()) + 0.5  # half a second in: a whole-second stamp is before it
    torn = load_config(path)
    write(path, text, stamped(read_at))  # finished during the read, stamped before it
    assert path.stat().st_mtime_ns < int(read_at * 1e9)
    app = create_app(
        torn, environ={}, config_dir=tmp_path, config_file=path, config_read_at=read_at
    )
    reloader = app.reloader
    assert reloader is not None
    assert reloader.stale, f"a config written during its read was served ({clock})"

    async def looks() -> list[bool]:
        return [await reloader.poll() for _ in range(2)]

    assert asyncio.run(looks()) == [False, True]
    assert not reloader.stale
    assert app.policies.latest().decide("acme", "m", None).private == ()


@pytest.mark.parametrize(
    ("stamped", "what"),
    [
        (lambda read_at: (int(read_at) - 3) * 1_000_000_000, "a whole second 3.5 s before"),
        (lambda read_at: int(read_at * 1e9) - 100_000_001, "a fine stamp 0.1 s before"),
    ],
)
def test_a_config_written_well_before_the_read_is_served(
    tmp_path: Path, stamped: Any, what: str
) -> None:
    """The slack is bounded: a file last written well before the reading began (as
    `serve` restarted on an unchanged file) is served at once."""
    import time

    _, path, text = _rig(tmp_path)
    read_at = int(time.time()) + 0.5
    write(path, text, stamped(read_at))
    app = create_app(
        load_config(path), environ={}, config_dir=tmp_path, config_file=path, config_read_at=read_at
    )
    assert app.reloader is not None
    assert not app.reloader.stale, f"{what}: refused"
