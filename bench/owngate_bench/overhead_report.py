"""The overhead benchmark's verdicts and table, computed from its JSON report alone.

`evaluate_checks(points, decisions)` turns measured load points and policy decision
costs into the issue's targets (added latency, throughput, ratio to LiteLLM, decision
p99), each with its margin; `policy_comparison(points)` sets owngate+policy beside plain
owngate, point by point; `render(report)` prints the side-by-side table, the comparison
and the decision costs. All read only plain data, so a saved report can be shown again:

    python -c 'import json, sys; from owngate_bench.overhead_report import render
    print(render(json.load(open(sys.argv[1]))))' .bench/overhead.json
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["DECISION_P99_BUDGET_US", "evaluate_checks", "policy_comparison", "render"]

_COLUMNS = (
    "direct",
    "nginx",
    "owngate",
    "owngate+policy",
    "owngate+tracing",
    "owngate+accesslog",
    "owngate+production",
    "litellm",
)
_HEADERS = {
    "owngate+policy": "og+policy",
    "owngate+tracing": "og+trace",
    "owngate+accesslog": "og+alog",
    "owngate+production": "og+prod",
}
_POLICY = "owngate+policy"
_PROD = "owngate+production"
DECISION_P99_BUDGET_US = 20.0
"""The trust-policy issue's budget for one decision, cached or not (`owngate bench policy`)."""


def _ok(row: Mapping[str, Any], target: str) -> Mapping[str, Any] | None:
    result = row["results"].get(target)
    if result is None or "error" in result or not result.get("requests"):
        return None
    found: Mapping[str, Any] = result
    return found


def _clean(row: Mapping[str, Any], target: str) -> Mapping[str, Any] | None:
    """A target's result at a point when a check may read it: it ran, answered, and
    without errors (a failed answer is cheap and fast: req/s over the rest flatters it)."""
    result = _ok(row, target)
    return None if result is None or result.get("errors") else result


def _best(points: Sequence[Mapping[str, Any]], target: str, key: str, stream: bool) -> float | None:
    values = [
        float(result[key])
        for row in points
        if row["stream"] == stream and (result := _clean(row, target)) is not None
    ]
    return max(values) if values else None


def _added_p50(points: Sequence[Mapping[str, Any]], target: str) -> float | None:
    for row in points:
        if row["stream"] or row["concurrency"] != 1:
            continue
        mine, base = _clean(row, target), _clean(row, "direct")
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


def _decision_p99(decisions: Mapping[str, Any] | None) -> float | None:
    cost = (decisions or {}).get(_POLICY)
    if not cost or "error" in cost:
        return None
    return max(float(cost["cached"]["p99_us"]), float(cost["uncached"]["p99_us"]))


def evaluate_checks(
    points: Sequence[Mapping[str, Any]], decisions: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The issue's targets for one gateway worker on a 2-core machine; None = not measured.

    `decisions` maps an owngate target to its decision cost (`owngate_bench.overhead_policy`).
    """
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
        _check(
            "policy_decision_p99",
            "policy decision p99, cached and uncached (worst)",
            _decision_p99(decisions),
            "<=",
            DECISION_P99_BUDGET_US,
            "us",
        ),
    ]


def _pair(mine: float | None, theirs: float | None) -> dict[str, float | None]:
    """owngate's and owngate+policy's values, their difference and ratio (when meaningful)."""
    delta = ratio = None
    if mine is not None and theirs is not None:
        delta = theirs - mine
        ratio = theirs / mine if mine > 0 and theirs > 0 else None
    return {"owngate": mine, _POLICY: theirs, "delta": delta, "ratio": ratio}


def policy_comparison(points: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """owngate+policy beside plain owngate at each load point both ran without failing.

    Per point: throughput, latency (TTFT for streams) p50, added p50 over `direct`, and
    server CPU per request (and per 1,000 chunks for streams), each as a `_pair`.
    """
    rows: list[dict[str, Any]] = []
    for row in points:
        og, pol, base = _ok(row, "owngate"), _ok(row, _POLICY), _ok(row, "direct")
        if og is None or pol is None:
            continue
        stream = bool(row["stream"])
        key = "ttft_ms" if stream else "latency_ms"
        entry: dict[str, Any] = {
            "name": row["name"],
            "stream": stream,
            "concurrency": row["concurrency"],
            "req_per_s": _pair(og["req_per_s"], pol["req_per_s"]),
        }
        if stream:
            entry["chunks_per_s"] = _pair(og["chunks_per_s"], pol["chunks_per_s"])
        entry[f"{key[:-3]}_p50_ms"] = _pair(og[key]["p50"], pol[key]["p50"])
        added = (None, None)
        if base is not None:
            added = (og[key]["p50"] - base[key]["p50"], pol[key]["p50"] - base[key]["p50"])
        entry["added_p50_ms"] = _pair(*added)
        entry["cpu_ms_per_req"] = _pair(_cpu_per(og, False), _cpu_per(pol, False))
        if stream:
            entry["cpu_ms_per_1k_chunks"] = _pair(_cpu_per(og, True), _cpu_per(pol, True))
        rows.append(entry)
    return rows


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _cpu_per(result: Mapping[str, Any], stream: bool) -> float | None:
    """Server CPU ms per request, or per 1,000 chunks (= µs per chunk) for streams: the
    median of the repetitions' own figures when the result has them."""
    derived = result.get("cpu_us_per_chunk" if stream else "cpu_ms_per_req")
    if derived is not None:
        return float(derived)
    cpu = result.get("cpu_s", {}).get("target")
    count = result.get("chunks", 0) / 1000 if stream else result.get("requests", 0)
    return cpu * 1000 / count if cpu is not None and count else None


def _other_cpu(result: Mapping[str, Any]) -> float | None:
    """CPU the rest of the machine used in the window: noise from work we did not start."""
    cpu = result.get("cpu_s", {})
    if "machine" not in cpu or not result.get("elapsed_s"):
        return None
    ours = sum(v for k, v in cpu.items() if k != "machine") + result.get("client_cpu_s", 0.0)
    return max(0.0, 100 * float(cpu["machine"] - ours) / float(result["elapsed_s"]))


def _metrics(
    row: Mapping[str, Any], columns: Sequence[str]
) -> list[tuple[str, dict[str, float | None], int]]:
    """(label, {target: value}, decimals) lines of one load point."""
    stream = bool(row["stream"])
    results = {t: _ok(row, t) for t in columns}
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
        "server cpu us/chunk" if stream else "server cpu ms/req",
        lambda r: _cpu_per(r, stream),
        3,
    )
    if stream:
        line("client reads/stream", lambda r: r.get("reads_per_request"), 1)
    line("client cpu % of a core", lambda r: 100 * r["client_cpu_s"] / r["elapsed_s"], 0)
    line("other cpu % of a core", _other_cpu, 0)
    return lines


def _ratio_cell(value: float | None, width: int = 11) -> str:
    return f"{'-' if value is None else f'{value:.3g}':>{width}}"


def _columns(report: Mapping[str, Any]) -> list[str]:
    """The targets that ran, in the table's order (direct, owngate and policy always)."""
    ran = {t for row in report["points"] for t in row["results"]}
    return [t for t in _COLUMNS if t in ran or t in ("direct", "owngate", _POLICY)]


def render(report: Mapping[str, Any]) -> str:
    """The side-by-side table, errors, the policy comparison and costs, and the checks."""
    machine, versions, settings = report["machine"], report["versions"], report["settings"]
    reps = settings.get("reps", 1)
    busy = ""
    if "loadavg_at_start" in machine:
        busy = f", load average {machine['loadavg_at_start'][0]:.2f} at start"
        if "loadavg_at_end" in machine:
            busy += f", {machine['loadavg_at_end'][0]:.2f} at end"
    columns = _columns(report)
    out = [
        f"owngate {versions['owngate']} overhead benchmark: {machine['cpu_count']} CPUs"
        f"{busy}, Python {machine['python']}, litellm {versions.get('litellm') or '-'}, "
        f"{settings['duration_s']:g}s per point, one worker each, "
        f"medians of {reps} interleaved repetition{'s' * (reps != 1)}",
        "ratios: og/... = owngate ÷ column, pol/og = og+policy ÷ owngate, prod/og = "
        "og+production ÷ owngate; server cpu = the target's process tree (direct: the "
        "simulator); other cpu = the rest of the machine (other people's work)",
        *(["QUICK RUN: too short for its numbers to mean much"] if settings["quick"] else []),
        "",
        f"{'load':<16} {'metric':<24}"
        + "".join(f"{_HEADERS.get(t, t):>10}" for t in columns)
        + f"{'og/direct':>10}{'og/litellm':>11}{'pol/og':>8}{'prod/og':>8}",
    ]
    for row in report["points"]:
        name = row["name"]
        for label, values, digits in _metrics(row, columns):
            og = values.get("owngate")
            ratios = [_ratio(og, values.get(t)) for t in ("direct", "litellm")]
            for other in (_POLICY, _PROD):
                mine = values.get(other)
                ok = mine is not None and og is not None and og > 0 and mine > 0
                ratios.append(_ratio(mine, og) if ok else None)
            if label.startswith(("added", "client", "other")):
                ratios[:2] = [None, None]
            if label.startswith(("client", "other")):
                ratios[2:] = [None, None]
            cells = "".join(f"{_num(values[t], digits):>10}" for t in columns)
            widths = (10, 11, 8, 8)
            tail = "".join(_ratio_cell(r, w) for r, w in zip(ratios, widths, strict=True))
            out.append(f"{name:<16} {label:<24}{cells}{tail}")
            name = ""
        for target, result in row["results"].items():
            if "error" in result:
                out.append(f"{'':<16} {target} failed: {result['error'][:200]}")
            elif result.get("errors"):
                kinds = ", ".join(f"{k}={v}" for k, v in result["error_kinds"].items())
                out.append(f"{'':<16} {target}: {result['errors']} errors ({kinds})")
    for target, entry in report["targets"].items():
        if "error" in entry:
            out.append(f"{target} did not run: {entry['error'][:500]}")
    policy = report.get("policy") or {}
    out += _render_comparison(policy.get("vs_owngate") or [])
    out += _render_decisions(policy.get("decisions") or {})
    out.append("")
    for check in report["checks"]:
        verdict = {True: "PASS", False: "FAIL", None: "n/a "}[check["passed"]]
        value = check["measured"]
        measured = "not measured" if value is None else f"{_num(value, 2)} {check['unit']}"
        target = f"(target {check['op']} {check['threshold']:g} {check['unit']})"
        out.append(f"{verdict}  {check['title']}: {measured} {target} {check['margin']}".rstrip())
    return "\n".join(out)


def _render_comparison(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """owngate+policy vs owngate: throughput, added p50 latency, server CPU per request."""
    if not rows:
        return []
    out = [
        "",
        "owngate+policy vs owngate (ratio = owngate+policy ÷ owngate; streams: added = TTFT)",
        f"{'':<12}{'------------ req/s -----------':>31}  {'------ added p50 ms ------':>26}"
        f"  {'------- server cpu ms/req -------':>34}",
        f"{'load':<12}{'owngate':>10}{'+policy':>10}{'ratio':>11}  {'owngate':>8}{'+policy':>9}"
        f"{'delta':>9}  {'owngate':>8}{'+policy':>9}{'ratio':>7}{'delta us':>10}",
    ]
    for row in rows:
        rps, added, cpu = row["req_per_s"], row["added_p50_ms"], row["cpu_ms_per_req"]
        cpu_delta = None if cpu["delta"] is None else cpu["delta"] * 1000

        def ratio(pair: Mapping[str, Any], width: int) -> str:
            value = pair["ratio"]
            return f"{'-' if value is None else f'{value:.3f}':>{width}}"

        out.append(
            f"{row['name']:<12}{_num(rps['owngate']):>10}{_num(rps[_POLICY]):>10}"
            f"{ratio(rps, 11)}  {_num(added['owngate'], 3):>8}{_num(added[_POLICY], 3):>9}"
            f"{_signed(added['delta'], 3):>9}  {_num(cpu['owngate'], 4):>8}"
            f"{_num(cpu[_POLICY], 4):>9}{ratio(cpu, 7)}{_signed(cpu_delta, 1):>10}"
        )
    return out


def _signed(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:+,.{digits}f}"


def _render_decisions(decisions: Mapping[str, Any]) -> list[str]:
    """Per owngate target: its policy set and the p50/p99 of one decision, cached or not."""
    if not decisions:
        return []
    calls = max((c.get("calls", 0) for c in decisions.values()), default=0)
    out = [
        "",
        f"policy decision cost, one call at a time ({calls:,} calls per mode; "
        "cached = PolicySet.decide, uncached = decide_uncached)",
        f"{'target':<16}{'policy set':<28}{'keys':>5}{'cached p50':>12}{'p99 us':>8}"
        f"{'uncached p50':>14}{'p99 us':>8}",
    ]
    for target, cost in decisions.items():
        if "error" in cost:
            out.append(f"{target:<16}failed: {cost['error'][:300]}")
            continue
        ident = f"{cost['set']['id']} {cost['set']['version']}"
        cached, uncached = cost["cached"], cost["uncached"]
        out.append(
            f"{target:<16}{ident:<28}{cost['keys']:>5}{cached['p50_us']:>12.2f}"
            f"{cached['p99_us']:>8.2f}{uncached['p50_us']:>14.2f}{uncached['p99_us']:>8.2f}"
        )
        if cost.get("refused_keys"):
            out.append(f"{'':<16}{cost['refused_keys']} of its keys are refused by the policy")
    return out
