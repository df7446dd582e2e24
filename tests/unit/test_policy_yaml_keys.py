"""A mapping key in a policy or case file is a plain name, read as written, or an error.

A key was read as `str` of its YAML node whatever the node was. For a list or mapping
(`? [a, b]`) that is the node's repr, which spells out every node under it through
every alias: a key naming an alias of a list of ten aliases of ten ... of ten entries
made a file of some 350 bytes take 72 MiB and seconds to read with six levels, ten times
that with each level more (a policy file the gateway reloads, or the `cases_yaml` a
security token sends to `POST /admin/v1/policies/test`). An error named the key by that
repr too (`spec.[ScalarNode(tag='tag:yaml.org,2002:str', value='providers')]`). Now a
list or mapping as a key, an alias as a key and a key with an explicit tag are errors at
the key's line, and nothing of such a key is expanded."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import TypeVar

import pytest

from gateway.policy import BackendFacts, check_sources
from gateway.policy.cases import parse_cases
from gateway.policy.source import read_documents

M = frozenset({"m"})
BACKENDS = (BackendFacts("gpu", "private", "vllm", "own", "eu-west-1", "own", 0, True, False, M),)
POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: &name p}
spec:
  tenants: [t]
  residency: {allow: ["*"]}
  retention: {max_days: any}
  fallback: {mode: never}
"""


T = TypeVar("T")


def _peak(read: Callable[[], T]) -> tuple[T, int]:
    """What `read()` returns, and the most memory it held at once (bytes, traced)."""
    tracing = tracemalloc.is_tracing()  # started by someone else: left running
    if not tracing:
        tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        result = read()
        _size, peak = tracemalloc.get_traced_memory()
    finally:
        if not tracing:
            tracemalloc.stop()
    return result, peak - before


def _laughs(levels: int) -> str:
    """Anchors of ten aliases each, `levels` deep, and a key naming the last: 10**levels
    entries when expanded."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join([*lines, f"? *a{levels - 1}", ": 1", ""])


def test_a_key_naming_an_alias_of_aliases_is_an_error_and_is_not_expanded() -> None:
    text = _laughs(6)  # a million entries expanded
    assert len(text) < 400
    (documents, issues), peak = _peak(lambda: read_documents("p.yaml", text))
    assert peak < 8 * 2**20, f"reading {len(text)} bytes took {peak >> 20} MiB"
    assert documents == []
    # an alias is the node it names, marked where that is: the key's is its value's mark
    at_key = [str(issue) for issue in issues if issue.line == 8]
    assert at_key == [
        "p.yaml:8:3: YAML aliases are not allowed in policy files; write the value out"
    ]
    assert all(len(str(issue)) < 200 for issue in issues)


def test_a_case_file_sent_with_such_a_key_is_refused_alike() -> None:
    """The admin API's `cases_yaml` is read by the same reader."""
    text = _laughs(6).replace("? *a5", "? [*a5]")
    (suites, errors), peak = _peak(lambda: parse_cases("cases_yaml", text))
    assert peak < 8 * 2**20, f"reading {len(text)} bytes took {peak >> 20} MiB"
    assert suites == []
    assert any("a key is a plain name" in str(e) and e.line == 7 for e in errors), errors


@pytest.mark.parametrize(
    ("key", "where", "problem"),
    [
        ("? [providers]\n  :", "p.yaml:9:5: spec", "a key is a plain name, not a list or mapping"),
        ("? {providers: 1}\n  :", "p.yaml:9:5: spec", "a key is a plain name"),
        ("*name :", "p.yaml:9:11: spec", "YAML aliases are not allowed"),
        ("!custom providers:", "p.yaml:9:3: spec", "YAML tags"),
    ],
)
def test_a_key_that_is_not_a_plain_name_is_an_error_at_its_line(
    key: str, where: str, problem: str
) -> None:
    text = POLICY + f"  {key} {{deny: [openai]}}\n"
    policy_set, errors, _warnings = check_sources([("p.yaml", text)], BACKENDS, ("t",))
    assert policy_set is None, "loaded; expected it refused"
    assert [str(e) for e in errors if str(e).startswith(where)], [str(e) for e in errors]
    assert any(problem in str(e) for e in errors), [str(e) for e in errors]
    assert not any("Node(" in str(e) for e in errors), [str(e) for e in errors]


def test_a_plain_key_still_loads() -> None:
    text = POLICY + "  providers: {deny: [openai]}\n"
    policy_set, errors, _warnings = check_sources([("p.yaml", text)], BACKENDS, ("t",))
    assert policy_set is not None, [str(e) for e in errors]
    assert policy_set.decide("t", "m", None).eligible == ("gpu",)
