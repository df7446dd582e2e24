"""What the gateway.yaml watcher does with a file caught being written or replaced by
something that is not a config: it keeps the running config, and keeps watching.

A file caught half written is never loaded: the poll reloads only once a change has held
still for a whole interval. (A file cut before its `policy:` section is still a valid
config, under the built-in policy: every private backend for every tenant, whatever the
policy files restricted.)"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from gateway.api import reload as reload_module
from gateway.app import create_app
from gateway.config import ConfigError, GatewaySettings, load_config
from gateway.config.loader import load_config_file
from gateway.policy import PolicySet
from gateway.policy_set import TrustPolicies
from tests.helpers.gateways import backend, gateway_config
from tests.helpers.reload_files import POLICY, POLICY_SECTION, write


def config_text(concurrent: int) -> str:
    """The config with its `policy:` section last, as an operator might order it."""
    data = gateway_config([backend("gpu", "http://127.0.0.1:9", "m")]).model_dump(
        mode="json", exclude_none=True
    )
    data["tenants"][0]["limits"] = {"concurrent_requests": concurrent}
    return yaml.safe_dump(data) + POLICY_SECTION


def test_a_half_written_config_is_never_loaded(tmp_path: Path) -> None:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(POLICY)
    path = tmp_path / "gateway.yaml"
    write(path, config_text(1), 1_000_000_000)
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    reloader = app.reloader
    assert reloader is not None and app.policies.configured

    async def edit() -> list[bool]:
        looks: list[bool] = []
        complete = config_text(2)
        # The editor is caught after the tenants, before the `policy:` section ...
        write(path, complete.removesuffix(POLICY_SECTION), 2_000_000_000)
        looks.append(await reloader.poll())
        assert app.policies.configured, "the built-in policy replaced the policy files"
        # ... and finishes before the next look.
        write(path, complete, 3_000_000_000)
        for _ in range(3):
            looks.append(await reloader.poll())
            assert app.policies.configured
        return looks

    assert asyncio.run(edit()) == [False, False, True, False]
    assert app.parts.config.tenants[0].limits.concurrent_requests == 2
    assert app.policies.current.id != "builtin-private-only"


def test_a_config_replaced_by_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    """Opening a FIFO for reading waits for a writer: on the event loop, for ever."""
    fifo = tmp_path / "gateway.yaml"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            load_config(fifo)
            outcome.append(None)
        except ConfigError as exc:
            outcome.append(exc)

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(timeout=5.0)
    blocked = reader.is_alive()
    if blocked:  # let the old reader go: a writer that closes at once gives it EOF
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=5.0)
    assert not blocked, "load_config waited on the FIFO"
    assert isinstance(outcome[0], ConfigError)
    assert "not a regular file" in str(outcome[0])


def test_a_config_that_is_not_utf8_keeps_the_watcher_running(tmp_path: Path) -> None:
    """A file cut inside a multi-byte character (or any non-UTF-8 byte) is a failed
    reload, reported; the next good file is still picked up by the same watcher."""
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(POLICY)
    path = tmp_path / "gateway.yaml"
    write(path, config_text(1), 1_000_000_000)
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    reloader = app.reloader
    assert reloader is not None

    async def edit() -> list[bool]:
        looks: list[bool] = []
        cut = config_text(2).encode().replace(b"acme", "acm\u00e9".encode()[:-1], 1)
        path.write_bytes(cut)
        os.utime(path, ns=(2_000_000_000, 2_000_000_000))
        looks += [await reloader.poll(), await reloader.poll()]
        assert reloader.last_error is not None and "UTF-8" in reloader.last_error
        write(path, config_text(3), 3_000_000_000)
        looks += [await reloader.poll(), await reloader.poll()]
        return looks

    assert asyncio.run(edit()) == [False, False, False, True]
    assert app.parts.config.tenants[0].limits.concurrent_requests == 3
    assert reloader.reload_failures == 1


def test_a_config_read_half_written_at_start_is_replaced_once_the_file_settles(
    tmp_path: Path,
) -> None:
    """A worker (re)started by `serve --workers` while an editor writes gateway.yaml reads
    half of it; the write ends before the watcher exists. The watcher must still load the
    finished file, not take its stamp for the one that was read."""
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(POLICY)
    path = tmp_path / "gateway.yaml"
    complete = config_text(2)
    write(path, complete.removesuffix(POLICY_SECTION), 1_000_000_000)
    read_at_start = load_config(path)  # cut before `policy:`: the built-in policy
    write(path, complete, 2_000_000_000)  # ... and the editor finishes
    app = create_app(read_at_start, environ={}, config_dir=tmp_path, config_file=path)
    reloader = app.reloader
    assert reloader is not None and not app.policies.configured

    async def looks() -> list[bool]:
        return [await reloader.poll() for _ in range(3)]

    assert asyncio.run(looks()) == [False, True, False]
    assert app.policies.configured


def test_a_reload_reads_and_parses_the_file_off_the_event_loop(tmp_path: Path) -> None:
    """Parsing a large keys file takes seconds: on the event loop, every stream in flight
    would stall for them. `prepare` runs right after the parse: it waits for the loop to
    answer, which it can only do if the reload is not holding it."""
    path = tmp_path / "gateway.yaml"
    write(path, config_text(1).removesuffix(POLICY_SECTION), 1_000_000_000)
    loop_answered = threading.Event()
    held: list[bool] = []

    def prepare(config: GatewaySettings) -> GatewaySettings:
        held.append(not loop_answered.wait(timeout=5.0))
        return config

    app = create_app(
        load_config(path), environ={}, config_dir=tmp_path, config_file=path, prepare=prepare
    )
    reloader = app.reloader
    assert reloader is not None

    async def answer() -> None:
        await asyncio.sleep(0)
        loop_answered.set()

    async def both() -> None:
        await asyncio.gather(reloader.reload(), answer())

    asyncio.run(both())
    assert held == [False], "the reload held the event loop while it parsed"


def test_policies_reloaded_while_a_config_was_being_built_are_not_undone(
    tmp_path: Path,
) -> None:
    """A config reload compiles the policy files, then probes the backends (seconds,
    for a slow one) before it installs what it built. A policy change the running set
    loaded meanwhile (its watcher does not stop) must not be replaced by the older read."""
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

    async def scenario() -> str:
        server = await asyncio.start_server(slow_backend, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        def text(concurrent: int) -> str:
            data = gateway_config(
                [backend("gpu", f"http://127.0.0.1:{port}", "m")],
                scrape={"timeout_s": 10.0, "staleness_s": 20.0},
            ).model_dump(mode="json", exclude_none=True)
            data["tenants"][0]["limits"] = {"concurrent_requests": concurrent}
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
        answer.set()
        assert await asyncio.wait_for(reloading, 15.0)
        server.close()
        assert app.parts.config.tenants[0].limits.concurrent_requests == 2
        return app.policies.current.compiled("p").version

    assert asyncio.run(scenario()) == "2"


def test_a_storm_of_sighups_queues_one_reload(tmp_path: Path) -> None:
    """Each SIGHUP queued a whole reload (seconds each with a large keys file): a storm of
    them kept the gateway reparsing for as long. One waiting reload covers the signals
    that came before it starts; a signal during a reload still gets one after it."""
    path = tmp_path / "gateway.yaml"
    write(path, config_text(1).removesuffix(POLICY_SECTION), 1_000_000_000)
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    reloader = app.reloader
    assert reloader is not None
    write(path, "tenants: [", 2_000_000_000)  # invalid: every reload counts a failure

    async def storm() -> list[int]:
        counts = []
        for _ in range(100):
            reloader.trigger()
        await asyncio.sleep(0)  # the triggered reload takes the lock
        await reloader.reload()  # queued behind the triggered ones: all ran when it returns
        counts.append(reloader.reload_failures)
        running = asyncio.create_task(reloader.reload())
        await asyncio.sleep(0)  # it holds the lock now, reading the file on a thread
        reloader.trigger()  # a signal during a reload: one more after it
        await asyncio.sleep(0)  # queued for the lock before the next line's
        await reloader.reload()
        await running
        counts.append(reloader.reload_failures)
        return counts

    assert asyncio.run(storm()) == [2, 5]


def test_a_config_refused_for_missing_policy_files_is_retried_when_they_arrive(
    tmp_path: Path,
) -> None:
    """A deploy that writes gateway.yaml (naming new policy files) before the files: the
    reload is refused, and must be retried once they are there. It was not: the process
    (or one worker of several, the others having read later) kept the old config until
    gateway.yaml itself changed again."""
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(POLICY)
    path = tmp_path / "gateway.yaml"
    write(path, config_text(1), 1_000_000_000)
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    reloader = app.reloader
    assert reloader is not None
    moved = config_text(2).replace("paths: [policies]", "paths: [policies-v2]")

    async def deploy() -> list[bool]:
        write(path, moved, 2_000_000_000)
        looks = [await reloader.poll() for _ in range(3)]  # refused: no policies-v2 yet
        assert reloader.last_error is not None and "policies-v2" in reloader.last_error
        (tmp_path / "policies-v2").mkdir()
        write(tmp_path / "policies-v2" / "p.yaml", POLICY, 3_000_000_000)
        looks += [await reloader.poll() for _ in range(3)]
        return looks

    assert asyncio.run(deploy()) == [False, False, False, False, True, False]
    assert reloader.last_error is None
    assert app.parts.config.tenants[0].limits.concurrent_requests == 2
    assert reloader.reload_failures == 1


def test_an_unexpected_error_in_a_sighup_reload_is_a_reported_failure(tmp_path: Path) -> None:
    """Only ConfigError was caught on the SIGHUP path: anything else (PyYAML's error for
    a tagged value, before the loader refused tags) ended the signal's task unreported,
    and the stamp it had taken kept the poll from retrying the file."""
    path = tmp_path / "gateway.yaml"
    write(path, config_text(1).removesuffix(POLICY_SECTION), 1_000_000_000)
    calls: list[int] = []

    def prepare(config: GatewaySettings) -> GatewaySettings:
        calls.append(config.tenants[0].limits.concurrent_requests or 0)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        return config

    app = create_app(
        load_config(path), environ={}, config_dir=tmp_path, config_file=path, prepare=prepare
    )
    reloader = app.reloader
    assert reloader is not None
    write(path, config_text(2).removesuffix(POLICY_SECTION), 2_000_000_000)

    async def signal() -> tuple[int, str | None]:
        reloader.trigger()
        (task,) = reloader._tasks  # the signal's reload
        await asyncio.wait_for(task, 30)  # it raised RuntimeError before
        return reloader.reload_failures, reloader.last_error

    assert asyncio.run(signal()) == (1, "unexpected error: RuntimeError")
    assert app.parts.config.tenants[0].limits.concurrent_requests == 1  # the running one


def test_the_watcher_outlives_an_unexpected_error(tmp_path: Path) -> None:
    """A bug in one reload (here: `prepare` raising) ended the watcher task, silently: no
    later change of the files was applied, a key removed from the keys file stayed valid
    until a restart. It is a failed reload, reported, and the next change is applied."""
    path = tmp_path / "gateway.yaml"
    write(path, config_text(1).removesuffix(POLICY_SECTION), 1_000_000_000)
    calls: list[int] = []

    def prepare(config: GatewaySettings) -> GatewaySettings:
        calls.append(config.tenants[0].limits.concurrent_requests or 0)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        return config

    app = create_app(
        load_config(path), environ={}, config_dir=tmp_path, config_file=path, prepare=prepare
    )
    reloader = app.reloader
    assert reloader is not None
    reloader.interval_s = 0.01

    async def edits() -> None:
        watcher = asyncio.create_task(reloader.watch())
        write(path, config_text(2).removesuffix(POLICY_SECTION), 2_000_000_000)
        for _ in range(1000):  # bounded: 10 s
            if reloader.reload_failures:
                break
            await asyncio.sleep(0.01)
        write(path, config_text(3).removesuffix(POLICY_SECTION), 3_000_000_000)
        for _ in range(1000):
            if app.parts.config.tenants[0].limits.concurrent_requests == 3:
                break
            await asyncio.sleep(0.01)
        watcher.cancel()

    asyncio.run(edits())
    assert reloader.reload_failures == 1
    assert app.parts.config.tenants[0].limits.concurrent_requests == 3


def _reloads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_at: float, *, then: str | None = None
) -> list[bool]:
    """What three looks of the watcher do after the config was read at `read_at`, its file
    last written ten seconds before (`then`: written again after the read), and whether
    any of them parsed the file."""
    written = int((read_at - 10) * 1e9)
    (tmp_path / "policies").mkdir()
    write(tmp_path / "policies" / "p.yaml", POLICY, written)
    os.utime(tmp_path / "policies", ns=(written, written))
    path = tmp_path / "gateway.yaml"
    write(path, config_text(2), written)
    config = load_config(path)
    if then is not None:  # an edit that ended after the read, before the watcher existed
        edited = path if then != POLICY else tmp_path / "policies" / "p.yaml"
        write(edited, then, int((read_at + 0.5) * 1e9))
    app = create_app(
        config, environ={}, config_dir=tmp_path, config_file=path, config_read_at=read_at
    )
    reloader = app.reloader
    assert reloader is not None

    async def looks() -> list[bool]:
        return [await reloader.poll() for _ in range(3)]

    parsed: list[Path] = []

    def counted(file: Path, env: Mapping[str, str] | None = None) -> tuple[GatewaySettings, str]:
        parsed.append(file)
        return load_config_file(file, env)

    monkeypatch.setattr(reload_module, "load_config_file", counted)
    looked = asyncio.run(looks())
    return [*looked, bool(parsed)]


def test_a_config_settled_before_it_was_read_is_not_parsed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every process start parsed gateway.yaml (and its keys file: seconds for 20,000 keys,
    # beside the first requests) a second time at the watcher's first settled look; the
    # plain benchmark charged it to the measured requests (+131K instructions each).
    assert _reloads(tmp_path, monkeypatch, time.time()) == [False, False, False, False]


def test_a_config_written_after_it_was_read_is_still_reloaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    looks = _reloads(tmp_path, monkeypatch, time.time(), then=config_text(3))
    assert looks == [False, True, False, True]


def test_a_policy_file_written_after_the_config_was_read_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The policy set's own watcher stamps its files after reading them: the first look's
    # reload (which reads them again) is what catches one caught half written at start.
    looks = _reloads(tmp_path, monkeypatch, time.time(), then=POLICY)
    assert looks == [False, False, False, True]


def test_a_reload_assembles_the_new_config_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiling a large policy set and building TLS contexts take long: on the event
    loop, every stream in flight would stall for them. The new config's policy compile is
    made to wait until a task on the loop has run while it was compiling: it can only run
    if the reload is not holding the loop. The swap still happens, on the loop."""
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(POLICY)
    path = tmp_path / "gateway.yaml"
    write(path, config_text(1), 1_000_000_000)
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    reloader = app.reloader
    assert reloader is not None
    compiling, loop_ran = threading.Event(), threading.Event()
    held: list[bool] = []
    compile_policies = TrustPolicies._compile

    def slow_compile(self: TrustPolicies) -> PolicySet:
        compiling.set()
        held.append(not loop_ran.wait(timeout=10.0))
        return compile_policies(self)

    monkeypatch.setattr(TrustPolicies, "_compile", slow_compile)
    write(path, config_text(2), 2_000_000_000)

    async def loop_task() -> None:
        # Waits for the compile on a thread of its own, then runs on the loop again.
        assert await asyncio.to_thread(compiling.wait, 10.0), "the compile never started"
        loop_ran.set()

    async def both() -> list[bool]:
        return await asyncio.gather(reloader.reload(), loop_task())  # type: ignore[return-value]

    reloaded, _ = asyncio.run(both())
    assert held == [False], "the reload held the event loop while it assembled"
    assert reloaded and app.parts.config.tenants[0].limits.concurrent_requests == 2


def test_a_config_replaced_with_the_same_size_and_mtime_is_reloaded(tmp_path: Path) -> None:
    """gateway.yaml renamed into place by a tool that keeps the source's mtime (`cp -p`,
    `rsync -a`), of the same length (a limit 2 made 1): the stamp was (mtime, size), so
    the watcher never saw it and the old config stayed."""
    (tmp_path / "policies").mkdir()
    write(tmp_path / "policies" / "p.yaml", POLICY, 1_000_000_000)
    os.utime(tmp_path / "policies", ns=(1_000_000_000, 1_000_000_000))
    path = tmp_path / "gateway.yaml"
    write(path, config_text(2), 1_000_000_000)
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    reloader = app.reloader
    assert reloader is not None

    async def fresh() -> list[bool]:
        return [await reloader.poll() for _ in range(2)]

    async def replace() -> list[bool]:
        new = tmp_path / "gateway.yaml.new"
        write(new, config_text(1), 1_000_000_000)
        assert new.stat().st_size == path.stat().st_size
        new.replace(path)
        return [await reloader.poll() for _ in range(3)]

    assert asyncio.run(fresh()) == [False, False], "the first look reloaded anyway"
    assert True in asyncio.run(replace())
    assert app.parts.config.tenants[0].limits.concurrent_requests == 1
