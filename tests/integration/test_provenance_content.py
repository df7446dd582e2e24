"""Zero content: bodies, their plain hashes and the salts never reach the log directory.

Also: the provenance package and the audit CLI import nothing of the server stack, and
each module declares its public surface in `__all__`.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import gateway.provenance
from gateway.provenance import ProvenanceLog, verify_commitment
from gateway.provenance.formats.tiles import decode_bundle
from gateway.provenance.testing import log_request, seeded_signer
from tests.helpers.module_size import long_modules

ORIGIN = "gateway.example/log/canary"
CANARY_REQUEST = b'{"messages":[{"role":"user","content":"CANARY-7f3e9a-prompt-never-logged"}]}'
CANARY_RESPONSE = b'{"choices":[{"message":{"content":"CANARY-51c0d2-answer-never-logged"}}]}'


def test_canary_bodies_never_appear_in_the_log_directory(tmp_path: Path) -> None:
    async def scenario() -> list[bytes]:
        log = await ProvenanceLog.open(tmp_path, ORIGIN, seeded_signer(ORIGIN))
        logged = [
            await log_request(log, n, request_body=CANARY_REQUEST, response_body=CANARY_RESPONSE)
            for n in range(3)
        ]
        await log.abort()  # leave the write-ahead segment behind too
        log = await ProvenanceLog.open(tmp_path, ORIGIN, seeded_signer(ORIGIN))
        await log.close()
        return [s for item in logged for s in (item.salts.request, item.salts.response)]

    salts = asyncio.run(scenario())
    forbidden = [
        CANARY_REQUEST,
        CANARY_RESPONSE,
        b"CANARY",
        hashlib.sha256(CANARY_REQUEST).digest(),
        hashlib.sha256(CANARY_REQUEST).hexdigest().encode(),
        hashlib.sha256(CANARY_RESPONSE).digest(),
        hashlib.sha256(CANARY_RESPONSE).hexdigest().encode(),
        *salts,
        *(salt.hex().encode() for salt in salts),
    ]
    files = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert len(files) > 5
    for path in files:
        data = path.read_bytes()
        for needle in forbidden:
            assert needle not in data, f"{path} holds content or a salt"


def test_commitments_open_with_the_receipt_salt_only(tmp_path: Path) -> None:
    async def scenario() -> tuple[bytes, dict[str, object]]:
        log = await ProvenanceLog.open(tmp_path, ORIGIN, seeded_signer(ORIGIN))
        logged = await log_request(log, 0, request_body=CANARY_REQUEST)
        await log.close()
        entry = decode_bundle((tmp_path / "tile/entries/000.p/2").read_bytes())[0]
        return logged.salts.request, json.loads(entry)

    salt, record = asyncio.run(scenario())
    commitment = record["request_commitment"]
    assert isinstance(commitment, str)
    verify_commitment("request", commitment, salt, CANARY_REQUEST)


FORBIDDEN_MODULES = ("uvicorn", "starlette", "fastapi", "redis", "httpx", "litellm")


def test_auditor_imports_no_server_stack() -> None:
    code = (
        "import sys, gateway.provenance, gateway.provenance.testing, gateway.cli.audit\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN_MODULES!r})\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == ""


def test_every_module_declares_its_public_surface() -> None:
    package = Path(gateway.provenance.__file__).parent
    for info in pkgutil.walk_packages([str(package)], "gateway.provenance."):
        module = importlib.import_module(info.name)
        for name in module.__all__:
            assert hasattr(module, name), f"{info.name}.__all__ names missing {name}"
    for name in gateway.provenance.__all__:
        assert hasattr(gateway.provenance, name)


def test_modules_stay_small() -> None:
    assert long_modules(Path(gateway.provenance.__file__).parent) == []
