"""`owngate attest` settles its heap before its first request, as `owngate serve` does
(gateway/serving.py `settle_heap`): what its startup built is frozen out of the cyclic
collector's full walks, which otherwise ran over all of it on the loop between requests."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from pathlib import Path

from gateway.attest import AttestSettings, serve
from gateway.provenance import write_signing_key
from gateway.serving import bind_socket


def test_the_sidecar_freezes_its_startup_before_serving(tmp_path: Path, collector: None) -> None:
    write_signing_key(tmp_path / "sidecar.key", "sidecar")
    settings = AttestSettings(
        backend="http://127.0.0.1:9", key_file=tmp_path / "sidecar.key", log_dir=tmp_path / "log"
    )
    gc.unfreeze()
    frozen: list[int] = []

    def ready() -> None:  # serving: note what is frozen, then stop as SIGTERM stops it
        frozen.append(gc.get_freeze_count())
        # once serve() has its signal handlers (set after this call returns)
        asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGTERM)

    assert serve(settings, bind_socket("127.0.0.1", 0), on_ready=ready) is None
    assert frozen and frozen[0] > 0
