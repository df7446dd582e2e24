"""The prefill scorer: how little prompt waits at the backend for its first token.

    prefill = 1 - P / (P_max + 1024)

P is the estimated prompt tokens this gateway has sent the backend that have no first
byte yet (`BackendState.prefilling`: the prefill queued ahead of a new request, which
its time to first token waits for), P_max the largest P among the candidates; the 1024
damping makes a few hundred tokens of difference weigh little and a long prompt's worth
a lot. Bounded load: a candidate busier than the least loaded one by more than
`LOAD_SLACK` (gateway/routing/load.py) of its slots is scored as if it had P_max, so a
small server whose few slots are all decoding does not win on an empty prefill queue.

The estimate (`prefill_tokens`): ~4 bytes of request JSON per token, less the prefix
the backend's cache should hold (gateway/routing/scorers/affinity.py); counted when an
attempt sends, uncounted at its first byte or when it ends. Config: the weight
`routing.*.weights.prefill` (default 1.0).
"""

from __future__ import annotations

__all__ = ["PREFILL_DAMPING", "prefill_score", "prefill_tokens"]

PREFILL_DAMPING = 1024


def prefill_score(prefilling: int, busiest: int, lightly_loaded: bool) -> float:
    """`busiest`: P_max among the candidates."""
    return 1.0 - (prefilling if lightly_loaded else busiest) / (busiest + PREFILL_DAMPING)


def prefill_tokens(body_bytes: int, cached_bytes: int) -> int:
    """The prompt tokens a request of `body_bytes` adds to its backend's prefill queue."""
    return max(0, body_bytes - cached_bytes) // 4
