"""The witness, its client and the audit's quorum against hostile peers.

A log operator who wants a cosignature it should not get, a witness that answers badly,
and a log directory that tries to count one witness twice. The helpers and the real log
come from `test_witness`.
"""

from __future__ import annotations

import pytest

from gateway.provenance import Checkpoint, MalformedError
from gateway.provenance.witness.witness import Witness
from tests.integration.test_witness import (  # the fixtures are used by name
    RealLog,
    _Refusal,
    real_log,
    witness,
)

__all__ = ["real_log", "witness"]


# --- a hostile log operator --------------------------------------------------------------------


def test_an_old_size_past_uint64_is_malformed_not_a_crash(
    witness: Witness, real_log: RealLog
) -> None:
    # int() raises ValueError past 4300 digits: that escaped as a 500 with a traceback.
    with _Refusal("malformed"):
        witness.submit(b"old " + b"9" * 5000 + b"\n\n" + real_log.notes[1])
    assert witness.latest(real_log.checkpoint(1).origin) is None


def test_a_checkpoint_size_past_uint64_is_malformed() -> None:
    root = "A" * 43 + "="
    for size in ("9" * 5000, str(2**64)):
        with pytest.raises(MalformedError, match="2\\^64"):
            Checkpoint.parse(f"example.com/log\n{size}\n{root}\n")
    assert Checkpoint.parse(f"example.com/log\n{2**64 - 1}\n{root}\n").size == 2**64 - 1
