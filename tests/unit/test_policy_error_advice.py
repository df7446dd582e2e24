"""What a policy error tells the author to write must be something that loads and works.

- `saturation_threshold` said "at most 1e9", but YAML 1.1 reads `1e9` as text, which is
  refused: the bound is written in digits, and the digits load.
- An entry holding `#` is refused (YAML starts a comment only after a space), yet a model
  name in gateway.yaml may hold `#`: the error says how to match one (`?`), and that works.
"""

from __future__ import annotations

import pytest

from gateway.policy import BackendFacts, check_sources, parse_policies

POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: p}
spec:
  tenants: [t]
  residency: {allow: ["*"]}
  retention: {max_days: any}
"""


def _backend(bid: str, models: frozenset[str]) -> BackendFacts:
    return BackendFacts(bid, "private", "vllm", "own", "eu-west-1", "own", 0, True, False, models)


BACKENDS = (_backend("a", frozenset({"m#1", "m"})),)


@pytest.mark.parametrize("written", ["1e9", "1.0e9", "1000000001"])
def test_a_threshold_past_the_bound_names_the_bound_in_digits(written: str) -> None:
    text = (
        POLICY + f"  fallback: {{mode: when_private_saturated, saturation_threshold: {written}}}\n"
    )
    _set, errors, _warnings = check_sources([("p.yaml", text)], BACKENDS, ["t"])
    assert [e.path for e in errors] == ["spec.fallback.saturation_threshold"], errors
    assert "at most 1000000000 " in errors[0].message
    assert "1e9" not in errors[0].message.replace("reads 1e9 as text", "")


def test_the_bound_as_the_error_writes_it_loads() -> None:
    text = (
        POLICY
        + "  fallback: {mode: when_private_saturated, saturation_threshold: 1000000000, to: []}\n"
    )
    decision = parse_policies([("p.yaml", text)], BACKENDS).decide("t", "m", None)
    assert decision.saturation_threshold == 1e9


def test_a_model_name_holding_a_hash_is_matched_as_the_error_says() -> None:
    deny = POLICY + "  fallback: {mode: never}\n  models: {deny: [m#1]}\n"
    _set, errors, _warnings = check_sources([("p.yaml", deny)], BACKENDS, ["t"])
    assert [e.path for e in errors] == ["spec.models.deny[0]"], errors
    assert "write ? for it" in errors[0].message
    policy_set = parse_policies([("p.yaml", deny.replace("m#1", '"m?1"'))], BACKENDS)
    assert policy_set.decide("t", "m#1", None).refusal is not None
    assert policy_set.decide("t", "m", None).private == ("a",)
