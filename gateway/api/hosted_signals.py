"""What operators are told when hosted calls fail on the gateway's side, not the provider's.

Two failures never reach a provider and charge no breaker, so without a signal they show
only as a counter: LiteLLM failing to load (`load_failed`: every hosted backend is
unavailable until it loads), and a backend whose call fails before anything is sent
(`untranslated`: a shape its adapter cannot translate, or the backend's own
misconfiguration, such as a malformed credential, failing every request the same way).
Each is counted in `owngate_upstream_errors_total` (kind `litellm_load`, `untranslated`)
and logged: one line naming the backend and the error's class name, at most once per
`every_s` per backend and failure, with how many occurred since the last line. The class
name comes from code; nothing the client sent and nothing an exception says is logged.
"""

from __future__ import annotations

from typing import Final

from gateway.api.metrics import GatewayMetrics
from gateway.log_tally import Tally
from gateway.logs import get_logger

__all__ = ["LOG_EVERY_S", "HostedSignals"]

LOG_EVERY_S: Final = 60.0


class HostedSignals:
    """Counts and logs hosted failures of the gateway's side (see the module docstring)."""

    def __init__(self, metrics: GatewayMetrics, every_s: float = LOG_EVERY_S) -> None:
        self._metrics = metrics
        self._reports = Tally(every_s)
        self._log = get_logger("owngate.upstream")

    def load_failed(self, backend: str, error_class: str, now: float) -> None:
        """LiteLLM failed to load for a call to `backend` (`error_class`: what it raised)."""
        self._metrics.upstream_error(backend, "litellm_load")
        count = self._reports.note(("litellm_load", backend), now)
        if count:
            self._log.error(
                "hosted providers unavailable: LiteLLM failed to load",
                backend=backend,
                error_class=error_class,
                count=count,
            )

    def untranslated(self, backend: str, error_class: str | None, now: float) -> None:
        """`backend`'s call failed before anything was sent (`error_class`: the class of
        the error its translation ended in)."""
        self._metrics.upstream_error(backend, "untranslated")
        count = self._reports.note(("untranslated", backend), now)
        if count:
            self._log.warning(
                "hosted backend failed before sending: a request its adapter cannot "
                "translate, or the backend's configuration (a malformed credential)",
                backend=backend,
                error_class=error_class or "unknown",
                count=count,
            )
