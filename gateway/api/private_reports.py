"""What the relay to private backends (gateway/api/passthrough.py) reports of a backend's
answers and failures: the metrics, and log lines about conditions that can repeat for every
request (a backend's `owngate-` comment lines, the process out of file descriptors) said at
most once a minute with a count, never per request."""

from __future__ import annotations

import asyncio

from gateway.api.exchange import Exchange
from gateway.api.metrics import GatewayMetrics
from gateway.log_tally import Tally
from gateway.logs import get_logger
from gateway.routing.registry import BackendState
from gateway.upstream.http import UpstreamError

__all__ = ["PrivateReports"]

_LOG_EVERY_S = 60.0


class PrivateReports:
    """One relay's reports (its tally of what was said lives as long as the relay)."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._metrics = metrics
        self._tally = Tally(_LOG_EVERY_S)  # per backend's comment lines, and `exhausted`
        self._log = get_logger("owngate.upstream")

    def stripped(self, backend: str, lines: int) -> None:
        """Count the `owngate-` comment lines a backend's answer held (`CommentFilter`)
        and say so, at most once a minute per backend (how many since, never what)."""
        if not lines:
            return
        self._metrics.sse_comments_stripped(backend, lines)
        said = self._tally.note(backend, asyncio.get_running_loop().time(), lines)
        if said:
            self._log.warning(
                "backend answer held owngate comment lines: removed", backend=backend, lines=said
            )

    def failed(self, exchange: Exchange, backend: BackendState, error: UpstreamError) -> None:
        """Count a failed attempt by its kind (on the exchange too, for its access line),
        and say a TLS refusal, or the process out of file descriptors (once a minute)."""
        if error.kind == "tls":  # on connecting, or an alert after it: say why, where
            # operators look (the gateway's words and OpenSSL's, never the backend's body)
            self._log.warning("backend refused: TLS", backend=backend.id, reason=error.detail)
        elif error.kind == "exhausted":  # the process's state: a line a minute, with a count
            said = self._tally.note("exhausted", asyncio.get_running_loop().time())
            if said:
                self._log.error(
                    "out of file descriptors: backend connections refused",
                    reason=error.detail,
                    requests=said,
                )
        self._metrics.upstream_error(backend.id, error.kind)
        exchange.upstream_error = error.kind
