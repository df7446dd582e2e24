"""The KV-cache scorer: room in the backend's KV cache.

    kv = 1 - kv_usage, clamped to 0..1; 0.5 when the backend does not publish it

Input: the scraped KV-cache use, 0..1 (`BackendLoad.kv_usage`, gateway/routing/signals.py;
None when unknown, e.g. current llama.cpp). Config: the weight `routing.*.weights.kv`
(default 0.3), `scrape`.
"""

from __future__ import annotations

__all__ = ["kv_score"]


def kv_score(kv_usage: float | None) -> float:
    if kv_usage is None:
        return 0.5
    return 0.0 if kv_usage >= 1.0 else 1.0 if kv_usage <= 0.0 else 1.0 - kv_usage
