"""The overhead benchmark's verdicts and table, computed from its JSON report alone.

`evaluate_checks(points)` turns measured load points into the issue's targets (added
latency, throughput, ratio to LiteLLM), each with its margin; `render(report)` prints the
side-by-side table. Both read only plain data, so a saved report can be shown again:

    python -c 'import json, sys; from gateway.bench.report import render
    print(render(json.load(open(sys.argv[1]))))' .bench/overhead.json
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["evaluate_checks", "render"]

_COLUMNS = ("direct", "owngate", "litellm")


def _ok(row: Mapping[str, Any], target: str) -> Mapping[str, Any] | None:
    result = row["results"].get(target)
    if result is None or "error" in result or not result.get("requests"):
        return None
    found: Mapping[str, Any] = result
    return found


def _best(points: Sequence[Mapping[str, Any]], target: str, key: str, stream: bool) -> float | None:
    values = [
        float(result[key])
        for row in points
        if row["stream"] == stream and (result := _ok(row, target)) is not None
    ]
    return max(values) if values else None


def _added_p50(points: Sequence[Mapping[str, Any]], target: str) -> float | None:
    for row in points:
        if row["stream"] or row["concurrency"] != 1:
            continue
        mine, base = _ok(row, target), _ok(row, "direct")
        if mine is not None and base is not None:
            return float(mine["latency_ms"]["p50"] - base["latency_ms"]["p50"])
    return None


def _check(
    ident: str, title: str, measured: float | None, op: str, threshold: float, unit: str
) -> dict[str, Any]:
    passed: bool | None = None
    margin = ""
    if measured is not None:
        passed = measured <= threshold if op == "<=" else measured >= threshold
        if op == "<=":
            margin = f"{threshold - measured:+.3g} {unit} to spare"
        else:
            margin = f"{(measured / threshold - 1) * 100:+.0f}% vs target"
    return {
        "id": ident,
        "title": title,
        "measured": measured,
        "op": op,
        "threshold": threshold,
        "unit": unit,
        "passed": passed,
        "margin": margin,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def evaluate_checks(points: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets for one gateway worker on a 2-core machine; None = not measured."""
    og_rps = _best(points, "owngate", "req_per_s", stream=False)
    og_chunks = _best(points, "owngate", "chunks_per_s", stream=True)
    ll_rps = _best(points, "litellm", "req_per_s", stream=False)
    ll_chunks = _best(points, "litellm", "chunks_per_s", stream=True)
    return [
        _check(
            "added_p50_c1",
            "added p50 latency, chat c=1",
            _added_p50(points, "owngate"),
            "<=",
            1.0,
            "ms",
        ),
        _check("chat_req_per_s", "non-streaming req/s (best)", og_rps, ">=", 2000.0, "req/s"),
        _check(
            "stream_chunks_per_s",
            "relayed stream chunks/s (best)",
            og_chunks,
            ">=",
            50000.0,
            "chunks/s",
        ),
        _check(
            "vs_litellm_chat",
            "throughput vs LiteLLM, chat (best ÷ best)",
            _ratio(og_rps, ll_rps),
            ">=",
            20.0,
            "x",
        ),
        _check(
            "vs_litellm_stream",
            "throughput vs LiteLLM, streams (best ÷ best)",
            _ratio(og_chunks, ll_chunks),
            ">=",
            20.0,
            "x",
        ),
    ]


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _cpu_per(result: Mapping[str, Any], stream: bool) -> float | None:
    """Server CPU ms per request, or per 1,000 chunks for streams."""
    cpu = result.get("cpu_s", {}).get("target")
    count = result.get("chunks", 0) / 1000 if stream else result.get("requests", 0)
    return cpu * 1000 / count if cpu is not None and count else None


def _other_cpu(result: Mapping[str, Any]) -> float | None:
    """CPU the rest of the machine used in the window: noise from work we did not start."""
    cpu = result.get("cpu_s", {})
    if "machine" not in cpu or not result.get("elapsed_s"):
        return None
    ours = cpu.get("target", 0.0) + cpu.get("sim", 0.0) + result.get("client_cpu_s", 0.0)
    return max(0.0, 100 * float(cpu["machine"] - ours) / float(result["elapsed_s"]))


def _metrics(row: Mapping[str, Any]) -> list[tuple[str, dict[str, float | None], int]]:
    """(label, {target: value}, decimals) lines of one load point."""
    stream = bool(row["stream"])
    results = {t: _ok(row, t) for t in _COLUMNS}
    base = results["direct"]
    lat_key = "ttft_ms" if stream else "latency_ms"
    lines: list[tuple[str, dict[str, float | None], int]] = []

    def line(label: str, fn: Callable[[Mapping[str, Any]], float | None], digits: int) -> None:
        lines.append((label, {t: (fn(r) if r else None) for t, r in results.items()}, digits))

    if stream:
        line("chunks/s", lambda r: r["chunks_per_s"], 0)
    line("req/s", lambda r: r["req_per_s"], 0)
    label = "ttft" if stream else "latency"
    line(f"{label} p50 ms", lambda r: r[lat_key]["p50"], 2)
    line(f"{label} p99 ms", lambda r: r[lat_key]["p99"], 2)
    if base is not None:
        line(f"added {label} p50 ms", lambda r: r[lat_key]["p50"] - base[lat_key]["p50"], 2)
        lines[-1][1]["direct"] = None
    line(
        "server cpu ms/1k chunks" if stream else "server cpu ms/req",
        lambda r: _cpu_per(r, stream),
        3,
    )
    if stream:
        line("client reads/stream", lambda r: r.get("reads_per_request"), 1)
    line("client cpu % of a core", lambda r: 100 * r["client_cpu_s"] / r["elapsed_s"], 0)
    line("other cpu % of a core", _other_cpu, 0)
    return lines


def render(report: Mapping[str, Any]) -> str:
    """The side-by-side table, errors, and the checks with their margins."""
    machine, versions = report["machine"], report["versions"]
    out = [
        f"owngate {versions['owngate']} overhead benchmark: {machine['cpu_count']} CPUs, "
        f"Python {machine['python']}, litellm {versions.get('litellm') or '-'}, "
        f"{report['settings']['duration_s']:g}s per point, one worker each",
        "ratios are owngate ÷ column; server cpu = the target's process tree "
        "(direct: the simulator)",
        *(
            ["QUICK RUN: too short for its numbers to mean much"]
            if report["settings"]["quick"]
            else []
        ),
        "",
        f"{'load':<12} {'metric':<24}{'direct':>11}{'owngate':>11}{'litellm':>11}"
        f"{'og/direct':>11}{'og/litellm':>11}",
    ]
    for row in report["points"]:
        name = row["name"]
        for label, values, digits in _metrics(row):
            og = values["owngate"]
            ratios = [_ratio(og, values[t]) for t in ("direct", "litellm")]
            if label.startswith(("added", "client", "other")):
                ratios = [None, None]
            cells = "".join(f"{_num(values[t], digits):>11}" for t in _COLUMNS)
            ratio_cells = "".join(f"{'-' if r is None else f'{r:.3g}':>11}" for r in ratios)
            out.append(f"{name:<12} {label:<24}{cells}{ratio_cells}")
            name = ""
        for target, result in row["results"].items():
            if "error" in result:
                out.append(f"{'':<12} {target} failed: {result['error'][:200]}")
            elif result.get("errors"):
                kinds = ", ".join(f"{k}={v}" for k, v in result["error_kinds"].items())
                out.append(f"{'':<12} {target}: {result['errors']} errors ({kinds})")
    for target, entry in report["targets"].items():
        if "error" in entry:
            out.append(f"{target} did not run: {entry['error'][:500]}")
    out.append("")
    for check in report["checks"]:
        verdict = {True: "PASS", False: "FAIL", None: "n/a "}[check["passed"]]
        value = check["measured"]
        measured = "not measured" if value is None else f"{_num(value, 2)} {check['unit']}"
        target = f"(target {check['op']} {check['threshold']:g} {check['unit']})"
        out.append(f"{verdict}  {check['title']}: {measured} {target} {check['margin']}".rstrip())
    return "\n".join(out)
