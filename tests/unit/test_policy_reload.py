"""Reloading the policy files: a file caught half written is never loaded (the poll
reloads only once a change has held still for a whole interval; a file cut before a
class's `fallback: never` line still parses, as a weaker policy), a file too large is
refused, the watcher compiles off the event loop, and reads apply in the order they
started."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from gateway.policy import PolicySet
from gateway.policy_set import TrustPolicies
from tests.helpers.gateways import backend, gateway_config

HEAD = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: p, version: "VERSION"}
spec:
  tenants: [acme]
  residency: {allow: ["*"]}
  retention: {max_days: any, training: true}
  fallback: {mode: when_private_unavailable, to: []}
  data_classes:
    phi:
      description: patient data
"""
TAIL = """\
      fallback: {mode: never}
"""


def write(path: Path, text: str, mtime_ns: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(mtime_ns, mtime_ns))  # each write its own stamp, whatever the clock


def started_while_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TrustPolicies:
    """`TrustPolicies` made from a policy file caught half written (version 1, its class
    cut before `fallback: never`) and finished (version 2) while the loader compiled it."""
    import gateway.policy.loader
    import gateway.policy_set

    policy = tmp_path / "p.yaml"
    write(policy, HEAD.replace("VERSION", "1"), 1_000_000_000)  # caught half written
    config = gateway_config(
        [backend("gpu", "http://127.0.0.1:9", "m")], policy={"paths": ["p.yaml"]}
    )
    real = gateway.policy.loader.load_policies

    def read_then_finished(*args: Any, **kwargs: Any) -> PolicySet:
        read = real(*args, **kwargs)
        write(policy, HEAD.replace("VERSION", "2") + TAIL, 2_000_000_000)
        return read

    monkeypatch.setattr(gateway.policy_set, "load_policies", read_then_finished)
    trust = TrustPolicies(config, tmp_path)
    monkeypatch.setattr(gateway.policy_set, "load_policies", real)
    return trust


def test_a_half_written_policy_is_never_loaded(tmp_path: Path) -> None:
    policy = tmp_path / "policies" / "p.yaml"
    policy.parent.mkdir()
    write(policy, HEAD.replace("VERSION", "1") + TAIL, 1_000_000_000)
    config = gateway_config(
        [backend("gpu", "http://127.0.0.1:9", "m")], policy={"paths": ["policies"]}
    )
    trust = TrustPolicies(config, tmp_path)
    assert trust.current.compiled("p").version == "1"

    loaded: list[str] = []
    # The writer is caught after the class's description, before its fallback line:
    write(policy, HEAD.replace("VERSION", "2"), 2_000_000_000)
    if trust.poll():
        loaded.append(trust.current.compiled("p").version)
    # ... and finishes before the next look.
    write(policy, HEAD.replace("VERSION", "2") + TAIL, 3_000_000_000)
    for _ in range(3):
        if trust.poll():
            loaded.append(trust.current.compiled("p").version)
    assert loaded == ["2"]
    phi = trust.current.compiled("p")
    assert "phi" in phi.classes
    assert trust.current.decide("acme", "m", "phi").fallback == "never"


def test_an_unchanged_file_is_not_reloaded(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    write(policy, HEAD.replace("VERSION", "1") + TAIL, 1_000_000_000)
    config = gateway_config(
        [backend("gpu", "http://127.0.0.1:9", "m")], policy={"paths": ["p.yaml"]}
    )
    trust = TrustPolicies(config, tmp_path)
    assert [trust.poll() for _ in range(3)] == [False, False, False]


def test_a_policy_file_too_large_to_be_one_is_refused(tmp_path: Path) -> None:
    """A policy path pointing at a huge file (a log, an image) would be read whole and
    parsed on the event loop for minutes: refused, and the last good set stays."""
    policy = tmp_path / "p.yaml"
    write(policy, HEAD.replace("VERSION", "1") + TAIL, 1_000_000_000)
    config = gateway_config(
        [backend("gpu", "http://127.0.0.1:9", "m")], policy={"paths": ["p.yaml"]}
    )
    trust = TrustPolicies(config, tmp_path)
    padding = "#" * 99 + "\n"
    huge = HEAD.replace("VERSION", "2") + TAIL + padding * 11_000  # over the 1 MiB bound
    write(policy, huge, 2_000_000_000)
    assert not trust.reload()
    assert trust.current.compiled("p").version == "1"
    assert trust.last_error is not None and "larger than" in trust.last_error


def test_a_policy_file_finished_while_it_was_compiled_is_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files' stamp is taken before they are read: a writer that finishes between
    the read and the stamp would otherwise leave the half it read active for good."""
    trust = started_while_written(tmp_path, monkeypatch)
    assert trust.current.compiled("p").version == "1"
    assert [trust.poll() for _ in range(3)] == [False, True, False]
    assert trust.current.compiled("p").version == "2"
    assert trust.current.decide("acme", "m", "phi").fallback == "never"


def test_the_watcher_compiles_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A policy set of a few hundred kilobytes takes seconds to compile: on the event
    loop, every stream in flight would stall for them. The compile waits for the loop to
    answer, which it can only do if the watcher is not holding it."""
    import gateway.policy.loader
    import gateway.policy_set

    policy = tmp_path / "p.yaml"
    write(policy, HEAD.replace("VERSION", "1") + TAIL, 1_000_000_000)
    config = gateway_config(
        [backend("gpu", "http://127.0.0.1:9", "m")],
        policy={"paths": ["p.yaml"], "reload_interval_s": 0.01},
    )
    trust = TrustPolicies(config, tmp_path)
    real = gateway.policy.loader.load_policies
    compiling, loop_answered = threading.Event(), threading.Event()
    held: list[bool] = []

    def slow(*args: Any, **kwargs: Any) -> PolicySet:
        compiling.set()
        held.append(not loop_answered.wait(timeout=5.0))
        return real(*args, **kwargs)

    monkeypatch.setattr(gateway.policy_set, "load_policies", slow)

    async def change() -> None:
        watcher = asyncio.create_task(trust.watch())
        write(policy, HEAD.replace("VERSION", "2") + TAIL, 2_000_000_000)
        for _ in range(1000):  # bounded: 10 s
            if compiling.is_set():
                break
            await asyncio.sleep(0.01)
        loop_answered.set()  # runs only while the loop is free during the compile
        for _ in range(1000):
            if trust.current.compiled("p").version == "2":
                break
            await asyncio.sleep(0.01)
        watcher.cancel()

    asyncio.run(change())
    assert held == [False], "the watcher held the event loop while it compiled"
    assert trust.current.compiled("p").version == "2"


def test_a_read_that_started_earlier_never_undoes_a_later_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watcher compiles on a thread; SIGHUP (or a config reload) meanwhile reads the
    files again on the loop. The thread's read, older, must not be applied after it."""
    import gateway.policy.loader
    import gateway.policy_set

    policy = tmp_path / "p.yaml"
    write(policy, HEAD.replace("VERSION", "1") + TAIL, 1_000_000_000)
    config = gateway_config(
        [backend("gpu", "http://127.0.0.1:9", "m")], policy={"paths": ["p.yaml"]}
    )
    trust = TrustPolicies(config, tmp_path)
    real = gateway.policy.loader.load_policies
    read, finish = threading.Event(), threading.Event()

    def held_on_thread(*args: Any, **kwargs: Any) -> PolicySet:
        compiled = real(*args, **kwargs)
        if threading.current_thread() is not threading.main_thread():
            read.set()
            finish.wait(timeout=10.0)
        return compiled

    monkeypatch.setattr(gateway.policy_set, "load_policies", held_on_thread)

    async def race() -> bool:
        write(policy, HEAD.replace("VERSION", "2") + TAIL, 2_000_000_000)
        older = asyncio.create_task(trust.reload_off_loop())
        assert await asyncio.to_thread(read.wait, 10.0)
        write(policy, HEAD.replace("VERSION", "3") + TAIL, 3_000_000_000)
        assert trust.reload()  # SIGHUP: version 3
        finish.set()
        return await older

    assert asyncio.run(race()) is False
    assert trust.current.compiled("p").version == "3"


def test_the_watcher_outlives_an_unexpected_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in one compile ended the watcher task, silently: no later policy change
    (an emergency tightening) was enforced. It is a failed reload, and the next applies."""
    import gateway.policy.loader
    import gateway.policy_set

    policy = tmp_path / "p.yaml"
    write(policy, HEAD.replace("VERSION", "1") + TAIL, 1_000_000_000)
    config = gateway_config(
        [backend("gpu", "http://127.0.0.1:9", "m")],
        policy={"paths": ["p.yaml"], "reload_interval_s": 0.01},
    )
    trust = TrustPolicies(config, tmp_path)
    real = gateway.policy.loader.load_policies
    calls: list[int] = []

    def buggy_once(*args: Any, **kwargs: Any) -> PolicySet:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        return real(*args, **kwargs)

    monkeypatch.setattr(gateway.policy_set, "load_policies", buggy_once)

    async def edits() -> None:
        watcher = asyncio.create_task(trust.watch())
        write(policy, HEAD.replace("VERSION", "2") + TAIL, 2_000_000_000)
        for _ in range(1000):  # bounded: 10 s
            if calls:
                break
            await asyncio.sleep(0.01)
        write(policy, HEAD.replace("VERSION", "3") + TAIL, 3_000_000_000)
        for _ in range(1000):
            if trust.current.compiled("p").version == "3":
                break
            await asyncio.sleep(0.01)
        watcher.cancel()

    asyncio.run(edits())
    assert trust.reload_failures == 1
    assert trust.current.compiled("p").version == "3"


def test_a_file_replaced_with_the_same_size_and_mtime_is_reloaded(tmp_path: Path) -> None:
    """A narrower policy of the same length put in place by a tool that keeps the source's
    mtime (`cp -p` then `mv`, `rsync -a`, an archive of normalized mtimes): the stamp was
    (mtime, size) only, so the watcher never saw the change and the wider set stayed."""
    policy = tmp_path / "p.yaml"
    write(policy, HEAD.replace("VERSION", "1") + TAIL, 1_000_000_000)
    config = gateway_config(
        [backend("gpu", "http://127.0.0.1:9", "m")], policy={"paths": ["p.yaml"]}
    )
    trust = TrustPolicies(config, tmp_path)
    narrower = tmp_path / "p.yaml.new"
    write(narrower, HEAD.replace("VERSION", "2").replace('["*"]', "[ eu]") + TAIL, 1_000_000_000)
    assert narrower.stat().st_size == policy.stat().st_size
    narrower.replace(policy)
    loaded = [trust.current.compiled("p").version for _ in range(3) if trust.poll()]
    assert loaded == ["2"]


def test_a_look_never_loads_a_file_rewritten_after_it_held_still(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look sees the finished file hold still; before its read begins (the watcher's
    read starts on a worker thread), the next edit truncates the file and writes it up to
    the class's description, then pauses. The read found those files unchanged while it
    read them and loaded them: not the files that held still, and weaker (phi falls
    back). They are loaded once they hold still, never at that look."""
    import gateway.policy_set

    policy = tmp_path / "policies" / "p.yaml"
    policy.parent.mkdir()
    write(policy, HEAD.replace("VERSION", "1") + TAIL, 1_000_000_000)
    config = gateway_config(
        [backend("gpu", "http://127.0.0.1:9", "m")], policy={"paths": ["policies"]}
    )
    trust = TrustPolicies(config, tmp_path)
    write(policy, HEAD.replace("VERSION", "2") + TAIL, 2_000_000_000)
    assert not trust.poll()  # the change seen once
    real = gateway.policy_set.policy_stamps
    stamps: list[int] = []

    def edited_once_seen_still(paths: Any) -> Any:
        stamps.append(1)
        if len(stamps) == 2:  # the look has seen it hold still; its read begins
            write(policy, HEAD.replace("VERSION", "3"), 3_000_000_000)
        return real(paths)

    monkeypatch.setattr(gateway.policy_set, "policy_stamps", edited_once_seen_still)
    trust.poll()
    assert trust.current.decide("acme", "m", "phi").fallback == "never", (
        "a policy file caught half written was loaded"
    )
    monkeypatch.setattr(gateway.policy_set, "policy_stamps", real)
    write(policy, HEAD.replace("VERSION", "3") + TAIL, 4_000_000_000)  # finished
    assert [trust.poll() for _ in range(2)] == [False, True]
    assert trust.current.compiled("p").version == "3"
    assert trust.current.decide("acme", "m", "phi").fallback == "never"


def test_a_set_read_at_start_while_a_file_was_written_is_not_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve` (or a worker the supervisor restarted) read the files while an editor was
    writing one: the set it compiled (the class cut before its `fallback: never`) was
    served until the watcher's first settled look. It is `stale` instead (requests 503,
    not ready, `owngate_policy_stale`) until a read finds the files whole."""
    trust = started_while_written(tmp_path, monkeypatch)
    assert trust.stale, "a policy set read while a file was being written was served"
    assert not trust.poll()
    assert trust.stale
    assert trust.poll()  # held still: read whole
    assert not trust.stale
    assert trust.current.decide("acme", "m", "phi").fallback == "never"
