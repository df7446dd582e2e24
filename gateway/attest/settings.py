"""What one `owngate attest` sidecar is started with (`owngate attest`'s options,
`gateway/cli/attest.py`; the demo's sidecars, `gateway/demo/attested.py`): the backend it
fronts, its key and log, and the bounds of what it holds and waits for."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["AttestSettings"]


@dataclass(frozen=True, slots=True)
class AttestSettings:
    backend: str  # the inference server's root URL
    key_file: Path
    log_dir: Path
    origin: str | None = None  # the log's origin line; default: the key's name
    max_body: int = 16 * 1024 * 1024
    # Request bodies held at once by every connection together (gateway/body_budget.py):
    # past it a request is refused 429 with `retry-after: 1` before its body is read.
    max_held_body: int = 256 * 1024 * 1024
    # Whole answers (not streams) held at once by every connection together, from their
    # declared length (else as they arrive) until the client has taken them: past it the
    # answer is dropped and the request refused 429 with `retry-after: 1`.
    max_held_answer: int = 256 * 1024 * 1024
    connect_timeout: float = 5.0
    read_timeout: float = 600.0
    max_connections: int = 1024  # to the backend
    # The log's cadence: statements nobody waits on are written together at least every
    # `flush_ms` (a crash loses at most that much of the log, which the cross-check
    # reports), a checkpoint is signed every `checkpoint_ms` while entries come in. Each
    # write and checkpoint has a fixed cost (fsyncs, tiles, a signature): at the gateway's
    # 50 ms / 1 s they cost the sidecar more CPU per request than the relay does.
    flush_ms: float = 200.0
    checkpoint_ms: float = 5000.0
    # `--client-pin`: the keys a client certificate may have (with `--client-ca`)
    client_pins: frozenset[str] = frozenset()
