"""Each figure's reproduce command of `owngate audit report`, run as printed, gives its numbers.

The commands are shell pipelines of the real `owngate` (this interpreter's) and `jq`; a
`jq` filter over `owngate audit show --records --json` must print exactly the figure's
`counts` (or `rates`, or `points`) of the JSON report, so an auditor can recompute every
chart without the report's code.
"""

from __future__ import annotations

import asyncio
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.provenance import ProvenanceLog
from gateway.provenance.testing import EXAMPLE_HOSTED, log_refusal, log_request, seeded_signer
from tests.helpers.prerequisites import missing

ORIGIN = "gateway.example/log/report-commands"
SIGNER = seeded_signer(ORIGIN)

pytestmark = pytest.mark.jq


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("log")

    async def build() -> None:
        log = await ProvenanceLog.open(path, ORIGIN, SIGNER)
        for n in (0, 1, 40, 41, 42):
            await log_request(log, n, tenant="acme-app" if n % 2 else "beta")
        await log_request(log, 41)  # a retry of req-41
        await log_request(log, 90, backend=EXAMPLE_HOSTED, fallback_reason="private_saturated")
        await log_refusal(log, 120)
        await log.checkpoint()
        await log_request(log, 200, backend=EXAMPLE_HOSTED, fallback_reason="private_down")
        await log.close()

    asyncio.run(build())
    return path


def _shell(command: str) -> str:
    if shutil.which("jq") is None:
        missing("jq", "jq is not installed (apt-get install jq)")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, (command, done.stderr)
    return done.stdout


def test_every_figure_is_reproduced_by_its_commands(logdir: Path) -> None:
    argv = f"owngate audit report {logdir} --key {SIGNER.vkey} --json -"
    report: dict[str, Any] = json.loads(_shell(argv))
    assert report["verification"]["ok"] is True
    figures = report["figures"]
    for name in (
        "dispatches_by_backend",
        "dispatches_by_region",
        "dispatches_by_data_class",
        "requests_by_tenant",
        "fallbacks_by_reason",
        "refusals_by_rule",
    ):
        counts, *rates = figures[name]["commands"]
        assert json.loads(_shell(counts)) == figures[name]["counts"], name
        assert figures[name]["counts"], name
        for command in rates:
            assert json.loads(_shell(command)) == figures[name]["rates"], name
    verify, history = figures["checkpoints"]["commands"]
    assert json.loads(_shell(verify))["checkpoints"] == len(figures["checkpoints"]["points"])
    assert json.loads(_shell(history)) == figures["checkpoints"]["points"]


@pytest.fixture
def served_log(logdir: Path) -> Iterator[str]:
    """`logdir` over HTTP as any static file server lays it out: C2SP tlog-tiles (the
    checkpoint, tiles and bundles at their paths; no `checkpoints/` history is fetched)."""
    handler = functools.partial(_Quiet, directory=str(logdir))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/"
        finally:
            server.shutdown()
            thread.join(timeout=10)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_served_logs_figures_are_reproduced_by_their_commands(served_log: str) -> None:
    """`owngate audit report URL` (a replica's log over tlog-tiles): every command, the
    checkpoints figure's included, runs as printed against the URL and gives the figure.
    The checkpoint history command used to glob `URL/checkpoints/*` as a local path."""
    report: dict[str, Any] = json.loads(
        _shell(f"owngate audit report {served_log} --key {SIGNER.vkey} --json -")
    )
    assert report["verification"]["ok"] is True
    figures = report["figures"]
    counts = figures["dispatches_by_backend"]["commands"][0]
    assert json.loads(_shell(counts)) == figures["dispatches_by_backend"]["counts"]
    verify, history = figures["checkpoints"]["commands"]
    assert json.loads(_shell(verify))["checkpoints"] == len(figures["checkpoints"]["points"])
    points = figures["checkpoints"]["points"]
    assert points and points[-1]["size"] == report["verification"]["summary"]["size"]
    assert json.loads(_shell(history)) == points


def test_a_log_whose_clock_stepped_is_reproduced_by_its_commands(tmp_path: Path) -> None:
    """Records dated 10 years on and back in 1970 between two entries 5 s apart: the
    report widens its buckets to a week, and the `jq` commands it prints count with that
    width, so they still give its numbers."""

    async def build() -> None:
        log = await ProvenanceLog.open(tmp_path, ORIGIN, SIGNER)
        for n in (0, 10 * 365 * 86400, 2, -1_767_225_600, 5):
            await log_request(log, n, tenant="acme-app" if n % 2 else "beta")
        await log_refusal(log, 4)
        await log.close()

    asyncio.run(build())
    argv = f"owngate audit report {tmp_path} --key {SIGNER.vkey} --json -"
    report: dict[str, Any] = json.loads(_shell(argv))
    assert report["verification"]["ok"] is True
    assert report["totals"]["bucket_seconds"] == 604800
    figures = report["figures"]
    for name in ("dispatches_by_backend", "requests_by_tenant", "refusals_by_rule"):
        counts = figures[name]["commands"][0]
        assert json.loads(_shell(counts)) == figures[name]["counts"], name
