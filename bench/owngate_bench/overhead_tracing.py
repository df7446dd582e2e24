"""The cost of OpenTelemetry tracing: `owngate+tracing` beside plain `owngate`.

`owngate+tracing` is the `owngate` target's configuration with tracing switched on the
standard way (`OTEL_EXPORTER_OTLP_ENDPOINT`), exporting over OTLP/HTTP to `TraceSink`:
a loopback server in the benchmark's own process that reads each export and drops it
(a collector's cost is not the gateway's: its CPU is not counted). The sink counts what
it received, so the report shows that spans did flow. `tracing_comparison(points)` sets
the two side by side, point by point (server CPU per request, throughput) with the
ratio; `render_tracing` prints it. `on_off_comparison` and `render_on_off` do the same
for any target that is plain owngate with one feature on (`owngate+accesslog`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "TRACED",
    "TraceSink",
    "on_off_comparison",
    "render_on_off",
    "render_tracing",
    "tracing_comparison",
]

TRACED = "owngate+tracing"
_PLAIN = "owngate"
_MAX_EXPORT = 64 << 20  # bytes: a bigger export is refused (413)


class TraceSink:
    """An OTLP/HTTP endpoint on loopback that accepts span exports and drops them."""

    def __init__(self, host: str) -> None:
        sink = self
        self.exports = 0
        self.bytes = 0
        self._lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # the http.server API names it
                length = int(self.headers.get("content-length") or 0)
                if length > _MAX_EXPORT:
                    self.send_response(413)
                    self.end_headers()
                    return
                self.rfile.read(length)
                sink.received(length)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return  # quiet: the benchmark's output is its table

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def environment(self) -> dict[str, str]:
        """The variables that switch a gateway's tracing on, exporting here."""
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint, "OTEL_SERVICE_NAME": "owngate-bench"}

    def received(self, length: int) -> None:
        with self._lock:
            self.exports += 1
            self.bytes += length

    def __enter__(self) -> TraceSink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def _ok(row: Mapping[str, Any], target: str) -> Mapping[str, Any] | None:
    result = row["results"].get(target)
    if result is None or "error" in result or not result.get("requests"):
        return None
    found: Mapping[str, Any] = result
    return found


def _cpu_ms_per_req(result: Mapping[str, Any]) -> float | None:
    cpu = result.get("cpu_s", {}).get("target")
    requests = result.get("requests", 0)
    return cpu * 1000 / requests if cpu is not None and requests else None


def tracing_comparison(points: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per load point both ran: server CPU ms per request and req/s, tracing off and on,
    and the ratio on ÷ off."""
    return on_off_comparison(points, TRACED)


def on_off_comparison(points: Sequence[Mapping[str, Any]], target: str) -> list[dict[str, Any]]:
    """Per load point both ran: server CPU ms per request and req/s of plain owngate (off)
    and `target` (on), and the ratio on ÷ off."""
    rows: list[dict[str, Any]] = []
    for row in points:
        off, on = _ok(row, _PLAIN), _ok(row, target)
        if off is None or on is None:
            continue
        entry: dict[str, Any] = {"name": row["name"]}
        for key, pick in (
            ("cpu_ms_per_req", _cpu_ms_per_req),
            ("req_per_s", lambda r: float(r["req_per_s"])),
        ):
            a, b = pick(off), pick(on)
            ratio = b / a if a and b else None
            entry[key] = {"off": a, "on": b, "ratio": ratio}
        rows.append(entry)
    return rows


def render_tracing(rows: Sequence[Mapping[str, Any]], sink: Mapping[str, int] | None) -> list[str]:
    """The comparison as table lines (none when the tracing target did not run)."""
    heading = (
        "tracing on vs off (owngate+tracing ÷ owngate; spans exported over OTLP/HTTP to a "
        "loopback sink that drops them)"
    )
    out = render_on_off(rows, heading)
    if out and sink is not None:
        out.append(f"the sink received {sink['exports']:,} exports, {sink['bytes']:,} bytes")
    return out


def render_on_off(rows: Sequence[Mapping[str, Any]], heading: str) -> list[str]:
    """An `on_off_comparison` as table lines under `heading` (none when it is empty)."""
    if not rows:
        return []

    def num(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{value:,.{digits}f}"

    out = [
        "",
        heading,
        f"{'load':<12}{'cpu ms/req off':>16}{'on':>9}{'ratio':>8}"
        f"{'req/s off':>12}{'on':>9}{'ratio':>8}",
    ]
    for row in rows:
        cpu, rps = row["cpu_ms_per_req"], row["req_per_s"]
        out.append(
            f"{row['name']:<12}{num(cpu['off'], 4):>16}{num(cpu['on'], 4):>9}"
            f"{num(cpu['ratio'], 3):>8}{num(rps['off'], 0):>12}{num(rps['on'], 0):>9}"
            f"{num(rps['ratio'], 3):>8}"
        )
    return out
