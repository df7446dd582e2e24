"""The policy set's digest pins every input of a residency decision, codes included.

A backend declared by a jurisdiction code (`region: de`) is excluded by a deny that covers
any part of the area (`deny: [eu-central-1]`), so the decision reads what the backend's own
code stands for. The canonical document's `jurisdictions` map held only the codes the
policies name: an auditor re-deciding a record from it (the record signs the policy digest
and the backend's declared region) found nothing for `de` and admitted the backend the
gateway had excluded; and two owngates whose tables differ for `de` decided differently
under the same policy digest and the same facts digest.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from types import MappingProxyType
from typing import Any

import pytest

from gateway.policy import BackendFacts, jurisdictions, parse_policies

POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {{id: p}}
spec:
  tenants: [t]
  residency: {{allow: {allow}, deny: {deny}}}
  retention: {{max_days: any}}
  fallback: {{mode: never}}
"""

REGIONS = ("eu", "eea", "de", "no", "uk", "gb", "ch", "eu-central-1", "westeurope", "dc-dublin")
RESIDENCIES = (
    ('["*"]', "[eu-central-1]"),
    ('["*"]', "[europe-west4]"),
    ('["*"]', '["eu-west-*"]'),
    ('["*"]', "[gb]"),
    ("[eea]", "[de]"),
    ("[eea]", "[norwayeast]"),
    ("[eu]", "[]"),
    ('["*"]', '["norway*", "dc-*"]'),
)


def _backend(bid: str, region: str) -> BackendFacts:
    return BackendFacts(
        bid, "private", "vllm", "own", region, "own", 0, True, False, frozenset({"m"})
    )


def _redecide(document: Any, region: str) -> bool:
    """Whether the policy admits `region`, as an auditor re-decides it: from the canonical
    document alone (its residency lists and its `jurisdictions` map), never from the
    auditor's own code tables."""
    table: dict[str, list[str]] = document["jurisdictions"]
    residency = document["policies"][0]["residency"]

    def stands_for(entry: str) -> list[str]:
        return table.get(entry.lower(), [entry.lower()])

    def covers(place: str, entry: str) -> bool:
        return any(place == p or fnmatchcase(place, p) for p in stands_for(entry))

    places = stands_for(region)  # a code is anywhere in its area: a deny of any part holds
    if any(covers(place, e) for place in places for e in residency["deny"]):
        return False
    return any(covers(region.lower(), e) for e in residency["allow"])


@pytest.mark.parametrize(("allow", "deny"), RESIDENCIES)
def test_the_canonical_document_alone_redecides_every_backend(allow: str, deny: str) -> None:
    backends = tuple(_backend(f"b{i}", r) for i, r in enumerate(REGIONS))
    policy_set = parse_policies([("p.yaml", POLICY.format(allow=allow, deny=deny))], backends)
    decision = policy_set.decide("t", "m", None)
    document = policy_set.document()
    for backend in backends:
        admitted = backend.id in decision.private
        assert _redecide(document, backend.region) == admitted, (backend.region, allow, deny)


def test_a_code_a_backend_declares_is_in_the_document() -> None:
    policy_set = parse_policies(
        [("p.yaml", POLICY.format(allow='["*"]', deny="[eu-central-1]"))],
        (_backend("in-de", "de"), _backend("named", "eu-west-1")),
    )
    assert policy_set.decide("t", "m", None).private == ("named",)
    assert policy_set.document()["jurisdictions"] == {"de": list(jurisdictions.expand("de"))}


def _digests(region: str, deny: str) -> tuple[str, str, tuple[str, ...]]:
    policy_set = parse_policies(
        [("p.yaml", POLICY.format(allow='["*"]', deny=deny))], (_backend("b", region),)
    )
    return policy_set.digest, policy_set.facts_digest, policy_set.decide("t", "m", None).private


def test_tables_that_decide_differently_give_other_digests(monkeypatch: pytest.MonkeyPatch) -> None:
    before = _digests("de", "[eu-central-1]")
    # Another owngate release whose table does not place eu-central-1 in Germany.
    other = dict(jurisdictions.COUNTRIES)
    other["de"] = ("europe-west3",)
    monkeypatch.setattr(jurisdictions, "COUNTRIES", MappingProxyType(other))
    after = _digests("de", "[eu-central-1]")
    assert (before[2], after[2]) == ((), ("b",))  # the decisions differ ...
    assert before[0] != after[0]  # ... so the policy digest the record signs does
    assert before[1] != after[1]  # and the facts digest


def test_a_backend_declared_by_region_name_keeps_its_digests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = _digests("eu-west-1", "[eu-central-1]")
    other = dict(jurisdictions.COUNTRIES)
    other["de"] = ("europe-west3",)
    monkeypatch.setattr(jurisdictions, "COUNTRIES", MappingProxyType(other))
    assert _digests("eu-west-1", "[eu-central-1]") == before
