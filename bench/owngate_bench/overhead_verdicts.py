"""Issue 16's targets as verdicts, from the overhead benchmark's points alone.

Each verdict reads the medians of one run (`overhead_points.fold`), side by side:

- production (`owngate+production`): server CPU per non-stream request at chat c=16
  (<= 0.25 ms) and c=1 (<= 0.4 ms); added p50 at c=1, its p50 minus direct's in the same
  run (<= 0.5 ms); server CPU per relayed chunk, coalesced streams at c=16 (<= 8 µs) and
  paced streams at c=256 (<= 20 µs); req/s at chat c=16 >= 0.25x nginx's;
- plain (`owngate`): <= 0.15 ms CPU per request at chat c=16, <= 5 µs per coalesced
  chunk at c=16;
- body size, each owngate target: CPU per request at 32 KB and 100 KB prompts <= 1.5x
  its 1 KB figure.

"CPU per relayed chunk" is the target's process-tree CPU over the chunks the client
received in the same window. A verdict is `met` (True), `not met` (False) or not
measured (None, with why). The seed-load and `serve --workers` targets are measured by
other verbs (`ELSEWHERE`). `chunk_table` and `body_table` print the figures behind them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from owngate_bench.verdict_figures import passes, shown

__all__ = ["ELSEWHERE", "body_table", "chunk_table", "render_verdicts", "verdicts"]

PROD = "owngate+production"
PLAIN = "owngate"
OWNGATES = ("owngate", "owngate+policy", "owngate+tracing", "owngate+accesslog", PROD)
BODY_POINTS = ("chat 1KB c=16", "chat 32KB c=16", "chat 100KB c=16")
CHUNK_POINTS = ("stream c=16", "stream c=64", "paced c=256")
ELSEWHERE = (
    "seed-load (one GH200's paced streams through one production worker: <= 0.5 core, "
    "TTFT p99 added <= 2 ms): `owngate bench seed-load`",
    "CPU per request flat from 1 to N workers: `owngate bench scale`",
)


def _result(points: Sequence[Mapping[str, Any]], point: str, target: str) -> Mapping[str, Any]:
    """A target's folded result at a point, or {"error": why not} when there is none."""
    row = next((p for p in points if p["name"] == point), None)
    if row is None:
        return {"error": f"point {point!r} not run"}
    result = row["results"].get(target)
    if result is None:
        return {"error": f"{target} not run at {point}"}
    if "error" in result or not result.get("requests"):
        return {"error": f"{target} failed at {point}"}
    if result.get("errors"):  # a failed answer costs less than a relayed one: not a figure
        return {"error": f"{target} had {result['errors']} errors at {point}"}
    found: Mapping[str, Any] = result
    return found


def _value(points: Sequence[Mapping[str, Any]], point: str, target: str, key: str) -> Any:
    result = _result(points, point, target)
    if "error" in result:
        return result["error"]
    value = result.get(key)
    return value if value is not None else f"no {key} for {target} at {point}"


def _verdict(
    ident: str, target: str, title: str, measured: Any, op: str, threshold: float, unit: str
) -> dict[str, Any]:
    """`measured` is a number or, when not measured, the reason (a string); judged as
    `verdict_figures.passes` does (a figure on its target exactly meets it)."""
    value = measured if isinstance(measured, int | float) else None
    met = None if value is None else passes(value, op, threshold)
    return {
        "id": ident,
        "target": target,
        "title": title,
        "measured": value,
        "op": op,
        "threshold": threshold,
        "unit": unit,
        "met": met,
        "why_not_measured": None if value is not None else str(measured),
    }


def _added_p50(points: Sequence[Mapping[str, Any]], target: str) -> Any:
    mine = _value(points, "chat c=1", target, "latency_ms")
    base = _value(points, "chat c=1", "direct", "latency_ms")
    for found in (mine, base):
        if not isinstance(found, dict):
            return found
    return float(mine["p50"]) - float(base["p50"])


def _ratio(
    points: Sequence[Mapping[str, Any]], a: tuple[str, str], b: tuple[str, str], key: str
) -> Any:
    top, bottom = _value(points, *a, key), _value(points, *b, key)
    for found in (top, bottom):
        if not isinstance(found, int | float):
            return found
    return top / bottom if bottom else "zero denominator"


def _reads(verdict: dict[str, Any], points: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Note how many reads a paced stream reached the client in, through the target and
    direct (or, without direct, the chunks of a stream: one read each): far fewer means
    the relay fell behind and sent several chunks per write, which makes each chunk look
    cheaper than one relayed on its own. A figure so measured that meets the target is not
    a paced chunk's cost: the verdict is then not measured, never met."""
    mine = _value(points, "paced c=256", verdict["target"], "reads_per_request")
    base, who = _value(points, "paced c=256", "direct", "reads_per_request"), "direct"
    if not isinstance(base, int | float):
        chunks = _value(points, "paced c=256", verdict["target"], "chunks_per_request")
        base, who = (chunks - 1 if isinstance(chunks, int | float) else base), "chunks - 1"
    if isinstance(mine, int | float) and isinstance(base, int | float):
        verdict["note"] = f"reads per stream {mine:.1f} ({who} {base:.1f})"
        if mine < 0.9 * base:
            verdict["note"] += ": fell behind, chunks coalesced"
            if verdict["met"]:
                figure = shown(verdict["measured"], 1, verdict["op"], verdict["threshold"])
                verdict["why_not_measured"] = (
                    f"the relay fell behind ({mine:.1f} reads per stream, {who} {base:.1f}): "
                    f"{figure} us is the cost of coalesced chunks, not of paced ones"
                )
                verdict["measured"], verdict["met"] = None, None
    return verdict


def verdicts(points: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every target line of issue 16 that this benchmark measures, in the issue's order."""
    cpu, chunk = "cpu_ms_per_req", "cpu_us_per_chunk"
    found = [
        _verdict(
            "production_cpu_c16", PROD, "CPU per request, chat c=16",
            _value(points, "chat c=16", PROD, cpu), "<=", 0.25, "ms",
        ),
        _verdict(
            "production_cpu_c1", PROD, "CPU per request, chat c=1",
            _value(points, "chat c=1", PROD, cpu), "<=", 0.4, "ms",
        ),
        _verdict(
            "production_added_p50_c1", PROD, "added p50 at c=1 (p50 - direct's p50)",
            _added_p50(points, PROD), "<=", 0.5, "ms",
        ),
        _verdict(
            "production_chunk_coalesced", PROD, "CPU per relayed chunk, coalesced c=16",
            _value(points, "stream c=16", PROD, chunk), "<=", 8.0, "us",
        ),
        _reads(_verdict(
            "production_chunk_paced", PROD, "CPU per relayed chunk, paced c=256",
            _value(points, "paced c=256", PROD, chunk), "<=", 20.0, "us",
        ), points),
        _verdict(
            "production_rps_vs_nginx", PROD, "req/s vs nginx, chat c=16",
            _ratio(points, ("chat c=16", PROD), ("chat c=16", "nginx"), "req_per_s"),
            ">=", 0.25, "x",
        ),
        _verdict(
            "plain_cpu_c16", PLAIN, "CPU per request, chat c=16",
            _value(points, "chat c=16", PLAIN, cpu), "<=", 0.15, "ms",
        ),
        _verdict(
            "plain_chunk_coalesced", PLAIN, "CPU per relayed chunk, coalesced c=16",
            _value(points, "stream c=16", PLAIN, chunk), "<=", 5.0, "us",
        ),
    ]  # fmt: skip
    ran = {t for p in points for t in p["results"]}
    for target in (t for t in OWNGATES if t in ran):
        for size, point in (("32KB", BODY_POINTS[1]), ("100KB", BODY_POINTS[2])):
            found.append(
                _verdict(
                    f"body_{size.lower()}_vs_1kb:{target}",
                    target,
                    f"CPU per request, {size} prompt ÷ 1KB",
                    _ratio(points, (point, target), (BODY_POINTS[0], target), cpu),
                    "<=",
                    1.5,
                    "x",
                )
            )
    return found


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def render_verdicts(found: Sequence[Mapping[str, Any]], reps: int) -> list[str]:
    """The verdicts as lines: met / not met / n/a, target, what, figure and threshold."""
    out = [
        "",
        f"issue 16 targets (medians of {reps} interleaved repetition{'s' * (reps != 1)}, same run)",
    ]
    for v in found:
        word = {True: "met", False: "NOT MET", None: "n/a"}[v["met"]]
        limit = f"(target {v['op']} {v['threshold']:g} {v['unit']})"
        if v["measured"] is None:
            figure = f"not measured: {v['why_not_measured']}"
        else:
            digits = 3 if v["unit"] in ("ms", "x") else 1
            figure = f"{shown(v['measured'], digits, v['op'], v['threshold'])} {v['unit']}"
        note = f"; {v['note']}" if v.get("note") else ""
        out.append(f"{word:<8} {v['target']:<19} {v['title']:<40} {figure} {limit}{note}")
    out += [f"elsewhere: {line}" for line in ELSEWHERE]
    return out


def chunk_table(points: Sequence[Mapping[str, Any]], targets: Sequence[str]) -> list[str]:
    """Server CPU µs per relayed chunk (and client reads per stream) for each target and
    stream shape."""
    rows = [p for p in points if p["name"] in CHUNK_POINTS]
    if not rows:
        return []
    out = [
        "",
        "server CPU per relayed chunk in us (in brackets: reads per stream, how many pieces "
        "the client got each stream in)",
        f"{'target':<20}" + "".join(f"{p['name']:>24}" for p in rows),
    ]
    for target in targets:
        cells = []
        for row in rows:
            result = _result(points, row["name"], target)
            if "error" in result:
                cells.append(f"{'-':>24}")
                continue
            us, reads = result.get("cpu_us_per_chunk"), result.get("reads_per_request")
            cells.append(f"{_num(us, 1):>14} ({_num(reads, 1):>5})  ")
        out.append(f"{target:<20}" + "".join(cells))
    return out


def body_table(points: Sequence[Mapping[str, Any]], targets: Sequence[str]) -> list[str]:
    """Server CPU ms per request at 1, 32 and 100 KB prompts, and the ratios to 1 KB."""
    rows = [p for p in points if p["name"] in BODY_POINTS]
    if not rows:
        return []
    out = [
        "",
        "server CPU per request by prompt size, chat c=16 (ms; ratio to 1 KB)",
        f"{'target':<20}{'1KB':>10}{'32KB':>10}{'ratio':>8}{'100KB':>10}{'ratio':>8}",
    ]
    for target in targets:
        base, *rest = (_value(points, name, target, "cpu_ms_per_req") for name in BODY_POINTS)
        if not isinstance(base, int | float):
            continue
        line = f"{target:<20}{base:>10.4f}"
        for value in rest:
            ok = isinstance(value, int | float)
            line += f"{_num(value if ok else None, 4):>10}"
            line += f"{_num(value / base if ok and base else None, 2):>8}"
        out.append(line)
    return out
