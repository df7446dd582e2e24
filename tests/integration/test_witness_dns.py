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
