"""The counters `Attester` remembers from a sidecar's key, to refuse a counter used twice.

The sidecar takes its counter when it signs, at the end of an answer; the gateway judges
each answer once it has read it, so concurrent requests reach the check a little out of
counter order. The gateway remembers a window of counters (`_WINDOW`) and refuses one at
or below the highest it has forgotten: a counter it can no longer tell apart from a
replay. Which one it forgets decides both ways a check can go wrong: forgetting by
arrival order (not the lowest first) let a replayed counter through once a later-arriving
lower one was the oldest remembered, and refused a valid late counter that nothing
forgotten was above.
"""

from __future__ import annotations

import pytest

from gateway.api.attested import _WINDOW, Attester
from gateway.api.metrics import GatewayMetrics
from gateway.provenance.formats.attestation import AttestationFailure
from gateway.provenance.testing import seeded_signer

SIGNER = seeded_signer("gpu-a")


def _attester() -> Attester:
    return Attester("gpu", SIGNER.vkey, GatewayMetrics())


def _refused(attester: Attester, counter: int) -> bool:
    """Whether the counter is refused (as `replayed`: the only code `_fresh` raises)."""
    try:
        attester._fresh(counter)
    except AttestationFailure as failure:
        return failure.code == "replayed"
    return False


def test_counters_out_of_order_are_accepted_and_repeats_refused() -> None:
    attester = _attester()
    assert not any(_refused(attester, c) for c in (5, 3, 4, 1, 2, 9, 7))
    assert all(_refused(attester, c) for c in (5, 3, 4, 1, 2, 9, 7))
    assert not _refused(attester, 8)


def test_a_counter_forgotten_after_arriving_before_a_lower_one_is_still_refused() -> None:
    attester = _attester()
    # 2 arrives before 1 (two requests finishing together), then the window fills up
    assert not any(_refused(attester, c) for c in (2, 1, *range(3, _WINDOW + 2)))
    # One counter too many: one is forgotten. Forgetting by arrival order dropped 2 and
    # kept 1 as the oldest remembered: 2 was above it, not remembered, and passed again.
    assert _refused(attester, 2)
    assert _refused(attester, 1)
    assert not _refused(attester, _WINDOW + 2)


def test_a_late_counter_is_accepted_while_nothing_above_it_was_forgotten() -> None:
    attester = _attester()
    # 3 and 1 first, then the window is full; 2 was never seen and nothing was forgotten
    assert not any(_refused(attester, c) for c in (3, 1, *range(4, _WINDOW + 2)))
    assert not _refused(attester, 2)  # arrival order refused it: below 3, the oldest
    assert _refused(attester, 2)
    # the window is full: the lowest counter is forgotten, and anything at or below it
    # is refused from then on (too old to tell from a replay)
    assert _refused(attester, 1)
    assert _refused(attester, 0)


@pytest.mark.parametrize("counter", [0, 2**53])
def test_the_ends_of_the_counter_range_are_counters_like_any(counter: int) -> None:
    attester = _attester()
    assert not _refused(attester, counter)
    assert _refused(attester, counter)
