"""`owngate policy check` warns about a residency glob that reads like a jurisdiction but
spans several countries: `allow: ["eu-*"]` looks like "the EU" and admits AWS eu-west-2
(London) and eu-central-2 (Zurich). It is a warning (the glob is valid and does what it
says), so the author sees it before the traffic does; `--strict` fails on it."""

from __future__ import annotations

import pytest

from gateway.policy import BackendFacts, check_sources

M = frozenset({"m"})
BACKENDS = (
    BackendFacts("dublin", "private", "vllm", "own", "eu-west-1", "own", 0, True, False, M),
    BackendFacts("london", "private", "vllm", "own", "eu-west-2", "own", 0, True, False, M),
    BackendFacts("virginia", "private", "vllm", "own", "us-east-1", "own", 0, True, False, M),
)


def check(allow: str) -> tuple[tuple[str, ...], list[str]]:
    text = f"""\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {{id: p}}
spec:
  tenants: [t]
  residency:
    allow: {allow}
  retention: {{max_days: any}}
  fallback: {{mode: never}}
"""
    policy_set, errors, warnings = check_sources([("p.yaml", text)], BACKENDS, ("t",))
    assert policy_set is not None, errors
    return policy_set.decide("t", "m", None).private, [str(w) for w in warnings]


def test_an_eu_glob_admits_london_and_check_says_so() -> None:
    admitted, warnings = check('["eu-*"]')
    assert admitted == ("dublin", "london")
    (warning,) = warnings
    assert warning.startswith(
        "p.yaml:7:13: spec.residency.allow[0]: 'eu-*' is a region glob, not a jurisdiction: "
        "it allows regions of 8 countries ("
    )
    assert "eu-west-2 in uk" in warning and "eu-central-2 in ch" in warning


@pytest.mark.parametrize(
    "allow",
    [
        "[eu]",  # a jurisdiction code: its regions one by one
        '["*"]',  # everywhere, as written
        '["us-*"]',  # a glob within one country
        "[eu-west-1, eu-west-2]",  # region names
    ],
)
def test_codes_names_star_and_one_country_globs_are_not_warned_about(allow: str) -> None:
    _admitted, warnings = check(allow)
    assert not [w for w in warnings if "region glob" in w], warnings


def test_a_deny_code_cannot_see_a_region_the_table_does_not_place() -> None:
    virginia = BackendFacts(
        "box", "private", "vllm", "own", "virginia", "own", 0, True, False, frozenset({"m"})
    )
    text = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: p}
spec:
  tenants: [t]
  residency: {allow: ["*"], deny: [us]}
  retention: {max_days: any}
  fallback: {mode: never}
"""
    policy_set, errors, warnings = check_sources([("p.yaml", text)], (*BACKENDS, virginia), ("t",))
    assert policy_set is not None, errors
    # `deny: [us]` excludes us-east-1 but not a box declared `region: virginia`.
    assert policy_set.decide("t", "m", None).private == ("dublin", "london", "box")
    (warning,) = [str(w) for w in warnings]
    assert warning.startswith(
        "p.yaml:6:36: spec.residency.deny[0]: residency.allow admits box ('virginia'), whose "
        "region the built-in table does not place in any jurisdiction"
    )
    # Denied by name as well: nothing left to warn about.
    named = text.replace("deny: [us]", "deny: [us, virginia]")
    _set, _errors, warnings = check_sources([("p.yaml", named)], (*BACKENDS, virginia), ("t",))
    assert warnings == []
