"""Opening the provenance log the recorder writes: its signing keys, timings and origin.

`open_log` runs in the ASGI lifespan (`Recorder.open`): it reads the signing key and the
previous ones a rotation keeps, recovers the write-ahead segment and takes the log's
lock, refusing an emptied or older log directory (the high-water file) unless the
operator asked for a new origin (`owngate serve --new-log-origin`, `NEW_LOG_ORIGIN_ENV`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.config.schema import ProvenanceSettings
from gateway.provenance import (
    LogSettings,
    ProvenanceLog,
    Verifier,
    load_signer,
    seal_receipts,
)
from gateway.provenance.formats.cosignature import CosignatureVerifier, unambiguous_witnesses
from gateway.provenance.keys import one_log_name, unambiguous
from gateway.provenance.writer.events import FaultEvents
from gateway.provenance.writer.high_water import HighWater

__all__ = ["NEW_LOG_ORIGIN_ENV", "OpenedLog", "asks_new_log_origin", "log_settings", "open_log"]

# Set (to 1) by `owngate serve --new-log-origin`: the operator starts a new log under a new
# origin, leaving behind the one the high-water file records (docs/provenance.md).
NEW_LOG_ORIGIN_ENV = "OWNGATE_NEW_LOG_ORIGIN"


def asks_new_log_origin(environ: Mapping[str, str]) -> bool:
    """Whether `environ` says to start a new log under a new origin."""
    return environ.get(NEW_LOG_ORIGIN_ENV, "").strip().lower() in ("1", "true", "yes")


def log_settings(settings: ProvenanceSettings) -> LogSettings:
    """The log's timings `provenance:` sets (raises ValueError for ones it refuses: none
    that validate, by the config's bounds)."""
    return LogSettings(
        group_commit_ms=settings.group_commit_ms,
        checkpoint_every=settings.checkpoint_every,
        checkpoint_interval_ms=settings.checkpoint_interval_ms,
        export_stall_after_ms=settings.export_stall_after_s * 1000.0,
        max_unsigned_bytes=settings.max_unsigned_bytes,
    )


@dataclass(frozen=True)
class OpenedLog:
    """An open log and the keys around it."""

    log: ProvenanceLog
    signer: Any  # signs each receipt alone; None when receipts are sealed in batches
    # The log's public keys (current and previous): what its receipts and checkpoints
    # are checked against (the admin API's receipt verification).
    verifiers: list[Verifier]
    # Keys a rotation retired: receipts they signed before it (admin receipt check).
    retired_verifiers: list[Verifier]


def _labelled(settings: ProvenanceSettings, keys: list[Verifier]) -> list[tuple[str, Verifier]]:
    """The previous and retired keys (in `open_log`'s order), each with its setting."""
    names = [
        *(
            f"provenance.previous_signing_key_files ({f})"
            for f in settings.previous_signing_key_files
        ),
        *("provenance.retired_verifier_keys" for _ in settings.retired_verifier_keys),
    ]
    return list(zip(names, keys, strict=True))


async def open_log(
    settings: ProvenanceSettings, config_dir: Path, *, new_origin: bool, events: FaultEvents
) -> OpenedLog:
    """Load the signing key and open the log (raises OSError or ProvenanceError).
    `events` is the logger told when writes or checkpoints fail, and when they are back."""
    signer = load_signer(config_dir / settings.signing_key_file)
    previous = [load_signer(config_dir / f) for f in settings.previous_signing_key_files]
    retired = [Verifier(vkey) for vkey in settings.retired_verifier_keys]
    # A retired key under the signing key's name and id (config load checks the retired
    # ones among themselves): a checkpoint or receipt line could be either's (keys.py).
    own = [signer.verifier(), *(key.verifier() for key in previous), *retired]
    unambiguous(own)
    # a rotation keeps the key's name (keys.py): refused before anything is written
    one_log_name(own[0], _labelled(settings, own[1:]))
    # A witness under one of those names and ids: its cosignatures in cosigned/ would be
    # checked as the log's signatures, and fail every audit (cosignature.py).
    unambiguous_witnesses([CosignatureVerifier(w.vkey) for w in settings.witnesses], own)
    batched = settings.receipts == "batch"
    log = await ProvenanceLog.open(
        config_dir / settings.dir,
        settings.origin,
        signer,
        cosigners=previous,
        settings=log_settings(settings),
        # v2 receipts: each seal gives its receipt's payload, one signature per batch
        # (a receipt alone in its batch is v1: the same one signature, less to carry)
        batch_seal=functools.partial(
            seal_receipts, log=settings.origin, signer=signer, lone_v1=True
        )
        if batched
        else None,
        events=events,  # one line when writes or checkpoints fail, one when back
        # an emptied or older log directory is refused, not forked (LogForkError)
        high_water=HighWater(settings.high_water_path(config_dir), new_origin),
        # the newest checkpoint may be signed by a key a rotation retired (still this log's)
        retired=retired,
    )
    rewritten = log.recovery.rewritten
    if rewritten:  # the entries hashed to the signed root; a tile held something else
        events.error(
            "provenance tiles rewritten from the entry bundles",
            count=len(rewritten),
            tiles=list(rewritten[:16]),
        )
    return OpenedLog(
        log=log,
        signer=signer if not batched else None,
        verifiers=[signer.verifier(), *(key.verifier() for key in previous)],
        retired_verifiers=retired,
    )
