"""Key rotation order in a log's history: a retired key never signs alone again, and a
rotation keeps the key's name.

A rotation hands over from key A to key B through checkpoints signed by both (docs/
provenance.md, "Keys"): A, A+B, ..., B. Once B has signed a checkpoint, every later
checkpoint must carry B or a key that never signed before (the next rotation): one signed
only by A after that is what someone who kept the retired key A, and not B, would write,
and an auditor given both keys (`--key A --key B`) must not accept it. The rule needs no
knowledge of which key is newer: keys are ranked by the first checkpoint each signed.

A key that first signs after the first checkpoint must carry the name of a key that
signed before it: in a C2SP signed note the key name names the log, and the gateway
refuses a rotation that renames its key (`keys.one_log_name`). Without it, a key of
another log the auditor trusts (a replica's, given beside this log's) signed a log whose
origin names no key (`serve --workers`: `ORIGIN/worker-1`, signed by the key named
ORIGIN) as its "next rotation".
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.provenance.errors import LogVerificationError
from gateway.provenance.formats.checkpoint import SignedCheckpoint

__all__ = ["RotationOrder", "check_rotation_order"]


def check_rotation_order(history: Sequence[SignedCheckpoint], earlier: int = 0) -> None:
    """Raise LogVerificationError when a checkpoint breaks the rotation order
    (`RotationOrder.add`). `history` is in size order; its first `earlier` checkpoints
    (before a rotation, signed only by keys the auditor lacks) carry no trusted signature
    and are skipped."""
    order = RotationOrder(after_unsigned=earlier > 0)
    for signed in history[earlier:]:
        order.add(signed)


class RotationOrder:
    """The keys a history's checkpoints were signed by so far, in size order, as much as
    the rule needs (a few keys, whatever the history's length).

    `after_unsigned`: checkpoints no given key signed came first (`--accept-earlier-keys`),
    so a key given may have signed them with its lines since removed; a key that first
    signs later must then sign beside the newest key (the rotation's overlap). Else whoever
    kept the retired key A removed its lines from the history (A, A+B, B read as X, B, B)
    and signed alone again, A reading as the next rotation."""

    def __init__(self, *, after_unsigned: bool = False) -> None:
        self._after_unsigned = after_unsigned
        self._seen: set[str] = set()  # every key that signed so far
        self._names: set[str] = set()  # their names
        self._newest: set[str] = set()  # the keys that appeared last (several when at once)

    def add(self, signed: SignedCheckpoint) -> None:
        """Raise LogVerificationError when `signed`, the next checkpoint, lacks the newest
        key signed before it and carries no key that never signed before (a new
        rotation), or carries a key that never signed before under a name no earlier key
        had."""
        verified = signed.signatures.verified
        keys = {f"{s.name}+{s.key_id:08x}" for s in verified}
        fresh = keys - self._seen
        size = signed.checkpoint.size
        renamed = sorted(f"{s.name}+{s.key_id:08x}" for s in verified if s.name not in self._names)
        if self._names and renamed:
            raise LogVerificationError(
                f"checkpoint of size {size} is signed by {', '.join(renamed)}, named "
                f"otherwise than every key that signed the log before it "
                f"({', '.join(sorted(self._names))}): a key rotation keeps the key's name, "
                "which names the log, so this is another log's key"
            )
        if self._newest and fresh and self._after_unsigned and not keys & self._newest:
            raise LogVerificationError(
                f"checkpoint of size {size} is signed by {', '.join(sorted(fresh))}, which "
                f"never signed before, without the newest key {', '.join(sorted(self._newest))}:"
                " a rotation without an overlap, which after checkpoints no given key signed "
                "cannot be told from a retired key whose signatures were removed from them; "
                "give every key of the log, without --accept-earlier-keys"
            )
        if self._newest and not fresh and not keys & self._newest:
            raise LogVerificationError(
                f"checkpoint of size {size} is signed only by {', '.join(sorted(keys))}, "
                f"but an earlier checkpoint was already signed by the newer key "
                f"{', '.join(sorted(self._newest))}: a key retired by a rotation signed again "
                "(whoever holds the old key can extend the log this way)"
            )
        self._seen |= keys
        self._names.update(s.name for s in verified)
        if fresh:
            self._newest = fresh
