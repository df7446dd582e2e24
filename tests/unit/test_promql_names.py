"""The PromQL metric-name tokenizer the observability tests read dashboards and alert
rules with (tests/helpers/promql.py)."""

from __future__ import annotations

import pytest

from tests.helpers.promql import PromQLError, metric_names, variable_query_names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        (
            'histogram_quantile(0.9, sum by (le) (rate(a_bucket{x=~"$i"}[$__rate_interval])))',
            {"a_bucket"},
        ),
        ("sum(rate(a_total[5m])) by (backend) / ignoring(kind) group_left b", {"a_total", "b"}),
        ("a - on(instance) group_right(version) b > bool 0", {"a", "b"}),
        ("a - ignoring (w) group_right b", {"a", "b"}),
        ('max without (backend) (a{state="open", x="}{"}) == 1', {"a"}),
        ('{__name__="a", job="x"} offset 5m and b @ end()', {"a", "b"}),
        ("max_over_time((a - b)[10m:1m]) unless c[[var]]", {"a", "b", "c"}),
        ("topk($k, a) or vector(0) and Inf > NaN", {"a"}),
        ('label_replace(a, "dst", "$1", "src", "(.*)")', {"a"}),
        ("count(a:recorded:rate5m) * 2e3 + 0x1f", {"a:recorded:rate5m"}),
    ],
)
def test_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


@pytest.mark.parametrize(
    "expr",
    [
        "sum(rat(a[5m]))",  # a misspelt function never passes as a metric
        "sum(a",
        "sum(a))",
        "a[5m",
        "sum by backend (a)",
        "a ? b",
    ],
)
def test_malformed_or_unknown(expr: str) -> None:
    with pytest.raises(PromQLError):
        metric_names(expr)


def test_grafana_variable_queries() -> None:
    assert variable_query_names("label_values(owngate_build_info, instance)") == {
        "owngate_build_info"
    }
    assert variable_query_names('label_values(a{job="x"}, backend)') == {"a"}
    assert variable_query_names("label_values(instance)") == set()
    with pytest.raises(PromQLError):
        variable_query_names("query_result(a)")
