"""The real `owngate` entry point runs the auditor's commands without the server stack.

Each test runs `gateway.cli.main.main` in a fresh interpreter whose imports of the web
framework, Redis, the config/logging/metrics libraries and the servers raise ImportError,
as on an auditor's install that holds only `gateway.provenance` and its dependencies.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.provenance import ProvenanceLog, write_signing_key
from gateway.provenance.formats.tiles import decode_bundle, encode_bundle, entries_path
from gateway.provenance.testing import log_refusal, log_request, seeded_signer
from tests.helpers.paths import REPO_ROOT

ORIGIN = "gateway.example/log/replica-1"
SIGNER = seeded_signer(ORIGIN)

BLOCKED = (
    "fastapi",
    "starlette",
    "pydantic",
    "yaml",
    "redis",
    "httpx",
    "uvicorn",
    "uvloop",
    "httptools",
    "litellm",
    "structlog",
    "prometheus_client",
)

# Installs the blocking finder before anything of owngate is imported, then runs the CLI.
OWNGATE_WITHOUT_SERVER = f"""
import importlib.abc
import sys

BLOCKED = {BLOCKED!r}
early = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
if early:
    sys.exit(f"imported before the blocker was installed: {{early}}")


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked on the auditor's install: {{name}}")
        return None


sys.meta_path.insert(0, Blocker())
from gateway.cli.main import main

sys.exit(main(sys.argv[1:]))
"""


def owngate(*argv: str) -> subprocess.CompletedProcess[str]:
    """Run `owngate ARGV...` with the server stack's packages blocked."""
    return subprocess.run(
        [sys.executable, "-c", OWNGATE_WITHOUT_SERVER, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log of 3 requests and 1 refusal: 7 entries, all in a signed checkpoint."""
    path = tmp_path_factory.mktemp("log")

    async def build() -> None:
        log = await ProvenanceLog.open(path, ORIGIN, SIGNER)
        for n in range(3):
            await log_request(log, n)
        await log_refusal(log, 3)
        await log.close()

    asyncio.run(build())
    return path


@pytest.mark.parametrize(
    "words",
    [
        ["audit"],
        ["audit", "verify"],
        ["audit", "report"],
        ["audit", "receipt", "verify"],
        ["witness", "vkey"],
    ],
    ids=" ".join,
)
def test_help_needs_no_server_stack(words: list[str]) -> None:
    done = owngate(*words, "--help")
    assert done.returncode == 0, done.stderr
    assert f"usage: owngate {' '.join(words)}" in done.stdout


def test_verify_needs_no_server_stack(logdir: Path) -> None:
    done = owngate("audit", "verify", str(logdir), "--key", SIGNER.vkey)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"ok: {ORIGIN}: 7 entries, ")
    assert f"signed by {SIGNER.vkey.split('+')[0]}" in done.stdout


def test_verify_of_a_tampered_log_fails_without_server_stack(logdir: Path) -> None:
    bundle = logdir / entries_path(0, 7)
    pristine = bundle.read_bytes()
    entries = decode_bundle(pristine)
    record = bytearray(entries[4])
    record[40] ^= 0x01
    entries[4] = bytes(record)
    bundle.write_bytes(encode_bundle(entries))
    try:
        done = owngate("audit", "verify", str(logdir), "--key", SIGNER.vkey)
    finally:
        bundle.write_bytes(pristine)
    assert done.returncode == 1, done.stderr
    assert "FAILED: entry 4: the entry does not hash to its leaf" in done.stderr
    assert done.stdout == ""


def test_show_needs_no_server_stack(logdir: Path) -> None:
    done = owngate("audit", "show", str(logdir))
    assert done.returncode == 0, done.stderr
    assert "3 dispatched, 3 completed, 1 refused (of 7 entries)" in done.stdout


def test_report_needs_no_server_stack(logdir: Path, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    done = owngate("audit", "report", str(logdir), "--key", SIGNER.vkey, "--html", str(page))
    assert done.returncode == 0, done.stderr
    assert "<h1>Audit report of" in page.read_text() and "<svg" in page.read_text()


def test_witness_vkey_needs_no_server_stack(tmp_path: Path) -> None:
    key = tmp_path / "witness.key"
    write_signing_key(key, "witness.example.com/w1")
    done = owngate("witness", "vkey", "--key", str(key))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("witness.example.com/w1+")


def test_the_blocker_blocks() -> None:
    """The server's own commands still need the stack: the check above is not vacuous."""
    done = owngate("serve", "--help")
    assert done.returncode != 0
    assert "blocked on the auditor's install" in done.stderr
