"""The admin API's heavy work cannot hold the threads the gateway's own work needs
(gateway/admin/work.py).

A real `owngate serve` with its log and a witness configured (unreachable: it never
cosigns). The witness's newest cosigned checkpoint is a FIFO, and the gateway runs with a
hook (`HUNG_DISK`, its `sitecustomize`) that makes the cosignatures' read of a `cosigned/`
file wait on it first, so each `GET /admin/v1/log/cosignatures` blocks in its worker
thread until the test releases it: a stand-in for a disk that does not answer. (The read
itself refuses a FIFO at once, tests/integration/test_admin_log_fifos.py: without the hook
nothing there blocks.) An auditor sends more such reads than the event loop's default
executor has threads (`min(32, CPUs + 4)`); meanwhile the security team creates a key
(the keys file is written on the default executor) and a tenant's request goes to its
backend by host name (`localhost`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from functools import partial
from pathlib import Path

import httpx

from gateway.admin.work import PER_CALLER, THREADS
from gateway.provenance.formats.layout import cosigned_path
from gateway.serving import ServerThread
from gateway.sim import SimSettings, create_sim_app
from tests.helpers.admin import TOKENS, WITNESS, serve_admin
from tests.helpers.net import free_port
from tests.helpers.processes import KEY
from tests.helpers.waiting import until

DEFAULT_THREADS = min(32, (os.cpu_count() or 1) + 4)  # ThreadPoolExecutor's default
READS = DEFAULT_THREADS + 2  # more than the default executor runs at once
WAIT_S = 15.0

# The gateway's `sitecustomize`: a read of a `cosigned/` file by the cosignatures endpoint
# first reads the FIFO at that path to its end (blocking, as a read from a hung mount),
# then reads the file as the gateway does.
HUNG_DISK = """
from gateway.admin import cosignatures

_read = cosignatures.read_log_file


def hung_disk(path, *args, **kwargs):
    if path.parent.name == "cosigned":
        with open(path, "rb") as fifo:
            fifo.read()
    return _read(path, *args, **kwargs)


cosignatures.read_log_file = hung_disk
"""


class SlowCosigned:
    """A FIFO where the witness's newest cosigned checkpoint is read, its write end held
    by the test: a read of it (through `HUNG_DISK`) blocks until `release()` removes it
    and ends what every reader reads."""

    def __init__(self, log: Path) -> None:
        self.fifo = cosigned_path(log, 1)
        self.fifo.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(self.fifo)
        # a writer: readers open it, then wait for bytes that never come
        self._held: int | None = os.open(self.fifo, os.O_RDWR | os.O_NONBLOCK)

    def release(self) -> None:
        if self._held is not None:
            os.unlink(self.fifo)  # later reads find nothing
            os.close(self._held)  # the last writer gone: every reader reads its end
            self._held = None


def _readers(pid: int, fifo: Path) -> int:
    """How many of process `pid`'s descriptors are open on the FIFO (its blocked reads)."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile
            if os.readlink(fd) == str(fifo.resolve()):
                count += 1
    return count


async def _get(client: httpx.AsyncClient, url: str, token: str) -> httpx.Response:
    """`url`'s answer to `token`, or a 599 placeholder when none came within WAIT_S."""
    try:
        return await client.get(url, headers={"authorization": f"Bearer {token}"})
    except httpx.TimeoutException:
        return httpx.Response(599)


async def _post(client: httpx.AsyncClient, url: str, token: str, body: object) -> httpx.Response:
    """`url`'s answer to `body` from `token`, or a 599 placeholder after WAIT_S."""
    try:
        return await client.post(url, headers={"authorization": f"Bearer {token}"}, json=body)
    except httpx.TimeoutException:
        return httpx.Response(599)


def test_admin_reads_past_the_bound_are_429_and_leave_the_gateways_threads(
    tmp_path: Path,
) -> None:
    """The auditor's and the admin's READS reads each: THREADS of them (PER_CALLER a
    token) run, blocked, the rest are 429 at once with `retry-after: 1`; the key is
    created and the chat served meanwhile. Before, every read took a thread of the
    default executor, the rest queued there, and the key change waited behind them."""
    sim = ServerThread(create_sim_app(SimSettings.for_kind("vllm", models=("m",)))).start()
    port = sim.url.rsplit(":", 1)[1]
    witness = {"url": f"http://127.0.0.1:{free_port()}", "vkey": WITNESS.vkey, "timeout_s": 1}
    tokens = [TOKENS["auditor"]] * READS + [TOKENS["admin"]] * READS
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(HUNG_DISK)
    path = os.pathsep.join(p for p in (str(tmp_path / "hook"), os.environ.get("PYTHONPATH")) if p)
    try:
        with serve_admin(
            tmp_path,
            backend={"base_url": f"http://localhost:{port}"},  # getaddrinfo for each connection
            provenance={"witnesses": [witness]},
            env={"PYTHONPATH": path},
        ) as served:
            first = served.chat()
            assert first.status_code == 200, first.text
            assert served.process.proc is not None
            pid = served.process.proc.pid
            slow = SlowCosigned(served.log)
            try:

                async def run() -> tuple[list[httpx.Response], httpx.Response, httpx.Response]:
                    async with httpx.AsyncClient(timeout=WAIT_S) as client:
                        url = f"{served.admin}/admin/v1/log/cosignatures"
                        reads = asyncio.gather(*(_get(client, url, t) for t in tokens))
                        blocked = partial(until, lambda: _readers(pid, slow.fifo) >= THREADS)
                        await asyncio.to_thread(blocked, "reads blocked", timeout=WAIT_S)
                        keys = f"{served.admin}/admin/v1/keys"
                        created = await _post(client, keys, TOKENS["security"], {"tenant": "acme"})
                        chat = await _post(
                            client,
                            f"{served.process.url}/v1/chat/completions",
                            KEY,
                            {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                        )
                        slow.release()
                        return list(await reads), created, chat

                results, created, chat = asyncio.run(run())
            finally:
                slow.release()
    finally:
        sim.stop()
    assert created.status_code == 201, created.text  # the key change had its thread
    assert chat.status_code == 200, chat.text
    statuses = [r.status_code for r in results]
    refused = [r for r in results if r.status_code == 429]
    assert len(refused) == len(tokens) - THREADS, statuses  # PER_CALLER of each token's ran
    for response in refused:
        assert response.headers["retry-after"] == "1"
        assert response.json()["error"]["code"] == "rate_limit_exceeded"
    assert statuses.count(200) == THREADS == 2 * PER_CALLER, statuses
