"""Prometheus text parsing and the load signals read from vLLM, llama.cpp and SGLang scrapes.

Vectors live in ``tests/vectors/metrics/`` (their origin is in the README there); edge
cases are inline tables; a property test renders random samples and parses them back.
"""

from __future__ import annotations

import math
import re
from typing import get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.routing import prometheus, signals
from gateway.routing.prometheus import Sample, parse_metrics
from gateway.routing.signals import (
    BackendKind,
    BackendLoad,
    load_from_metrics,
    slots_total_from_props,
)
from tests.helpers.paths import VECTORS

DATA = VECTORS / "metrics"


def test_public_surface() -> None:
    assert sorted(prometheus.__all__) == ["Sample", "parse_metrics"]
    assert sorted(signals.__all__) == [
        "BackendKind",
        "BackendLoad",
        "MAX_LEARNED_SLOTS",
        "load_from_metrics",
        "metric_names",
        "slots_total_from_props",
        "slots_total_from_slots",
    ]


# --- load signals from realistic scrapes --------------------------------------------


@pytest.mark.parametrize(
    ("file", "kind", "expected"),
    [
        ("llamacpp-busy.prom", "llamacpp", BackendLoad(4.0, 2.0, None, None)),
        ("vllm-two-engines.prom", "vllm", BackendLoad(12.0, 2.0, (0.4321 + 0.3079) / 2, None)),
        ("sglang-dp-attention.prom", "sglang", BackendLoad(16.0, 4.0, (0.52 + 0.36) / 2, None)),
    ],
)
def test_load_from_data_files(file: str, kind: BackendKind, expected: BackendLoad) -> None:
    load = load_from_metrics(kind, parse_metrics((DATA / file).read_text(encoding="utf-8")))
    assert load.running == expected.running
    assert load.waiting == expected.waiting
    assert load.kv_usage == pytest.approx(expected.kv_usage)
    assert load.slots_total is None


def test_every_kind_has_a_data_file() -> None:
    assert set(get_args(BackendKind)) == {"vllm", "llamacpp", "sglang"}
    for kind in get_args(BackendKind):
        assert list(DATA.glob(f"{kind}-*.prom")), kind


def test_histogram_series_parse_as_plain_samples() -> None:
    samples = parse_metrics((DATA / "vllm-two-engines.prom").read_text(encoding="utf-8"))
    buckets = samples["vllm:time_to_first_token_seconds_bucket"]
    assert len(buckets) == 2 * 17
    inf_buckets = {s.labels["engine"]: s.value for s in buckets if s.labels["le"] == "+Inf"}
    counts = {
        s.labels["engine"]: s.value for s in samples["vllm:time_to_first_token_seconds_count"]
    }
    assert inf_buckets == counts == {"0": 447.0, "1": 439.0}
    assert [s.labels["engine"] for s in samples["vllm:time_to_first_token_seconds_sum"]] == [
        "0",
        "1",
    ]
    first = buckets[0]
    assert first.labels == {
        "engine": "0",
        "model_name": "Qwen/Qwen2.5-0.5B-Instruct",
        "le": "0.001",
    }
    info = samples["vllm:cache_config_info"][0]
    assert info.labels["num_gpu_blocks"] == "27118"
    assert info.value == 1.0


@pytest.mark.parametrize("kind", get_args(BackendKind))
def test_missing_metrics_are_unknown_not_zero(kind: BackendKind) -> None:
    assert load_from_metrics(kind, {}) == BackendLoad(None, None, None, None)
    assert load_from_metrics(kind, parse_metrics("unrelated_metric 3\n")) == BackendLoad(
        None, None, None, None
    )


@pytest.mark.parametrize(
    ("kind", "text", "expected"),
    [
        # Only one of the signals published: the others stay unknown.
        ("vllm", 'vllm:num_requests_running{engine="0"} 3', BackendLoad(3.0, None, None, None)),
        ("llamacpp", "llamacpp:requests_deferred 0", BackendLoad(None, 0.0, None, None)),
        ("sglang", 'sglang:token_usage{tp_rank="0"} 0.25', BackendLoad(None, None, 0.25, None)),
        # Before vLLM 0.12 the KV gauge had another name; older llama.cpp had a KV gauge.
        ("vllm", 'vllm:gpu_cache_usage_perc{engine="0"} 0.5', BackendLoad(None, None, 0.5, None)),
        (
            "vllm",
            "vllm:kv_cache_usage_perc 0.25\nvllm:gpu_cache_usage_perc 0.9",
            BackendLoad(None, None, 0.25, None),
        ),
        ("llamacpp", "llamacpp:kv_cache_usage_ratio 0.125", BackendLoad(None, None, 0.125, None)),
        # A NaN anywhere makes that signal unknown.
        (
            "vllm",
            'vllm:num_requests_waiting{engine="0"} 1\nvllm:num_requests_waiting{engine="1"} NaN',
            BackendLoad(None, None, None, None),
        ),
        # SGLang with --enable-metrics-for-all-schedulers: TP ranks repeat one scheduler.
        (
            "sglang",
            'sglang:num_running_reqs{tp_rank="0",pp_rank="0"} 5\n'
            'sglang:num_running_reqs{tp_rank="1",pp_rank="0"} 5\n'
            'sglang:num_queue_reqs{tp_rank="0",pp_rank="0"} 2\n'
            'sglang:num_queue_reqs{tp_rank="1",pp_rank="0"} 2\n',
            BackendLoad(5.0, 2.0, None, None),
        ),
        # ... while data-parallel ranks are separate queues.
        (
            "sglang",
            'sglang:num_running_reqs{dp_rank="0",tp_rank="0"} 5\n'
            'sglang:num_running_reqs{dp_rank="0",tp_rank="1"} 5\n'
            'sglang:num_running_reqs{dp_rank="1",tp_rank="2"} 7\n'
            'sglang:num_running_reqs{dp_rank="1",tp_rank="3"} NaN\n',
            BackendLoad(None, None, None, None),
        ),
        (
            "sglang",
            'sglang:num_running_reqs{dp_rank="0",tp_rank="0"} 5\n'
            'sglang:num_running_reqs{dp_rank="0",tp_rank="1"} 4\n'
            'sglang:num_running_reqs{dp_rank="1",tp_rank="2"} 7\n',
            BackendLoad(12.0, None, None, None),
        ),
        # vLLM series differing in engine are summed even if the model label differs.
        (
            "vllm",
            'vllm:num_requests_running{engine="0",model_name="a"} 1\n'
            'vllm:num_requests_running{engine="1",model_name="b"} 2\n',
            BackendLoad(3.0, None, None, None),
        ),
    ],
)
def test_load_aggregation(kind: BackendKind, text: str, expected: BackendLoad) -> None:
    assert load_from_metrics(kind, parse_metrics(text)) == expected


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown backend kind 'tgi'"):
        load_from_metrics("tgi", {})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("props", "expected"),
    [
        ({"total_slots": 4}, 4),
        ({"total_slots": 0}, None),
        ({"total_slots": "4"}, None),
        ({"total_slots": True}, None),
        ({}, None),
    ],
)
def test_slots_total_from_props(props: dict[str, object], expected: int | None) -> None:
    assert slots_total_from_props(props) == expected


# --- the parser: accepted input ------------------------------------------------------


def one(text: str) -> Sample:
    samples = [s for series in parse_metrics(text).values() for s in series]
    assert len(samples) == 1, samples
    return samples[0]


@pytest.mark.parametrize(
    ("line", "name", "labels", "value"),
    [
        ("a 1", "a", {}, 1.0),
        ("a:b_c:d 1.5e-3", "a:b_c:d", {}, 0.0015),
        ("_x 1E+6", "_x", {}, 1e6),
        ("a -0.5", "a", {}, -0.5),
        ("a .5", "a", {}, 0.5),
        ("a +Inf", "a", {}, math.inf),
        ("a -Inf", "a", {}, -math.inf),
        ("a inf", "a", {}, math.inf),
        ("a 1 1700000000000", "a", {}, 1.0),  # timestamp (ms) accepted and dropped
        ("a 1 -5", "a", {}, 1.0),
        ("a{} 2", "a", {}, 2.0),
        ('a{b="c"} 2', "a", {"b": "c"}, 2.0),
        ('a{b="c",} 2', "a", {"b": "c"}, 2.0),
        ('a{ b = "c" , d="e" } 2', "a", {"b": "c", "d": "e"}, 2.0),
        ('a{b="c"}2', "a", {"b": "c"}, 2.0),
        ("a\t3\t4", "a", {}, 3.0),
        ("  a 3  ", "a", {}, 3.0),
        ("a 3\r", "a", {}, 3.0),
        ('a{b=""} 1', "a", {"b": ""}, 1.0),
        (r'a{p="C:\\dir\\"} 1', "a", {"p": "C:\\dir\\"}, 1.0),
        (r'a{q="say \"hi\""} 1', "a", {"q": 'say "hi"'}, 1.0),
        (r'a{m="two\nlines"} 1', "a", {"m": "two\nlines"}, 1.0),
        (r'a{m="\\n is not a newline"} 1', "a", {"m": "\\n is not a newline"}, 1.0),
        ('a{s="} , = # {"} 1', "a", {"s": "} , = # {"}, 1.0),
        ('a{u="żółw ✓ \u2028"} 1', "a", {"u": "żółw ✓ \u2028"}, 1.0),
        ('a{le="+Inf"} 7', "a", {"le": "+Inf"}, 7.0),
    ],
)
def test_parse_sample_lines(line: str, name: str, labels: dict[str, str], value: float) -> None:
    sample = one(line)
    assert sample == Sample(name, labels, value)


def test_nan_value() -> None:
    assert math.isnan(one("a NaN").value)
    assert math.isnan(one("a nan 123").value)


def test_comments_help_type_and_blank_lines() -> None:
    text = (
        "# HELP a Some help with \\\\ and \\n escapes.\n"
        "# TYPE a gauge\n"
        "\n"
        "   \n"
        "# a free comment, even one with { and } and 1 2 3\n"
        "#no space is a comment too\n"
        "# HELP b\n"
        "# TYPE b untyped\n"
        "# EOF\n"
        "a 1\n"
        'a{x="1"} 2\n'
        "b 3"
    )
    parsed = parse_metrics(text)
    assert parsed == {
        "a": [Sample("a", {}, 1.0), Sample("a", {"x": "1"}, 2.0)],
        "b": [Sample("b", {}, 3.0)],
    }


def test_empty_input() -> None:
    assert parse_metrics("") == {}
    assert parse_metrics("\n\n# only comments\n") == {}


def test_labels_are_read_only() -> None:
    sample = one('a{b="c"} 1')
    with pytest.raises(TypeError):
        sample.labels["b"] = "changed"  # type: ignore[index]


# --- the parser: rejected input ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("a", 1, "expected a value after the metric name"),
        ("ok 1\na", 2, "expected a value"),
        ("ok 1\n\n# c\n1a 1", 4, "expected a metric name"),
        ("a-b 1", 1, "expected a blank or '{'"),
        ("a 1 2 3", 1, "expected a value and an optional timestamp"),
        ("a one", 1, "invalid value 'one'"),
        ("a 1_000", 1, "invalid value '1_000'"),
        ("a 0x10", 1, "invalid value '0x10'"),
        ("a 1 1.5", 1, "invalid timestamp '1.5'"),
        ("a{", 1, "malformed label set"),
        ('a{b="c"', 1, "expected ',' or '}' after a label"),
        ('a{b="c" d="e"} 1', 1, "expected ',' or '}' after a label"),
        ("a{b=c} 1", 1, "malformed label set"),
        ('a{1b="c"} 1', 1, "malformed label set"),
        ('a{b="c} 1', 1, "malformed label set"),
        ('a{b="c",,d="e"} 1', 1, "malformed label set"),
        ('a{b="1",b="2"} 1', 1, "duplicate label 'b'"),
        (r'a{b="\t"} 1', 1, r"invalid escape \t in a label value"),
        ('a{b="c"}', 1, "expected a value and an optional timestamp"),
        ("# TYPE a", 1, "# TYPE needs one of"),
        ("# TYPE a gaugeish", 1, "# TYPE needs one of"),
        ("# TYPE a gauge extra", 1, "# TYPE needs one of"),
        ("# TYPE 1a gauge", 1, "# TYPE needs a valid metric name"),
        ("# HELP", 1, "# HELP needs a valid metric name"),
        ("# TYPE a gauge\n# TYPE a counter", 2, "second # TYPE line for a"),
        ('a{b="1"} 1 # {trace_id="x"} 1', 1, "expected a value and an optional timestamp"),
    ],
)
def test_malformed_lines_name_their_line(text: str, line: int, reason: str) -> None:
    with pytest.raises(ValueError, match=rf"^line {line}: {re.escape(reason)}") as info:
        parse_metrics(text)
    assert str(info.value).startswith(f"line {line}: ")


def test_error_excerpt_is_bounded() -> None:
    with pytest.raises(ValueError, match=r"\.\.\.'$") as info:
        parse_metrics("x" * 500 + "{")
    assert len(str(info.value)) < 200


@pytest.mark.parametrize(
    "line",
    [
        "vllm:num_requests_waiting " + "\u202e\x1b[2J9" * 50_000,  # the value
        "vllm:num_requests_waiting 1 " + "\x1b[31m" * 50_000,  # the timestamp
        "vllm:num_requests_waiting{" + ("a" * 100_000 + '="1",') * 2 + "} 1",  # a label name
        'vllm:num_requests_waiting{a="\\\x1b[2J"} 1',  # an escape
        'vllm:num_requests_waiting{a="\\\u202e"} 1',
    ],
    ids=["value", "timestamp", "duplicate-label", "escape-ansi", "escape-bidi"],
)
def test_what_an_error_quotes_of_a_line_is_bounded_and_escaped(line: str) -> None:
    # A hostile backend's /metrics line: the scraper logs the error and /admin/status
    # shows it. A value of 250 KiB was quoted whole, an ESC or a bidi override raw.
    with pytest.raises(ValueError, match=r"^line 1: ") as info:
        parse_metrics(line)
    message = str(info.value)
    assert len(message) < 300
    assert message.isprintable() and message.isascii()


# --- property tests --------------------------------------------------------------------

metric_names = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,30}", fullmatch=True)
label_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,15}", fullmatch=True)
label_values = st.text(st.characters(codec="utf-8"), max_size=20)
samples = st.builds(
    Sample,
    name=metric_names,
    labels=st.dictionaries(label_names, label_values, max_size=4),
    value=st.floats(allow_nan=True, allow_infinity=True),
)
blanks = st.sampled_from([" ", "\t", "  ", " \t "])


def render_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(sample: Sample, blank: str, timestamp: int | None) -> str:
    labels = ",".join(f'{k}="{escape(v)}"' for k, v in sample.labels.items())
    text = sample.name + (f"{{{labels}}}" if labels else "") + blank + render_value(sample.value)
    return text if timestamp is None else f"{text}{blank}{timestamp}"


def same(a: Sample, b: Sample) -> bool:
    both_nan = math.isnan(a.value) and math.isnan(b.value)
    return (a.name, dict(a.labels)) == (b.name, dict(b.labels)) and (both_nan or a.value == b.value)


@given(
    st.lists(
        st.tuples(samples, blanks, st.none() | st.integers(-(2**63), 2**63 - 1)),
        max_size=20,
    )
)
def test_render_then_parse_round_trips(lines: list[tuple[Sample, str, int | None]]) -> None:
    text = "# a scrape\n" + "\n".join(render(s, b, ts) for s, b, ts in lines) + "\n"
    parsed = parse_metrics(text)
    expected: dict[str, list[Sample]] = {}
    for sample, _, _ in lines:
        expected.setdefault(sample.name, []).append(sample)
    assert list(parsed) == list(expected)
    for name, series in expected.items():
        assert len(parsed[name]) == len(series)
        assert all(same(got, want) for got, want in zip(parsed[name], series, strict=True))


# Mostly the format's own punctuation, so that the fuzzing reaches deep into the parser.
metricish_text = st.text(
    st.sampled_from(list('ab_:{}="\\,# \t\n\r019.eE+-NaInf')) | st.characters(codec="utf-8"),
    max_size=200,
)


@given(metricish_text)
def test_arbitrary_text_parses_or_raises_value_error(text: str) -> None:
    try:
        parsed = parse_metrics(text)
    except ValueError as exc:
        error: str | None = str(exc)
    else:
        error = None
        assert all(s.name == name for name, series in parsed.items() for s in series)
    assert error is None or error.startswith("line ")
