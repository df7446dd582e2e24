"""Hosted failures of the gateway's side: counted every time, logged at most once a minute
per backend and failure, with how many occurred since the last line (time is given)."""

from __future__ import annotations

from structlog.testing import capture_logs

from gateway.api.hosted_signals import HostedSignals
from gateway.api.metrics import GatewayMetrics
from gateway.log_tally import Tally


def errors(metrics: GatewayMetrics, backend: str, kind: str) -> float | None:
    labels = {"backend": backend, "kind": kind}
    return metrics.registry.get_sample_value("owngate_upstream_errors_total", labels)


def test_reports_say_once_per_interval_per_key_with_the_count_since() -> None:
    reports = Tally(every_s=60.0)
    a, b = ("untranslated", "claude"), ("untranslated", "spare")
    assert reports.note(a, 0.0) == 1
    assert reports.note(a, 10.0) == 0
    assert reports.note(b, 10.0) == 1  # another backend has its own interval
    assert reports.note(a, 59.9) == 0
    assert reports.note(a, 60.0) == 3  # this one and the two held back
    assert reports.note(a, 61.0) == 0
    assert reports.note(a, 500.0) == 2


def test_untranslated_is_counted_each_time_and_logged_once_per_interval() -> None:
    metrics = GatewayMetrics()
    signals = HostedSignals(metrics, every_s=60.0)
    with capture_logs() as logs:
        for now in (0.0, 1.0, 2.0, 61.0):
            signals.untranslated("claude", "Exception", now)
    assert errors(metrics, "claude", "untranslated") == 4
    said = [(e["log_level"], e["backend"], e["error_class"], e["count"]) for e in logs]
    assert said == [("warning", "claude", "Exception", 1), ("warning", "claude", "Exception", 3)]


def test_a_load_failure_is_counted_and_logged_as_an_error() -> None:
    metrics = GatewayMetrics()
    signals = HostedSignals(metrics, every_s=60.0)
    with capture_logs() as logs:
        signals.load_failed("claude", "ImportError", 0.0)
        signals.load_failed("claude", "ImportError", 5.0)
        signals.untranslated("claude", None, 5.0)  # its own interval
    assert errors(metrics, "claude", "litellm_load") == 2
    assert [(e["log_level"], e["error_class"]) for e in logs] == [
        ("error", "ImportError"),
        ("warning", "unknown"),
    ]
    assert logs[0]["event"] == "hosted providers unavailable: LiteLLM failed to load"
