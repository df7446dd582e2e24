"""llama-benchy, the client behind published per-model benchmarks, as a second driver.

llama-benchy (PyPI `llama-benchy==0.4.0`) is not in the dev lock: it requires
`transformers>=5.2` and `huggingface_hub` (and the obsolete `asyncio` backport from PyPI)
to load a tokenizer, which the project keeps out of its environment. It runs from its own
virtualenv, given with `--llama-benchy PATH` (see docs/performance.md for the two-line
install); without it this driver is skipped and says so.

It runs offline here: `HF_HUB_OFFLINE=1`, `--tokenizer` the served model's
tokenizer.json exported from its GGUF (tests/helpers/real_backend/gguf_tokenizer.py, by
setup.sh --with-smollm2), `--book-url` a text served by this process on loopback. Each
suite becomes one llama-benchy test (`--pp` input, `--tg` output, `--concurrency`, one
run, `--no-cache --exact-tg`) against each target in turn, interleaved per repetition;
its TTFT (`e2e_ttft`) and throughputs (`pp_throughput`, `tg_throughput`) are compared
gateway ÷ direct like the vLLM-compatible client's.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import random
import statistics
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from owngate_bench.services import HOST

__all__ = ["METRICS", "benchy_run", "render_benchy"]

_WORDS = "the of and to in is that for it as with was on be by at this from or an"

METRICS = (
    ("e2e_ttft", "TTFT ms", False),
    ("pp_throughput", "pp tok/s", True),
    ("tg_throughput", "tg tok/s", True),
)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access line per request on the benchmark's output."""


@contextlib.contextmanager
def _book(directory: Path) -> Iterator[str]:
    """A plain-text 'book' of common words on a loopback HTTP server; yields its URL."""
    rng = random.Random(7)  # noqa: S311 - reproducible text
    words = _WORDS.split()
    directory.mkdir(parents=True, exist_ok=True)
    lines = (" ".join(rng.choice(words) for _ in range(12)) + "." for _ in range(20_000))
    (directory / "book.txt").write_text("\n".join(lines) + "\n")
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer((HOST, 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="benchy-book", daemon=True)
    thread.start()
    try:
        yield f"http://{HOST}:{server.server_address[1]}/book.txt"
    finally:
        server.shutdown()
        server.server_close()


def _one(
    exe: Path, url: str, api_key: str, tokenizer: Path, book: str, shape: dict[str, int], out: Path
) -> dict[str, Any]:
    argv = [
        str(exe),
        *("--base-url", url + "/v1", "--api-key", api_key, "--model", "smollm2"),
        *("--tokenizer", str(tokenizer), "--book-url", book),
        *("--pp", str(shape["input_len"]), "--tg", str(shape["output_len"])),
        *("--concurrency", str(shape["max_concurrency"]), "--runs", "1"),
        *("--no-cache", "--exact-tg", "--skip-coherence", "--no-warmup", "--latency-mode", "none"),
        *("--format", "json", "--save-result", str(out)),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env, check=False)
    if proc.returncode != 0 or not out.is_file():
        return {"error": (proc.stdout + proc.stderr)[-500:]}
    bench = json.loads(out.read_text())["benchmarks"][0]
    return {key: bench[key]["mean"] for key, _, _ in METRICS if bench.get(key)}


def benchy_run(
    exe: Path,
    tokenizer: Path,
    rundir: Path,
    api_key: str,
    urls: dict[str, str],
    shapes: Sequence[tuple[str, dict[str, int]]],
    reps: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Every suite shape against every target URL, `reps` interleaved repetitions."""
    targets = list(urls)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in shapes}
    with _book(rundir / "benchy-book") as book:
        for rep in range(reps):
            for name, shape in shapes:
                order = targets[rep % len(targets) :] + targets[: rep % len(targets)]
                found = {}
                for target in order:
                    out = rundir / f"benchy-{name}-{target.replace('+', '-')}-{rep}.json"
                    out.unlink(missing_ok=True)
                    found[target] = _one(exe, urls[target], api_key, tokenizer, book, shape, out)
                    log(
                        f"  llama-benchy rep {rep + 1}/{reps} {name:10} {target:20} {found[target]}"
                    )
                runs[name].append(found)
    suites = {}
    for name, shape in shapes:
        rows: dict[str, Any] = {}
        for target in targets:
            ok = [run[target] for run in runs[name] if "error" not in run[target]]
            row: dict[str, Any] = {}
            for key, _, _ in METRICS:
                values = [r[key] for r in ok if r.get(key) is not None]
                row[key] = statistics.median(values) if values else None
            row["failed"] = len(runs[name]) - len(ok)
            if target != "direct":
                for key, _, _ in METRICS:
                    paired = [
                        run[target][key] / run["direct"][key]
                        for run in runs[name]
                        if run[target].get(key) and run["direct"].get(key)
                    ]
                    if paired:
                        row[f"{key}_ratio"] = {
                            "median": statistics.median(paired),
                            "min": min(paired),
                            "max": max(paired),
                        }
            rows[target] = row
        suites[name] = {"shape": shape, "targets": rows, "runs": runs[name]}
    return {"tool": "llama-benchy", "executable": str(exe), "reps": reps, "suites": suites}


def render_benchy(report: dict[str, Any]) -> list[str]:
    lines = [f"llama-benchy ({report['executable']}), {report['reps']} interleaved repetitions"]
    for name, suite in report["suites"].items():
        shape = suite["shape"]
        lines.append(
            f"  {name}: pp {shape['input_len']} tg {shape['output_len']} "
            f"c={shape['max_concurrency']}"
        )
        for target, row in suite["targets"].items():
            cells = [
                f"{label} {row[key]:.1f}" if row.get(key) is not None else f"{label} -"
                for key, label, _ in METRICS
            ]
            ratios = [
                f"{row[f'{key}_ratio']['median']:.2f} ({row[f'{key}_ratio']['min']:.2f}-"
                f"{row[f'{key}_ratio']['max']:.2f})"
                for key, _, _ in METRICS
                if f"{key}_ratio" in row
            ]
            lines.append(
                f"    {target:20} {'  '.join(cells)}"
                + (f"  ratios {' / '.join(ratios)}" if ratios else "")
                + (f"  FAILED {row['failed']}" if row["failed"] else "")
            )
    return lines
