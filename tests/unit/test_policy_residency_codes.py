"""Jurisdiction codes stand for what docs/policies.md's table says, read from the table
itself (tests/helpers/route_oracle.py); found by tests/unit/test_route_differential.py.

`eea` is "`eu` plus `is`, `li`, `no`", and an operator may declare a code as a backend's
region (`region: eu`). `eea` used to expand to the member states and their regions but
not to `eu` itself, so `residency: {deny: [eea]}` let a backend declared `region: eu`
through, and `allow: [eea]` refused it.
"""

from __future__ import annotations

import pytest

from gateway.policy import BackendFacts, parse_policies
from gateway.policy.jurisdictions import expand
from tests.helpers.route_oracle import jurisdictions

EU_SERVER = BackendFacts(
    id="gpu",
    tier="private",
    kind="vllm",
    provider="acme",
    region="eu",
    owner="acme",
    retention_days=0,
    zero_data_retention=True,
    training=False,
    models=frozenset({"m"}),
)


def decide(residency: str) -> tuple[str, ...]:
    text = f"""
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {{id: p}}
spec:
  tenants: [t]
  residency: {residency}
  retention: {{max_days: any}}
  fallback: {{mode: never}}
"""
    return parse_policies([("p.yaml", text)], (EU_SERVER,)).decide("t", "m", None).private


@pytest.mark.parametrize(
    ("residency", "admitted"),
    [
        ('{allow: ["*"], deny: [eea]}', ()),  # a deny of the EEA holds for `region: eu`
        ("{allow: [eea]}", ("gpu",)),
        ('{allow: ["*"], deny: [eu]}', ()),
        ("{allow: [eu]}", ("gpu",)),
    ],
)
def test_a_backend_declared_in_the_eu_is_in_the_eea(residency: str, admitted: tuple[str]) -> None:
    assert decide(residency) == admitted


def test_every_code_stands_for_what_the_documentation_table_says() -> None:
    table = jurisdictions()
    assert len(table) > 40  # the table was found
    for code, names in table.items():
        assert set(expand(code)) == names, code
