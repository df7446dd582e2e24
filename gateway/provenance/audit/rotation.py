"""Key rotation order in a log's history: a retired key never signs alone again.

A rotation hands over from key A to key B through checkpoints signed by both (docs/
provenance.md, "Keys"): A, A+B, ..., B. Once B has signed a checkpoint, every later
checkpoint must carry B or a key that never signed before (the next rotation): one signed
only by A after that is what someone who kept the retired key A, and not B, would write,
and an auditor given both keys (`--key A --key B`) must not accept it. The rule needs no
knowledge of which key is newer: keys are ranked by the first checkpoint each signed.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.provenance.errors import LogVerificationError
from gateway.provenance.formats.checkpoint import SignedCheckpoint

__all__ = ["check_rotation_order"]


def check_rotation_order(history: Sequence[SignedCheckpoint], earlier: int = 0) -> None:
    """Raise LogVerificationError when a checkpoint lacks the newest key signed before it
    and carries no key that never signed before (a new rotation).

    `history` is in size order; its first `earlier` checkpoints (before a rotation, signed
    only by keys the auditor lacks) carry no trusted signature and are skipped.
    """
    first_seen: dict[str, int] = {}  # key -> position of the first checkpoint it signed
    newest: set[str] = set()  # the keys that appeared last (several when at once)
    for position, signed in enumerate(history):
        if position < earlier:
            continue
        keys = {f"{s.name}+{s.key_id:08x}" for s in signed.signatures.verified}
        fresh = {key for key in keys if key not in first_seen}
        if newest and not fresh and not keys & newest:
            size = signed.checkpoint.size
            raise LogVerificationError(
                f"checkpoint of size {size} is signed only by {', '.join(sorted(keys))}, "
                f"but an earlier checkpoint was already signed by the newer key "
                f"{', '.join(sorted(newest))}: a key retired by a rotation signed again "
                "(whoever holds the old key can extend the log this way)"
            )
        for key in fresh:
            first_seen[key] = position
        if fresh:
            newest = fresh
