"""Filters: which backends a request may be offered to at all (never a score).

- `trust`: the tenant's trust-policy decision, the eligible private and hosted backends.
- `health`: backends whose circuit breaker is open or whose `/health` probes marked them
  down are skipped, with the reason the client's error then names.
"""

__all__: list[str] = []
