"""The one error hierarchy of the provenance package.

Every failure is a `ProvenanceError`; `verify*()` functions raise one of these and never
return a bool. Messages are written for the human running `owngate audit`, and never
carry request or response content.
"""

from __future__ import annotations

__all__ = [
    "CommitmentMismatchError",
    "HighWaterFullError",
    "KeyFormatError",
    "LogCorruptedError",
    "LogForkError",
    "LogUnavailableError",
    "LogVerificationError",
    "MalformedError",
    "ProofError",
    "ProvenanceError",
    "RecordError",
    "SignatureError",
]


class ProvenanceError(Exception):
    """Base class of every error raised by `gateway.provenance`."""


class MalformedError(ProvenanceError):
    """Bytes that do not follow their format (note, checkpoint, tile, proof, envelope)."""


class KeyFormatError(MalformedError):
    """A signer or verifier key string (or key file) that cannot be parsed."""


class SignatureError(ProvenanceError):
    """No valid signature by a trusted key, or a signature that does not verify."""


class ProofError(ProvenanceError):
    """A Merkle inclusion or consistency proof that does not verify."""


class RecordError(ProvenanceError):
    """A record that does not follow the provenance record schema."""


class CommitmentMismatchError(ProvenanceError):
    """A body and salt that do not open the given commitment."""


class LogUnavailableError(ProvenanceError):
    """The log cannot be written now (disk full, permission, closed); nothing was logged.

    The gateway answers 503 while this is raised; the writer retries on the next append.
    """


class LogCorruptedError(ProvenanceError):
    """The writer found damage it must not repair on its own (beyond a torn tail)."""


class LogForkError(LogCorruptedError):
    """The log directory holds less than (or another tree than) the log under this origin
    already signed: going on would sign a second tree under the same origin and key."""


class HighWaterFullError(LogCorruptedError):
    """The high-water file holds as many retired logs' checkpoints as it may: it is not
    read past its bound, and no further log is left behind in it (docs/provenance.md,
    "Starting over")."""


class LogVerificationError(ProvenanceError):
    """`verify_log` found the log inconsistent; `index` is the first bad entry, if known."""

    def __init__(self, reason: str, *, index: int | None = None) -> None:
        self.reason = reason
        self.index = index
        where = f"entry {index}: " if index is not None else ""
        super().__init__(where + reason)
