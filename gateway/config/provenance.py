"""`gateway.yaml`'s `provenance:` section: the signed provenance log of this gateway and
the witnesses that cosign its checkpoints."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from gateway.config.base import _Strict
from gateway.provenance.errors import KeyFormatError
from gateway.provenance.formats.cosignature import (
    CosignatureVerifier,
    distinct_witnesses,
    unambiguous_witnesses,
)
from gateway.provenance.formats.note import Verifier
from gateway.provenance.keys import unambiguous

__all__ = ["ProvenanceSettings", "WitnessSettings"]


class WitnessSettings(_Strict):
    """A witness that cosigns the log's checkpoints (`owngate witness serve`, or any
    C2SP tlog-witness): its submission URL prefix and its cosignature verifier key."""

    url: str = Field(min_length=1, description="prefix; add-checkpoint is POSTed under it")
    vkey: str = Field(min_length=1, description="printed by `owngate witness vkey`")
    timeout_s: float = Field(default=5.0, gt=0, le=3600)

    @field_validator("url")
    @classmethod
    def _witness_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("a witness url must be an absolute http(s) URL")
        return value

    @field_validator("vkey")
    @classmethod
    def _witness_vkey(cls, value: str) -> str:
        try:
            CosignatureVerifier(value)
        except KeyFormatError as exc:
            raise ValueError(str(exc)) from exc
        return value


class ProvenanceSettings(_Strict):
    """The signed provenance log of this gateway (one log per replica, its own origin)."""

    dir: str = Field(min_length=1, description="log directory, relative to gateway.yaml")
    origin: str = Field(min_length=1, description="the log's origin line, e.g. host/log/1")
    signing_key_file: str = Field(min_length=1, description="written by keys new --signing")
    high_water_file: str | None = Field(
        default=None,
        min_length=1,
        description="where the newest signed checkpoint is kept, outside the log "
        "directory, so that a log directory emptied, deleted or restored from an older "
        "copy is refused rather than forked (default: beside the directory, <dir>.high-water; "
        "with serve --workers N, worker i's is this path followed by -worker-<i>)",
    )
    # The log's timings are bounded: what validates must start (`LogSettings` refuses a
    # timing that is not finite, and export_stall_after_s is taken x1000: 1e306 s is inf).
    group_commit_ms: float = Field(default=2.0, ge=0, le=60_000)
    checkpoint_every: int = Field(default=10_000, gt=0)
    checkpoint_interval_ms: float = Field(default=1000.0, gt=0, le=86_400_000)
    export_stall_after_s: float = Field(
        default=60.0,
        gt=0,
        le=86_400,
        description="a checkpoint export (tiles, signature) that has not returned for this "
        "long is a hung disk: the log is not ready (/readyz 503) until it returns",
    )
    max_unsigned_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=64 * 1024,  # some 40 records: below it, traffic between two checkpoints is refused
        le=2**40,
        description="bytes of durable entries no signed checkpoint covers yet, which the log "
        "holds in memory until one does; past it (checkpoints failing or hung) new requests "
        "are refused (503 provenance_unavailable) until a checkpoint is signed again; at "
        "least 65536",
    )
    receipts: Literal["batch", "single"] = Field(
        default="batch",
        description="batch: one signature per committed batch, each receipt with its "
        "inclusion path (v2); single: one signature per receipt (v1)",
    )
    receipts_kept: int = Field(default=100_000, gt=0)
    receipts_memory_bytes: int = Field(
        default=64 * 1024 * 1024,
        gt=0,
        description="memory the receipts kept for lookup may take (about 1.8 KB each)",
    )
    previous_signing_key_files: tuple[str, ...] = Field(
        default=(),
        description="old keys that also sign every checkpoint during a key rotation",
    )
    retired_verifier_keys: tuple[str, ...] = Field(
        default=(),
        description="verifier keys of signing keys a rotation retired: the admin API's "
        "receipt check accepts the receipts they signed before their retirement, and the "
        "log opens from a newest checkpoint only such a key signed",
    )
    witnesses: tuple[WitnessSettings, ...] = Field(
        default=(), description="C2SP tlog-witnesses asked to cosign each new checkpoint"
    )
    witness_retry_max_s: float = Field(
        default=60.0,
        gt=0,
        le=86_400,
        description="longest wait between retries to a failing witness",
    )

    def high_water_path(self, config_dir: Path) -> Path:
        """The high-water file (`high_water_file`, or `<dir>.high-water` beside the log
        directory), relative paths anchored at `config_dir` as `dir` is."""
        if self.high_water_file is not None:
            return config_dir / self.high_water_file
        directory = Path(os.path.abspath(config_dir / self.dir))
        return directory.parent / f"{directory.name or 'log'}.high-water"

    def for_worker(self, index: int, config_dir: Path) -> ProvenanceSettings:
        """This log as worker `index` of `serve --workers N` keeps its own: the directory
        `<dir>/worker-<i>`, the origin `<origin>/worker-<i>`, and the high-water file
        `<this log's high-water file>-worker-<i>`, computed from the configured directory,
        so it stays beside it (never inside it: removing the configured directory must
        not remove the files that would refuse to fork the workers' logs)."""
        suffix = f"worker-{index}"
        return self.model_copy(
            update={
                "dir": f"{self.dir}/{suffix}",
                "origin": f"{self.origin}/{suffix}",
                "high_water_file": f"{self._unsuffixed_high_water(config_dir)}-{suffix}",
            }
        )

    def _unsuffixed_high_water(self, config_dir: Path) -> str:
        """`high_water_path`, relative to `config_dir` when `dir` and `high_water_file`
        are (a config keeps meaning the same wherever the gateway runs from)."""
        if self.high_water_file is not None:
            return self.high_water_file
        normal = os.path.normpath(self.dir)
        if os.path.basename(normal) not in ("", os.curdir, os.pardir):
            return f"{normal}.high-water"
        return str(self.high_water_path(config_dir))  # `.`, `..`: named by where it is

    @field_validator("retired_verifier_keys")
    @classmethod
    def _retired_keys(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        try:
            # two keys under one name and key id: which one signed is ambiguous (keys.py)
            unambiguous([Verifier(vkey) for vkey in value])
        except KeyFormatError as exc:
            raise ValueError(str(exc)) from exc
        return value

    @field_validator("witnesses")
    @classmethod
    def _distinct_witnesses(cls, value: tuple[WitnessSettings, ...]) -> tuple[WitnessSettings, ...]:
        # One key listed twice would be asked twice, racing itself, and shown as two
        # witnesses in the readiness detail and metrics.
        keys = [CosignatureVerifier(witness.vkey) for witness in value]
        distinct_witnesses(keys)
        try:  # two under one name and key id: each would check the other's lines
            unambiguous_witnesses(keys)
        except KeyFormatError as exc:
            raise ValueError(str(exc)) from exc
        return value
