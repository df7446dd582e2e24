"""`owngate bench attest --instructions`: callgrind's counts of the sidecar's request path.
The run is checked for shape and for what must hold whatever the machine (the signature is
part of the loop thread's work, and not all of it); the counts themselves are not
asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from owngate_bench.attest_instructions import signature_count
from owngate_bench.instructions import count_total
from tests.helpers.paths import REPO_ROOT

pytestmark = pytest.mark.bench

_INCLUSIVE = """\
--------------------------------------------------------------------------------
Ir                    file:function
--------------------------------------------------------------------------------
409,373,623 (100.0%)  /project/uvloop/loop.c:__pyx_f_6uvloop_4loop_4Loop__run [/x/loop.so]
230,509,500 (56.33%)  ???:ed25519_digest_sign [/x/_rust.abi3.so]
230,461,000 (56.32%)  ???:ossl_ed25519_sign [/x/_rust.abi3.so]
    895,500 ( 0.22%)  ???:ossl_ed25519_sign_extra [/x/_rust.abi3.so]
"""


def test_signature_count_reads_the_inclusive_line_of_the_signature() -> None:
    assert signature_count(_INCLUSIVE) == 230_461_000
    assert signature_count(_INCLUSIVE, "ed25519_digest_sign") == 230_509_500
    assert signature_count(_INCLUSIVE, "missing") == 0


def _owngate(*argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "attest", *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_no_requests_is_a_usage_error() -> None:
    proc = _owngate("--instructions", "--requests", "0", timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "--requests" in proc.stderr


@pytest.mark.parametrize("shape", ["bench", "gateway"])
def test_a_short_run_counts_the_loop_thread_and_its_signature(tmp_path: Path, shape: str) -> None:
    dumps = tmp_path / "dumps"
    argv = ["--instructions", "--requests", "20", "--shape", shape, "--json"]
    # a sidecar starts under valgrind: ~20 s here alone, and 300 warm-up requests; at load 7
    # on 2 cores such a run took over 900 s: the bound is for a hang
    proc = _owngate(*argv, "--keep-dumps", str(dumps), timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["shape"] == shape and report["requests"] == 20
    assert report["loop_per_request"] == report["loop_instructions"] / 20
    assert 0 < report["signature_per_request"] < report["loop_per_request"]
    assert report["threads"] >= 2  # the loop and the log's writer at least
    # --keep-dumps: the loop thread's dump of the measured requests, the total it reported
    annotated = subprocess.run(
        ["callgrind_annotate", str(dumps / "callgrind.out.1-01")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert count_total(annotated) == report["loop_instructions"]
