"""The overhead benchmark's parts without servers: medians of repetitions, rotation, issue
16's verdicts, the nginx and production configurations, and a missing nginx."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from owngate_bench import overhead_targets
from owngate_bench.overhead import _exit_code
from owngate_bench.overhead_nginx import NGINX_MISSING, write_nginx_config
from owngate_bench.overhead_points import POINTS, fold, rotated, select_points
from owngate_bench.overhead_policy import HOSTED_KEY_ENV
from owngate_bench.overhead_production import write_production_config
from owngate_bench.overhead_verdicts import render_verdicts, verdicts

pytestmark = pytest.mark.bench


def _rep(requests: int, rps: float, p50: float, cpu_ms: float, **extra: Any) -> dict[str, Any]:
    return {
        "requests": requests,
        "errors": 0,
        "error_kinds": {},
        "error_samples": [],
        "req_per_s": rps,
        "latency_ms": {"p50": p50, "p99": 2 * p50},
        "cpu_s": {"target": cpu_ms * requests / 1000},
        "cpu_ms_per_req": cpu_ms,
        **extra,
    }


def test_fold_takes_medians_of_each_figure_and_sums_errors() -> None:
    reps = [
        _rep(100, 900.0, 0.5, 0.30),
        _rep(300, 1000.0, 0.4, 0.10),
        {**_rep(200, 100.0, 0.9, 0.20), "errors": 2, "error_kinds": {"status_500": 2}},
        {"error": "loadgen exited 1"},
    ]
    found = fold(reps)
    assert found["requests"] == 200
    assert found["req_per_s"] == 900.0
    assert found["latency_ms"] == {"p50": 0.5, "p99": 1.0}
    assert found["cpu_ms_per_req"] == 0.20  # the median of the per-rep ratios
    assert found["errors"] == 3  # two answers and one failed repetition
    assert found["error_kinds"] == {"status_500": 2, "rep_failed": 1}
    assert found["reps"] == 4
    assert fold([{"error": "down"}, {"error": "still down"}]) == {"error": "down", "reps": 2}


def test_rotation_and_point_selection() -> None:
    assert rotated(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert rotated(["a", "b", "c"], 4) == ["b", "c", "a"]
    assert rotated([], 3) == []
    assert select_points("") == POINTS
    assert [p.name for p in select_points("paced c=256, chat c=1")] == ["chat c=1", "paced c=256"]
    with pytest.raises(ValueError, match="unknown: chat c=2"):
        select_points("chat c=2")


def _point(name: str, **results: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "results": results}


def test_verdicts_read_the_issue_targets_from_one_run() -> None:
    prod, plain = "owngate+production", "owngate"
    chunks = {"cpu_us_per_chunk": 9.0, "chunks": 6400}
    points = [
        _point(
            "chat c=1",
            direct=_rep(100, 9000, 0.10, 0.05),
            **{prod: _rep(100, 500, 0.55, 0.35), plain: _rep(100, 3000, 0.3, 0.2)},
        ),
        _point(
            "chat c=16",
            nginx=_rep(100, 4000, 1.0, 0.03),
            **{prod: _rep(100, 1100, 2.0, 0.30), plain: _rep(100, 3000, 1.0, 0.15)},
        ),
        _point("stream c=16", **{prod: _rep(100, 50, 5, 1, **chunks)}),
        _point("chat 1KB c=16", **{plain: _rep(100, 1000, 1, 0.20)}),
        _point("chat 32KB c=16", **{plain: _rep(100, 1000, 1, 0.29)}),
        _point("chat 100KB c=16", **{plain: {"error": "down"}}),
    ]
    found = {v["id"]: v for v in verdicts(points)}
    assert found["production_cpu_c1"]["met"] is True  # 0.35 <= 0.4
    assert found["production_cpu_c16"]["met"] is False  # 0.30 > 0.25
    added = found["production_added_p50_c1"]
    assert abs(added["measured"] - 0.45) < 1e-9 and added["met"] is True  # 0.55 - direct's 0.10
    assert found["production_rps_vs_nginx"]["measured"] == 1100 / 4000
    assert found["production_rps_vs_nginx"]["met"] is True
    assert found["production_chunk_coalesced"]["met"] is False  # 9 > 8 us
    paced = found["production_chunk_paced"]
    assert paced["met"] is None and "paced c=256" in paced["why_not_measured"]
    assert found["plain_cpu_c16"]["met"] is True  # 0.15 <= 0.15
    assert abs(found["body_32kb_vs_1kb:owngate"]["measured"] - 1.45) < 1e-9
    assert found["body_32kb_vs_1kb:owngate"]["met"] is True
    assert found["body_100kb_vs_1kb:owngate"]["met"] is None  # that point failed
    assert "body_32kb_vs_1kb:owngate+policy" not in found  # a target that never ran


def test_a_verdict_agrees_with_the_figure_it_prints() -> None:
    """CPU is read in 10 ms ticks, so a figure can land on a target exactly (9 ticks over
    6 is 1.5x); the float arithmetic on the way must not make that "NOT MET" beside a
    printed "1.500 x (target <= 1.5 x)". A figure truly over by less than the printed
    digits shows the digits that tell."""
    plain = "owngate"
    one_kb = ((5.06 - 5.0) * 1000) / 300  # 6 ticks over 300 requests
    big = ((5.09 - 5.0) * 1000) / 300  # 9 ticks: 1.5x, give or take the floats
    points = [
        _point("chat c=16", **{plain: _rep(300, 3000, 1.0, 0.1504)}),
        _point("chat 1KB c=16", **{plain: _rep(300, 1000, 1, one_kb)}),
        _point("chat 32KB c=16", **{plain: _rep(300, 1000, 1, big)}),
    ]
    found = verdicts(points)
    by_id = {v["id"]: v for v in found}
    assert big / one_kb > 1.5  # what the floats make of it
    assert by_id["body_32kb_vs_1kb:owngate"]["met"] is True
    assert by_id["plain_cpu_c16"]["met"] is False
    lines = render_verdicts(found, 1)
    ratio = next(line for line in lines if "32KB prompt" in line)
    assert ratio.startswith("met ") and "1.500 x (target <= 1.5 x)" in ratio
    cpu = next(line for line in lines if "owngate  " in line and "chat c=16" in line)
    assert cpu.startswith("NOT MET") and "0.1504 ms (target <= 0.15 ms)" in cpu


def test_the_nginx_config_is_a_bare_keepalive_proxy_needing_no_root(tmp_path: Path) -> None:
    config = write_nginx_config(tmp_path, "127.0.0.1", {18001: 19001, 18002: 19002})
    text = config.read_text()
    assert "worker_processes 1;" in text and "daemon off;" in text
    for listen, upstream in ((18001, 19001), (18002, 19002)):
        assert f"listen 127.0.0.1:{listen};" in text
        assert f"server 127.0.0.1:{upstream}; keepalive" in text
    assert text.count("proxy_buffering off;") == 2
    assert text.count('proxy_set_header Connection "";') == 2
    assert "/var/" not in text  # pid, logs and temp files under the run directory
    assert f"pid {tmp_path}" in text


def test_a_missing_nginx_is_skipped_and_not_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(overhead_targets, "nginx_binary", lambda: None)
    target = overhead_targets.Target("nginx")
    overhead_targets._start_nginx(target, overhead_targets.Sims(), Path("unused"), {})
    assert target.service is None and target.error == NGINX_MISSING

    def report(targets: dict[str, Any]) -> dict[str, Any]:
        return {"targets": targets, "points": [], "checks": [], "verdicts": []}

    assert _exit_code(report({"nginx": {"error": NGINX_MISSING}}), check=True) == 0
    assert _exit_code(report({"nginx": {"error": "nginx exited 1: bad config"}}), False) == 1


def test_the_production_config_has_policy_log_score_routing_and_access_log(
    tmp_path: Path,
) -> None:
    from gateway.config import load_config

    sims = {"bench-model": [19001, 19002], "bench-paced": [19003, 19004]}
    path = write_production_config(
        tmp_path, host="127.0.0.1", port=18000, sims=sims, key_hash="sha256:" + "0" * 64
    )
    config = load_config(path, env={HOSTED_KEY_ENV: "sk-test"})
    assert config.policy is not None and config.policy.paths
    assert config.provenance is not None
    assert Path(config.provenance.signing_key_file).is_file()
    assert config.routing.default.strategy == "score"
    assert config.logging.level == "info" and config.logging.access_log is True
    private = [b for b in config.backends if b.kind != "hosted"]
    for model, ports in sims.items():
        serving = [b for b in private if any(m.name == model for m in b.models)]
        assert sorted(str(b.base_url) for b in serving) == [f"http://127.0.0.1:{p}" for p in ports]


def test_the_next_run_starts_a_fresh_production_log(tmp_path: Path) -> None:
    """overhead, seed-load and instructions write the production config into the same run
    directory each run, with a fresh key and an emptied log directory; the log's
    high-water file (beside the directory) must go too, or the gateway refuses to start
    the second run's log as a fork of the first one's."""
    from gateway.config import load_config
    from gateway.provenance.formats.merkle import leaf_hash
    from gateway.provenance.formats.wal import encode_frame
    from gateway.provenance.keys import load_signer
    from gateway.provenance.writer.high_water import HighWater
    from gateway.provenance.writer.preflight import preflight
    from gateway.provenance.writer.store import LogStore

    def configured() -> tuple[Path, Path, str, Path]:
        sims = {"bench-model": [19001, 19002]}
        path = write_production_config(
            tmp_path, host="127.0.0.1", port=18000, sims=sims, key_hash="sha256:" + "0" * 64
        )
        found = load_config(path, env={HOSTED_KEY_ENV: "sk-test"}).provenance
        assert found is not None
        key = path.parent / found.signing_key_file
        return path.parent / found.dir, key, found.origin, found.high_water_path(path.parent)

    directory, key, origin, high_water = configured()
    first = LogStore.open(directory, origin, [load_signer(key)], high_water=HighWater(high_water))
    entry = b'{"n":0}'
    first.append_frames([(entry, leaf_hash(entry))], encode_frame(entry, leaf_hash(entry)))
    first.checkpoint()  # the first run's gateway signed a checkpoint of its log
    first.close()
    assert high_water.is_file()
    directory, key, origin, high_water = configured()  # the next run
    assert preflight(origin, [key], directory=directory, high_water=high_water) == []


def test_the_paced_verdict_says_when_the_relay_fell_behind() -> None:
    def paced(us: float, reads: float) -> dict[str, Any]:
        extra = {"cpu_us_per_chunk": us, "reads_per_request": reads, "chunks": 6400}
        return _rep(100, 100, 100.0, 1.0, chunks_per_request=66.0, **extra)

    def verdict(us: float, reads: float, direct: bool = True) -> dict[str, Any]:
        base = {"direct": paced(24, 65)} if direct else {}
        points = [_point("paced c=256", **base, **{"owngate+production": paced(us, reads)})]
        return next(v for v in verdicts(points) if v["id"] == "production_chunk_paced")

    # 15 <= 20 us, but each chunk was not relayed on its own: a coalesced chunk's cost is
    # no paced chunk's, so the verdict is not measured, never met.
    behind = verdict(15, 30)
    assert behind["met"] is None and behind["measured"] is None
    assert "fell behind" in behind["why_not_measured"] and "15.0 us" in behind["why_not_measured"]
    assert behind["note"] == "reads per stream 30.0 (direct 65.0): fell behind, chunks coalesced"
    line = next(x for x in render_verdicts([behind], 1) if "paced" in x)
    assert line.startswith("n/a ") and "not measured: the relay fell behind" in line
    missed = verdict(25, 30)  # over the target even with coalesced chunks: a true miss
    assert missed["met"] is False and missed["measured"] == 25
    kept_up = verdict(15, 64)
    assert kept_up["met"] is True and kept_up["note"] == "reads per stream 64.0 (direct 65.0)"
    alone = verdict(15, 30, direct=False)  # no direct: a stream's 66 chunks, one read each
    assert alone["met"] is None and "chunks - 1 65.0" in alone["why_not_measured"]


def test_a_target_with_errors_is_never_met() -> None:
    """A failed answer costs the gateway less than a relayed one: CPU per request over the
    answers that succeeded, or req/s against a baseline that failed, is no figure."""
    prod = "owngate+production"
    flawed = {**_rep(100, 5000, 0.2, 0.1), "errors": 40, "error_kinds": {"status_503": 40}}
    points = [
        _point("chat c=1", direct=_rep(100, 9000, 0.1, 0.05), **{prod: flawed}),
        _point(
            "chat c=16",
            nginx={**_rep(100, 900, 1.0, 0.03), "errors": 1},
            **{prod: _rep(100, 1100, 2.0, 0.2)},
        ),
    ]
    found = {v["id"]: v for v in verdicts(points)}
    for ident in ("production_cpu_c1", "production_added_p50_c1"):
        assert found[ident]["met"] is None, found[ident]
        assert "40 errors at chat c=1" in found[ident]["why_not_measured"]
    assert found["production_cpu_c16"]["met"] is True  # its own run was clean
    rps = found["production_rps_vs_nginx"]
    assert rps["met"] is None and "nginx had 1 errors" in rps["why_not_measured"]
    lines = render_verdicts(list(found.values()), 1)
    assert not any(x.startswith("met ") and re.search(r"c=1\b", x) for x in lines)


def test_check_exits_1_unless_every_verdict_is_met() -> None:
    def report(*met: bool | None) -> dict[str, Any]:
        found = [{"id": f"v{i}", "met": m} for i, m in enumerate(met)]
        return {"targets": {}, "points": [], "checks": [], "verdicts": found}

    assert _exit_code(report(True, True), check=True) == 0
    assert _exit_code(report(True, False), check=True) == 1
    assert _exit_code(report(True, None), check=True) == 1  # not measured is not met
    assert _exit_code(report(True, None, False), check=False) == 0  # no --check: ran cleanly
