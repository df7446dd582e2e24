"""`owngate audit report --html`: one self-contained HTML page drawn from a report dict.

The page holds its CSS and its charts (inline SVG drawn here, with `<title>` tooltips):
no script, no external asset, no link, so it opens offline and can be archived as is.
Every value taken from the log (tenant ids, backend ids, regions, rules, reasons, the
failure text, witness names) is attacker-influenced and passes through `html.escape`,
after `shown` (audit/shown.py) escaped what is not printable: a bidirectional override or
a line separator in a backend id would reorder or break what the reader sees.
A log that failed verification gets a page that says so first and shows no figures.
Its own Content-Security-Policy (`CSP`, a meta tag) lets it run no script and load
nothing, wherever it is opened: an escaping slip would still run nothing.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from gateway.provenance.audit.shown import shown

__all__ = ["CSP", "render_html"]

_PALETTE: tuple[str, ...] = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd")
_PALETTE += ("#8c564b", "#e377c2", "#17becf")
_OTHER = "#999999"
_TOP = len(_PALETTE)  # series drawn on their own; the rest are summed as "other"
_ROWS = 50  # table rows shown per figure; the JSON holds them all
_W, _H, _PAD = 760, 220, 44
# The page's own policy, wherever it is opened (a file, the admin origin): no script, no
# fetch, no form, nothing from elsewhere; only its inline <style> and SVG attributes.
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
    "form-action 'none'"
)

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:60em;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .6em;
text-align:left}td.n{text-align:right}pre{background:#f4f4f4;padding:.6em;overflow-x:auto;
white-space:pre-wrap;word-break:break-all}.ok{background:#e6f4e6;border:2px solid #2ca02c;
padding:1em}.failed{background:#fde8e8;border:4px solid #d62728;padding:1em;font-size:1.1em}
.failed strong,.ok strong{font-size:1.3em}.legend span{display:inline-block;margin-right:1em}
.swatch{display:inline-block;width:.8em;height:.8em;margin-right:.3em}svg{display:block}
""".strip()


def _e(value: object) -> str:
    return html.escape(shown(value, None), quote=True)  # a file: escaped, not shortened


def _seconds(iso: str) -> int:
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp())


def _iso(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _commands(commands: list[str]) -> str:
    blocks = "".join(f"<pre><code>{_e(command)}</code></pre>" for command in commands)
    return f"<p>Reproduce:</p>{blocks}"


def _table(header: tuple[str, ...], rows: Sequence[tuple[object, ...]]) -> str:
    head = "".join(f"<th>{_e(cell)}</th>" for cell in header)
    body = []
    for row in rows[:_ROWS]:
        cells = "".join(
            f'<td class="n">{_e(c)}</td>' if isinstance(c, int | float) else f"<td>{_e(c)}</td>"
            for c in row
        )
        body.append(f"<tr>{cells}</tr>")
    more = f"<p>{len(rows) - _ROWS} more rows in the JSON report.</p>" if len(rows) > _ROWS else ""
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{more}"


def _legend(keys: list[tuple[str, str]]) -> str:
    items = "".join(
        f'<span><span class="swatch" style="background:{color}"></span>{_e(key)}</span>'
        for key, color in keys
    )
    return f'<p class="legend">{items}</p>'


def _axes(label_left: str, label_right: str, top: object) -> str:
    y0, x1 = _H - _PAD, _W - 8
    return (
        f'<line x1="{_PAD}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="#444"/>'
        f'<line x1="{_PAD}" y1="8" x2="{_PAD}" y2="{y0}" stroke="#444"/>'
        f'<text x="{_PAD - 4}" y="16" text-anchor="end" font-size="11">{_e(top)}</text>'
        f'<text x="{_PAD - 4}" y="{y0}" text-anchor="end" font-size="11">0</text>'
        f'<text x="{_PAD}" y="{y0 + 16}" font-size="11">{_e(label_left)}</text>'
        f'<text x="{x1}" y="{y0 + 16}" text-anchor="end" font-size="11">{_e(label_right)}</text>'
    )


def _svg(title: str, body: str) -> str:
    return (
        f'<svg width="{_W}" height="{_H}" '
        f'viewBox="0 0 {_W} {_H}" role="img"><title>{_e(title)}</title>{body}</svg>'
    )


def _bars(figure: dict[str, Any], first: int, last: int, width: int) -> str:
    """A stacked bar chart of a figure's counts: one bar per time bucket."""
    buckets = [_seconds(row["bucket"]) for row in figure["counts"]]
    low, high = min([first - first % width, *buckets]), max([last - last % width, *buckets])
    slots = (high - low) // width + 1  # records' times need not be in order
    ranked = list(figure["totals"])
    colors = {key: _PALETTE[i] for i, key in enumerate(ranked[:_TOP])}
    # only the buckets that hold records: the empty ones between are left as gaps, never
    # made (a clock step spreads the records over years of buckets)
    stacks: dict[int, dict[str, int]] = {}
    for row in figure["counts"]:
        key = row["key"] if row["key"] in colors else "other"
        stack = stacks.setdefault(_seconds(row["bucket"]), {})
        stack[key] = stack.get(key, 0) + row["count"]
    top = max((sum(stack.values()) for stack in stacks.values()), default=0) or 1
    slot = (_W - 8 - _PAD) / slots
    scale = (_H - _PAD - 8) / top
    shapes = [_axes(_iso(low), _iso(high + width), top)]
    order = [*colors, "other"]
    for start in sorted(stacks):
        number = (start - low) // width
        y: float = _H - _PAD
        for key in order:
            count = stacks[start].get(key, 0)
            if not count:
                continue
            height = count * scale
            y -= height
            x = _PAD + number * slot + 1
            tip = f"{key}: {count} in [{_iso(start)}, +{width}s)"
            shapes.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(slot - 2, 1):.1f}" '
                f'height="{height:.1f}" fill="{colors.get(key, _OTHER)}"><title>{_e(tip)}</title>'
                "</rect>"
            )
    legend = [(key, colors[key]) for key in colors]
    if len(ranked) > _TOP:
        legend.append((f"other ({len(ranked) - _TOP})", _OTHER))
    return _svg(figure["title"], "".join(shapes)) + _legend(legend)


def _series_figure(name: str, figure: dict[str, Any], totals: dict[str, Any]) -> str:
    parts = [f'<h2 id="{_e(name)}">{_e(figure["title"])}</h2>', f"<p>{_e(figure['description'])}"]
    parts.append(f"; buckets of {_e(totals['bucket_seconds'])} s.</p>")
    if figure["counts"]:
        first, last = _seconds(totals["first_time"]), _seconds(totals["last_time"])
        parts.append(_bars(figure, first, last, totals["bucket_seconds"]))
    else:
        parts.append("<p>None in this log.</p>")
    if "rates" in figure:
        rows = [(r["key"], r["count"], f"{r['rate']:.2%}") for r in figure["rates"]]
        parts.append(_table(("key", "count", "rate"), rows))
    else:
        parts.append(_table(("key", "count"), list(figure["totals"].items())))
    parts.append(_commands(figure["commands"]))
    return "".join(parts)


def _points_chart(title: str, points: list[tuple[int, int, str, str]]) -> str:
    """Sizes over time: (seconds, size, color, tooltip) points, joined per color."""
    if not points:
        return "<p>None in this log.</p>"
    first, last = min(p[0] for p in points), max(p[0] for p in points)
    top = max(p[1] for p in points) or 1
    span = max(last - first, 1)
    shapes = [_axes(_iso(first), _iso(last), top)]
    lines: dict[str, list[str]] = {}
    for moment, size, color, tip in points:
        x = _PAD + (moment - first) / span * (_W - 8 - _PAD - 8) + 4
        y = _H - _PAD - size / top * (_H - _PAD - 8)
        lines.setdefault(color, []).append(f"{x:.1f},{y:.1f}")
        shapes.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"><title>{_e(tip)}</title>'
            "</circle>"
        )
    for color, coords in lines.items():
        shapes.insert(1, f'<polyline points="{" ".join(coords)}" fill="none" stroke="{color}"/>')
    return _svg(title, "".join(shapes))


def _checkpoint_figures(figures: dict[str, Any]) -> str:
    checkpoints, cosigned = figures["checkpoints"], figures["cosignatures"]
    points = [
        (_seconds(p["time"]), p["size"], _PALETTE[0], f"checkpoint of size {p['size']}")
        for p in checkpoints["points"]
        if p["time"] is not None
    ]
    parts = [
        f'<h2 id="checkpoints">{_e(checkpoints["title"])}</h2>',
        f"<p>{_e(checkpoints['description'])}.</p>",
        _points_chart(checkpoints["title"], points),
        _table(
            ("size", "time of its newest entry"),
            [(p["size"], p["time"] or "-") for p in checkpoints["points"]],
        ),
        _commands(checkpoints["commands"]),
        f'<h2 id="cosignatures">{_e(cosigned["title"])}</h2>',
        f"<p>{_e(cosigned['description'])}.</p>",
    ]
    witnesses = list(cosigned["newest_by"])
    colors = {w: _PALETTE[(i + 1) % len(_PALETTE)] for i, w in enumerate(witnesses)}
    marks = [
        (_seconds(p["time"]), p["size"], colors[p["witness"]], f"{p['witness']}: size {p['size']}")
        for p in cosigned["points"]
    ]
    if witnesses:
        parts.append(_points_chart(cosigned["title"], marks))
        parts.append(_legend(list(colors.items())))
    else:
        parts.append(
            f"<p>Not checked: cosigned/ holds {_e(cosigned['files'])} files; give "
            "<code>--witness-key</code> to check and chart their cosignatures.</p>"
        )
    rows = [(p["size"], p["witness"], p["time"]) for p in cosigned["points"]]
    parts.append(_table(("size", "witness", "timestamp"), rows))
    parts.append(_commands(cosigned["commands"]))
    return "".join(parts)


def _verification(report: dict[str, Any]) -> str:
    result = report["verification"]
    command = _commands([result["command"]])
    if not result["ok"]:
        return (
            '<div class="failed"><strong>VERIFICATION FAILED</strong>'
            f"<p>{_e(result['error'])}</p><p>This log does not verify: it shows no figures, "
            "because no number drawn from it can be trusted. Investigate the failure "
            f"first.</p>{command}</div>"
        )
    summary = result["summary"]
    rows: list[tuple[object, ...]] = [
        ("origin", summary["origin"]),
        ("entries (size of the newest checkpoint)", summary["size"]),
        ("root", summary["root"]),
        ("checkpoints", summary["checkpoints"]),
        ("signed by", ", ".join(summary["signed_by"])),
        ("earlier checkpoints (keys not given)", summary["earlier_checkpoints"]),
        ("entries not yet in a checkpoint", summary["unsigned_entries"]),
        ("dispatches without completion", summary["open_dispatches"]),
    ]
    witnesses = summary.get("witnesses")
    if witnesses is not None:
        rows.append(("witnessed entries", witnesses["witnessed_size"]))
        rows.append(("min witnesses", witnesses["min_witnesses"]))
    return (
        '<div class="ok"><strong>VERIFIED</strong><p>Every entry, tile, checkpoint '
        "signature and link checked, as <code>owngate audit verify</code> does.</p>"
        f"{_table(('check', 'result'), rows)}{command}</div>"
    )


def render_html(report: dict[str, Any]) -> str:
    """The whole page for a report from `report.audit_report`."""
    ok = report["verification"]["ok"]
    status = "VERIFIED" if ok else "FAILED"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        f"<title>{status}: owngate audit report of {_e(report['log'])}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Audit report of {_e(report['log'])}: {status}</h1>",
        f"<p>Generated {_e(report['generated_at'])} by <code>owngate audit report</code> "
        f"({_e(report['format'])}).</p>",
        "<h2>Verification</h2>",
        _verification(report),
    ]
    totals = report["totals"]
    if ok and totals is not None:
        figures = report["figures"]
        rows = [(name, value) for name, value in totals.items() if value is not None]
        parts.append("<h2>Totals</h2>")
        parts.append(_table(("what", "value"), rows))
        for name in (
            "dispatches_by_backend",
            "dispatches_by_region",
            "dispatches_by_data_class",
            "requests_by_tenant",
            "fallbacks_by_reason",
            "refusals_by_rule",
        ):
            parts.append(_series_figure(name, figures[name], totals))
        parts.append(_checkpoint_figures(figures))
    parts.append("</body></html>\n")
    return "\n".join(parts)
