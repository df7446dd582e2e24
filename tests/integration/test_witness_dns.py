"""A witness whose name's lookup hangs cannot take the event loop's default executor.

Before, `asyncio.open_connection(name)` looked the name up on the default executor and a
timed-out attempt left its thread blocked: one thread per cosigning attempt, until every
`asyncio.to_thread` of the gateway (config reloads, cosignature files) waited behind them.
Now witness names are looked up on threads of their own, one lookup per name at a time.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from gateway.provenance.witness.client import request_cosignature
from gateway.provenance.witness.witness import WitnessError

_SLOW = "slow-dns.witness.invalid"


def test_hanging_witness_lookup_holds_no_default_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    entered: list[str] = []
    real = socket.getaddrinfo

    def lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == _SLOW:
            entered.append(host)
            release.wait(10)
            raise socket.gaierror(socket.EAI_NONAME, "not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(2))  # as a small machine's, but smaller
        for _ in range(3):  # three checkpoints, each attempt timing out in the lookup
            with pytest.raises(WitnessError) as caught:
                await request_cosignature(f"http://{_SLOW}:9/w", 0, (), b"x\n", timeout=0.1)
            assert caught.value.reason == "timeout"
        # The gateway's own work on the default executor still runs.
        assert await asyncio.wait_for(asyncio.to_thread(lambda: 7), 2.0) == 7
        assert entered == [_SLOW], "one lookup of the name at a time"

    try:
        asyncio.run(main())
    finally:
        release.set()


def test_hanging_witness_lookups_do_not_starve_the_other_witnesses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two witnesses (of a config's many) whose operators run a DNS server that never
    # answers took both of the module's lookup threads, process-wide: every other
    # witness's name queued behind them, each attempt timing out, no cosignature from
    # any honest witness until the resolver gave up on the hostile names.
    from gateway.provenance.witness import lookup as witness_lookup

    release = threading.Event()
    real = socket.getaddrinfo
    hostile = [f"hang-{i}.witness.invalid" for i in range(3)]

    def resolve(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host in hostile:
            release.wait(10)
            raise socket.gaierror(socket.EAI_NONAME, "not known")
        if host == "honest.witness.invalid":
            return real("127.0.0.1", *args, **kwargs)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)

    async def main() -> None:
        for name in hostile:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(witness_lookup._addresses(name, 443), 0.05)
        found = await asyncio.wait_for(
            witness_lookup._addresses("honest.witness.invalid", 443), 2.0
        )
        assert [address for _, address, _ in found] == ["127.0.0.1"]

    try:
        asyncio.run(main())
    finally:
        release.set()


def test_a_hanging_witness_lookup_does_not_hold_the_process_at_exit(tmp_path: Any) -> None:
    # The lookup threads were a ThreadPoolExecutor's, which the interpreter joins at
    # exit: a gateway whose witness name never resolved could not stop.
    import subprocess
    import sys

    script = tmp_path / "hang.py"
    script.write_text(
        "import asyncio, socket, threading\n"
        "from gateway.provenance.witness import lookup\n"
        "socket.getaddrinfo = lambda *a, **k: threading.Event().wait(60)\n"
        "async def main():\n"
        "    try:\n"
        "        await asyncio.wait_for(lookup._addresses('hang.witness.invalid', 443), 0.05)\n"
        "    except TimeoutError:\n"
        "        print('timed out', flush=True)\n"
        "asyncio.run(main())\n"
    )
    import os

    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        timeout=10,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )
    assert done.stdout == b"timed out\n"
