"""`owngate policy test` reads a case's `data_class` as the gateway reads the
`x-data-class` header (gateway/policy/labels.py): copies or comma-separated values that
agree are one class, values that disagree or a blank value are refused as
`unknown_data_class`. A case must never say "refused" where the gateway serves."""

from __future__ import annotations

import pytest

from gateway.policy import BackendFacts, UnknownDataClass, parse_policies
from gateway.policy.cases import parse_cases, run_cases
from gateway.policy.labels import InvalidLabel, one_label

M = frozenset({"m"})
BACKENDS = (
    BackendFacts("gpu", "private", "vllm", "own", "eu-west-1", "own", 0, True, False, M),
    BackendFacts("azure-eu", "hosted", "hosted", "azure", "westeurope", "ms", 0, True, False, M),
)
POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: p}
spec:
  tenants: [t]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback: {mode: when_private_unavailable, to: [{backend: azure-eu}]}
  data_classes:
    phi: {fallback: {mode: never}}
"""
CASE = """\
apiVersion: policy.owngate.dev/v1
kind: PolicyTest
metadata: {id: c}
cases:
  - name: one label
    input: {tenant: t, model: m, data_class: "LABEL"}
    expect: EXPECT
"""


def run(label: str, expect: str, policy: str = POLICY) -> tuple[str, ...]:
    policy_set = parse_policies([("p.yaml", policy)], BACKENDS)
    suites, errors = parse_cases("c.yaml", CASE.replace("LABEL", label).replace("EXPECT", expect))
    assert errors == []
    (result,) = run_cases(policy_set, suites).results
    return result.failures


def gateway_reads(label: str) -> str | None:
    """What the gateway makes of the header value: a class, or None when refused."""
    try:
        return one_label([label])
    except InvalidLabel:
        return None


@pytest.mark.parametrize("label", ["phi, phi", " phi , PHI", "phi,phi"])
def test_copies_that_agree_are_that_class_as_at_the_gateway(label: str) -> None:
    assert gateway_reads(label) == "phi"
    assert run(label, "{data_class: phi, hosted: [], fallback: never}") == ()
    assert run(label, "{error: unknown_data_class}") != ()


@pytest.mark.parametrize("label", ["phi,public", "phi,", " "])
def test_values_that_disagree_or_a_blank_label_are_refused_as_at_the_gateway(
    label: str,
) -> None:
    assert gateway_reads(label) is None
    assert run(label, "{error: unknown_data_class, rules: [p/data_classes]}") == ()


@pytest.mark.parametrize(
    "label", ["\u212ahi", "\u3000phi", "phi\u2009", "\xa0phi", "phi\x85", "\x1fphi"]
)
def test_no_unicode_space_or_case_folding_makes_a_class(label: str) -> None:
    # `policy test`, `policy explain` and the admin API read JSON or YAML strings: a
    # Kelvin sign lower-cases to `k` (class `khi` here), Unicode spaces strip, under
    # `str.lower()` and `str.strip()`. The gateway never folds them: nor may these.
    policy = POLICY.replace("phi: {fallback", "khi: {}\n    phi: {fallback")
    policy_set = parse_policies([("p.yaml", policy)], BACKENDS)
    assert one_label([label]) == label
    with pytest.raises(UnknownDataClass):
        policy_set.decide("t", "m", label)
    escaped = label.encode("unicode_escape").decode()  # a YAML double-quoted escape
    assert run(escaped, "{error: unknown_data_class, rules: [p/data_classes]}", policy) == ()


def test_spaces_and_tabs_around_a_class_are_stripped() -> None:
    assert one_label([" \tPhI\t "]) == "phi"
