"""A C2SP tlog-witness: cosign a log's checkpoints only while the log stays append-only.

For each log it trusts (a verifier key whose name is the log's origin; with `workers=N`,
also the logs `<name>/worker-1` .. `<name>/worker-N` that `owngate serve --workers N` signs
with that key), the witness remembers the latest tree it cosigned (`witness.state`).
`add_checkpoint` follows the spec's add-checkpoint rules, in its order:

1. origin not configured: `unknown_log` (HTTP 404); no valid signature by a key trusted
   for that origin, or only by a key a rotation retired (`_next_head`): `untrusted` (403);
   unparseable request or note: `malformed` (400);
2. old size larger than the checkpoint's size (a rollback): `malformed` (400);
3. old size not the size the witness last cosigned: `conflict` (409), which carries the
   size it knows, so a log that lost track can ask again;
4. consistency proof from the recorded tree to the new one fails: `inconsistent` (422);
   same size with another root hash (a fork): `conflict` (409);
5. otherwise the new tree is persisted (atomically, before answering) and a timestamped
   cosignature/v1 line is returned; the time comes from the injected clock, but is never
   earlier than the last cosignature's for the same log (persisted too).

Steps 3-5 run under one lock, so two concurrent requests cannot roll each other back.
Pure: no HTTP here (see `witness.app`), only files for the state.
"""

from __future__ import annotations

import base64
import binascii
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Literal

from gateway.provenance.errors import (
    KeyFormatError,
    MalformedError,
    ProofError,
    ProvenanceError,
    SignatureError,
)
from gateway.provenance.formats.checkpoint import (
    MAX_TREE_SIZE,
    Checkpoint,
    SignedCheckpoint,
    open_checkpoint,
)
from gateway.provenance.formats.cosignature import MAX_TIMESTAMP, Cosigner, unambiguous_witnesses
from gateway.provenance.formats.merkle import EMPTY_ROOT, HASH_SIZE, verify_consistency
from gateway.provenance.formats.note import Verifier
from gateway.provenance.witness.state import TreeHead, WitnessState

__all__ = [
    "MAX_PROOF_LINES",
    "MAX_WORKERS",
    "AddCheckpoint",
    "Witness",
    "WitnessCode",
    "WitnessError",
]

MAX_PROOF_LINES = 63
#: the most `serve --workers` logs per log key a witness takes (`workers`)
MAX_WORKERS = 1024
#: what `serve --workers` appends to a worker's origin, before its number (1..N)
_WORKER = "/worker-"
# At most 20 digits: a uint64 (checked below), and never a number int() refuses.
_OLD_LINE = re.compile(r"old (0|[1-9][0-9]{0,19})\Z")

WitnessCode = Literal[
    "malformed", "untrusted", "unknown_log", "conflict", "inconsistent", "unavailable"
]


class WitnessError(ProvenanceError):
    """The witness refused a checkpoint, or could not be asked (client side: `unavailable`).

    `code` is one of `WitnessCode`; `witness.app.STATUS` maps it to the spec's HTTP status.
    `known_size` is set for `conflict`: the size the witness last cosigned. `reason` is
    the code, or on the client side, for `unavailable` that was not the witness's own 503,
    what went wrong: `timeout`, `unreachable`, `tls`, `bad_answer` (not a well-formed HTTP/1.x
    answer within the bounds, or a 200 without cosignatures), `bad_status` (a status the
    spec does not give a witness, a redirect included).
    """

    def __init__(
        self,
        code: WitnessCode,
        message: str,
        *,
        known_size: int | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code: WitnessCode = code
        self.known_size = known_size
        self.reason: str = reason or code


@dataclass(frozen=True, slots=True)
class AddCheckpoint:
    """An add-checkpoint request: `old <size>`, proof lines, a blank line, the signed note."""

    old_size: int
    proof: tuple[bytes, ...]
    note: bytes

    def encode(self) -> bytes:
        if self.old_size < 0:
            raise ValueError("old size is negative")
        if len(self.proof) > MAX_PROOF_LINES:
            raise ValueError(f"a consistency proof has at most {MAX_PROOF_LINES} hashes")
        lines = [f"old {self.old_size}\n".encode()]
        lines.extend(base64.b64encode(item) + b"\n" for item in self.proof)
        return b"".join(lines) + b"\n" + self.note

    @classmethod
    def parse(cls, body: bytes) -> AddCheckpoint:
        """Parse a request body; raises WitnessError(`malformed`)."""
        head, blank, note = body.partition(b"\n\n")
        if not blank or not note:
            raise WitnessError("malformed", "request needs an old size line, a blank line, a note")
        try:
            lines = head.decode("ascii").split("\n")
        except UnicodeDecodeError as exc:
            raise WitnessError("malformed", "old size and proof lines must be ASCII") from exc
        match = _OLD_LINE.match(lines[0])
        if match is None:
            raise WitnessError("malformed", f"first line must be 'old <size>', not {lines[0]!r}")
        if len(lines) - 1 > MAX_PROOF_LINES:
            raise WitnessError("malformed", f"more than {MAX_PROOF_LINES} consistency proof lines")
        proof = []
        for number, line in enumerate(lines[1:], start=1):
            try:
                item = base64.b64decode(line.encode("ascii"), validate=True)
            except binascii.Error as exc:
                raise WitnessError("malformed", f"proof line {number} is not base64") from exc
            if len(item) != HASH_SIZE or base64.b64encode(item).decode("ascii") != line:
                raise WitnessError(
                    "malformed", f"proof line {number} is not a 32-byte hash in canonical base64"
                )
            proof.append(item)
        old_size = int(match.group(1))
        if old_size > MAX_TREE_SIZE:
            raise WitnessError("malformed", "old size is larger than 2^64-1")
        return cls(old_size, tuple(proof), note)


def _origin(note: bytes) -> str:
    first, newline, _ = note.partition(b"\n")
    try:
        origin = first.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WitnessError("malformed", "checkpoint origin line is not UTF-8") from exc
    if not newline or not origin:
        raise WitnessError("malformed", "checkpoint has no origin line")
    return origin


def _worker_number(text: str, workers: int) -> bool:
    """Whether `text` is a worker's number 1..`workers` as `serve --workers` writes it."""
    return (
        text.isascii()
        and text.isdigit()
        and text[0] != "0"
        and len(text) <= len(str(MAX_WORKERS))  # never an int() of thousands of digits
        and int(text) <= workers
    )


def _unambiguous_workers(logs: Sequence[Verifier], workers: int) -> None:
    """Raise KeyFormatError for a log key named `<name>/worker-<i>` (i <= `workers`) beside
    one named `<name>`: that origin would be two logs, and the other key's holder could
    fork worker i's tree in the state (its checkpoints cosigned, the gateway's refused)."""
    names = {verifier.name for verifier in logs}
    for name in sorted(names):
        base, found, number = name.rpartition(_WORKER)
        if found and base in names and _worker_number(number, workers):
            raise KeyFormatError(
                f"log keys {base!r} and {name!r}: with {workers} `serve --workers` logs "
                f"per key, {name!r} is worker {number}'s log of {base!r}; trust one of "
                "them, or witness fewer workers"
            )


def _extras(head: TreeHead) -> tuple[object, ...]:
    """What a head records besides the tree itself (its equality compares only the tree)."""
    return head.keys, head.seen, head.time


def _next_head(known: TreeHead | None, new: Checkpoint, signers: set[str]) -> TreeHead:
    """The head to record for `new`, signed by `signers`; refuses a retired key.

    A key rotation goes A, A+B, B (docs/provenance.md, "Keys"). Once B has signed a
    checkpoint this witness cosigned, one signed only by A (or by any key seen before and
    not B) is what someone who kept the retired key would send: `untrusted`. A key never
    seen before is a new rotation and is accepted.
    """
    if known is None or not known.seen:  # a new log, or a state from before keys were kept
        return TreeHead(new.size, new.root, tuple(sorted(signers)), tuple(sorted(signers)))
    fresh = signers - set(known.seen)
    if not fresh and not signers & set(known.keys):
        raise WitnessError(
            "untrusted",
            f"checkpoint of {new.origin!r} is signed only by {', '.join(sorted(signers))}, "
            f"but the witness already cosigned one by the newer key "
            f"{', '.join(known.keys)}: a key retired by a rotation does not sign alone again",
        )
    keys = tuple(sorted(fresh)) if fresh else known.keys
    return TreeHead(new.size, new.root, keys, tuple(sorted(signers | set(known.seen))))


class Witness:
    """The cosigning core; use `Witness.open` (it locks and loads the state file)."""

    def __init__(
        self,
        cosigner: Cosigner,
        logs: Iterable[Verifier],
        state: WitnessState,
        *,
        clock: Callable[[], float] = time.time,
        workers: int = 0,
    ) -> None:
        if not 0 <= workers <= MAX_WORKERS:
            raise ValueError(f"workers is 0..{MAX_WORKERS}, not {workers}")
        logs = list(logs)
        # Its cosignature lines under a log key's name and id would fail that log's note
        # for every verifier that trusts the key (unambiguous_witnesses): refuse to start.
        unambiguous_witnesses([cosigner.verifier()], logs)
        _unambiguous_workers(logs, workers)
        self.cosigner = cosigner
        self._logs: dict[str, list[Verifier]] = {}
        for verifier in logs:  # the key name is the log's origin (C2SP tlog-checkpoint)
            self._logs.setdefault(verifier.name, []).append(verifier)
        self._state = state
        self._clock = clock
        self._lock = threading.Lock()
        self.workers = workers

    @classmethod
    def open(
        cls,
        state_path: str | Path,
        cosigner: Cosigner,
        logs: Iterable[Verifier],
        *,
        clock: Callable[[], float] = time.time,
        new: bool = False,
        workers: int = 0,
    ) -> Witness:
        """Open the witness on its state file; `new` creates the file (it must not exist).
        A key under a log key's name and id, or `workers` out of range, is refused before
        the state is opened."""
        logs = list(logs)
        unambiguous_witnesses([cosigner.verifier()], logs)
        if not 0 <= workers <= MAX_WORKERS:
            raise ValueError(f"workers is 0..{MAX_WORKERS}, not {workers}")
        _unambiguous_workers(logs, workers)
        state = WitnessState.open(state_path, new=new)
        return cls(cosigner, logs, state, clock=clock, workers=workers)

    @property
    def origins(self) -> tuple[str, ...]:
        return tuple(sorted(self._logs))

    def latest(self, origin: str) -> TreeHead | None:
        """The latest tree cosigned for `origin` (None: never cosigned)."""
        return self._state.get(origin)

    def submit(self, body: bytes) -> bytes:
        """Handle an add-checkpoint request body; returns the cosignature line(s)."""
        request = AddCheckpoint.parse(body)
        return self.add_checkpoint(request.old_size, request.proof, request.note)

    def add_checkpoint(self, old_size: int, proof: Sequence[bytes], note: bytes) -> bytes:
        """Cosign `note` (a signed checkpoint) after the checks listed in the module doc.

        Returns the cosignature line `— <name> <base64>\\n` as bytes; raises WitnessError.
        """
        signed = self._open(note)
        new = signed.checkpoint
        if old_size < 0:
            raise WitnessError("malformed", "old size is negative")
        if old_size > new.size:
            raise WitnessError(
                "malformed",
                f"old size {old_size} is larger than the checkpoint size {new.size}: "
                "a log does not shrink (rollback refused)",
            )
        with self._lock:
            known = self._state.get(new.origin)
            known_size = known.size if known is not None else 0
            if old_size != known_size:
                raise WitnessError(
                    "conflict",
                    f"old size {old_size} is not the size {known_size} last cosigned for "
                    f"{new.origin}",
                    known_size=known_size,
                )
            self._check_extension(known, new, proof)
            signers = {f"{s.name}+{s.key_id:08x}" for s in signed.signatures.verified}
            timestamp = self._timestamp(known)
            head = replace(_next_head(known, new, signers), time=timestamp)
            if known is None or head != known or _extras(head) != _extras(known):
                try:
                    self._state.update(new.origin, head)
                except OSError as exc:
                    reason = exc.strerror or str(exc)
                    raise WitnessError("unavailable", f"cannot persist state: {reason}") from exc
            return self.cosigner.cosign(signed.signatures.text, timestamp).line().encode()

    def _timestamp(self, known: TreeHead | None) -> int:
        """The clock's time, but never before the newest cosignature for this log.

        A cosignature says that, as of its time, its tree was the largest this witness had
        seen: one for a larger tree dated before one for a smaller tree (the clock stepped
        back, or the witness restarted with a slow clock) would contradict it. The floor
        is persisted with the head, so it holds across restarts; a re-cosigned head costs
        a state write only when the second has changed.
        """
        floor = known.time if known is not None else 0
        return min(max(int(self._clock()), floor), MAX_TIMESTAMP)

    def _verifiers(self, origin: str) -> list[Verifier] | None:
        """The keys trusted for the log `origin`: those named for it; else, for a worker's
        log `<name>/worker-<i>` (1 <= i <= `workers`, written as `serve --workers` writes
        it: no sign, no leading zero), those named `<name>`. None: a log it does not know."""
        own = self._logs.get(origin)
        if own is not None:
            return own
        name, found, number = origin.rpartition(_WORKER)
        if not found or not _worker_number(number, self.workers):
            return None
        return self._logs.get(name)

    def _open(self, note: bytes) -> SignedCheckpoint:
        origin = _origin(note)
        verifiers = self._verifiers(origin)
        if verifiers is None:
            raise WitnessError("unknown_log", self._unknown(origin))
        try:
            return open_checkpoint(note, verifiers, origin=origin)
        except SignatureError as exc:
            raise WitnessError("untrusted", f"checkpoint of {origin!r}: {exc}") from exc
        except MalformedError as exc:
            raise WitnessError("malformed", f"checkpoint of {origin!r}: {exc}") from exc

    def _unknown(self, origin: str) -> str:
        message = f"this witness does not know the log {origin!r}"
        name, found, number = origin.rpartition(_WORKER)
        if found and name in self._logs and _worker_number(number, MAX_WORKERS):
            message += f" (it takes {self.workers} `serve --workers` logs of {name!r})"
        return message

    @staticmethod
    def _check_extension(known: TreeHead | None, new: Checkpoint, proof: Sequence[bytes]) -> None:
        """Raise unless `new` extends the recorded tree `known` (None: nothing recorded)."""
        if known is None or known.size == 0:
            if proof:
                raise WitnessError("inconsistent", "a proof from old size 0 must be empty")
            if new.size == 0 and new.root != EMPTY_ROOT:
                raise WitnessError("inconsistent", "an empty tree's root must be SHA-256('')")
            return
        if new.size == known.size:
            if new.root != known.root:
                raise WitnessError(
                    "conflict",
                    f"{new.origin} signed two different root hashes for size {new.size} "
                    "(a fork); the witness keeps the one it cosigned",
                    known_size=known.size,
                )
            if proof:
                raise WitnessError("inconsistent", "a proof between equal sizes must be empty")
            return
        try:
            verify_consistency(known.size, new.size, proof, known.root, new.root)
        except ProofError as exc:
            raise WitnessError(
                "inconsistent",
                f"{new.origin} size {new.size} is not consistent with the cosigned size "
                f"{known.size}: {exc}",
            ) from exc

    def close(self) -> None:
        self._state.close()

    def __enter__(self) -> Witness:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
