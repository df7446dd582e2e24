"""Policy text that reads as a restriction in a review but restricted nothing.

- YAML joins a value continued on the next line into one scalar: a deny list item indented
  one step too far (`- azure` then `  - openai`), a missing comma (`[azure openai]`) or a
  quoted entry broken over two lines loaded as the single entry 'azure - openai', which
  matched no provider, so the deny held for neither (`check` only warned). Such an entry
  is now an error at load, with the file, line and column.
- A backend may be declared by a jurisdiction code (`region: eu`, `region: de`): it is
  somewhere in that area. `residency: {allow: [eea], deny: [de, "no"]}` admitted a backend
  declared `region: eu` or `region: eea`, which may well be in Germany or Norway. A deny now
  holds for such a backend when it covers any part of the area.
"""

from __future__ import annotations

from typing import Literal

import pytest

from gateway.policy import BackendFacts, PolicyError, check_sources, parse_policies

M = frozenset({"m"})


def _backend(
    bid: str, tier: Literal["private", "hosted"], provider: str, region: str
) -> BackendFacts:
    kind = "hosted" if tier == "hosted" else "vllm"
    return BackendFacts(bid, tier, kind, provider, region, provider, 0, True, False, M)


HOSTED = (
    _backend("gpu", "private", "own", "eu-west-1"),
    _backend("azure-eu", "hosted", "azure", "westeurope"),
    _backend("openai", "hosted", "openai", "us"),
)

POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: p}
spec:
  tenants: [t]
  residency: {allow: ["*"]}
  retention: {max_days: any}
  fallback:
    mode: when_private_unavailable
    to: [{provider: "*"}]
"""


@pytest.mark.parametrize(
    ("section", "where", "joined"),
    [
        # the second item indented one step too far: a continuation of the first
        (
            "  providers:\n    deny:\n      - azure\n        - openai\n",
            "p.yaml:13:9",
            "azure - openai",
        ),
        ("  providers:\n    deny: [azure openai]\n", "p.yaml:12:12", "azure openai"),
        ("  providers:\n    deny: [azure\n      openai]\n", "p.yaml:12:12", "azure openai"),
        ('  providers: {deny: ["azure\n    openai"]}\n', "p.yaml:11:22", "azure openai"),
        ("  backends:\n    deny: [azure-eu\n      openai]\n", "p.yaml:12:12", "azure-eu openai"),
        ("  models: {allow: [m\n    n]}\n", "p.yaml:11:20", "m n"),
    ],
)
def test_an_entry_joined_from_two_lines_is_an_error_not_a_deny_of_nothing(
    section: str, where: str, joined: str
) -> None:
    text = POLICY + section
    policy_set, errors, _warnings = check_sources([("p.yaml", text)], HOSTED, ["t"])
    assert policy_set is None
    assert len(errors) == 1, errors
    assert str(errors[0]).startswith(f"{where}: "), str(errors[0])
    assert f"{joined!r} has a space inside" in errors[0].message
    with pytest.raises(PolicyError, match="has a space inside"):  # what the gateway loads
        parse_policies([("p.yaml", text)], HOSTED)


def test_the_entries_written_as_two_items_deny_both() -> None:
    text = POLICY + "  providers:\n    deny:\n      - azure\n      - openai\n"
    decision = parse_policies([("p.yaml", text)], HOSTED).decide("t", "m", None)
    assert (decision.private, decision.hosted) == (("gpu",), ())


def test_a_fallback_target_with_a_space_inside_is_an_error() -> None:
    text = POLICY.replace('[{provider: "*"}]', '[{provider: "azure openai"}]')
    _set, errors, _warnings = check_sources([("p.yaml", text)], HOSTED, ["t"])
    assert [e.path for e in errors] == ["spec.fallback.to[0].provider"], errors


CODED = (
    _backend("in-eu", "private", "own", "eu"),
    _backend("in-eea", "private", "own", "eea"),
    _backend("in-de", "private", "own", "de"),
    _backend("frankfurt", "private", "own", "eu-central-1"),
    _backend("dublin", "private", "own", "eu-west-1"),
    _backend("oslo", "private", "own", "norwayeast"),
)


def _admitted(residency: str) -> tuple[str, ...]:
    text = POLICY.replace('residency: {allow: ["*"]}', f"residency: {residency}")
    return parse_policies([("p.yaml", text)], CODED).decide("t", "m", None).private


@pytest.mark.parametrize(
    ("residency", "admitted"),
    [
        # `eu` and `eea` may be Germany; `de` may be eu-central-1 (Frankfurt)
        ("{allow: [eea], deny: [de]}", ("dublin", "oslo")),
        ('{allow: [eea], deny: ["no"]}', ("in-eu", "in-de", "frankfurt", "dublin")),
        ('{allow: ["*"], deny: [eu]}', ("oslo",)),
        ('{allow: ["*"], deny: [eu-central-1]}', ("dublin", "oslo")),
        ('{allow: ["*"], deny: [ie]}', ("in-de", "frankfurt", "oslo")),
        # an allow still needs the whole declared area inside it
        ("{allow: [de]}", ("in-de", "frankfurt")),
        ("{allow: [eu]}", ("in-eu", "in-de", "frankfurt", "dublin")),
    ],
)
def test_a_deny_holds_for_a_backend_declared_in_any_area_it_overlaps(
    residency: str, admitted: tuple[str, ...]
) -> None:
    assert _admitted(residency) == admitted


def test_the_trace_says_why_a_backend_declared_by_a_code_is_denied() -> None:
    text = POLICY.replace('residency: {allow: ["*"]}', "residency: {allow: [eea], deny: [de]}")
    decision = parse_policies([("p.yaml", text)], CODED).decide("t", "m", None)
    reasons = {e.backend: e.reason for e in decision.trace if e.verdict == "excluded"}
    assert reasons["in-eu"] == (
        "region 'eu' is a jurisdiction code and residency.deny 'de' covers part of it ('de'): "
        "the declaration does not place the backend outside it"
    )
    assert reasons["frankfurt"] == "region 'eu-central-1' is covered by residency.deny 'de'"


def test_check_does_not_call_such_a_deny_a_typo() -> None:
    """The deny of `de` excludes the backend declared `region: eu`: it matches something."""
    backends = (CODED[0], _backend("dublin", "private", "own", "eu-west-1"))
    text = POLICY.replace('residency: {allow: ["*"]}', "residency: {allow: [eu], deny: [de]}")
    policy_set, errors, warnings = check_sources([("p.yaml", text)], backends, ["t"])
    assert policy_set is not None, errors
    assert not [w for w in warnings if "matches no configured backend region" in w.message]


CASES = """\
apiVersion: policy.owngate.dev/v1
kind: PolicyTest
metadata: {id: cases}
cases:
  - name: nothing leaves our own servers
    input: {tenant: t, model: m}
    expect:
      private: [gpu]
"""


@pytest.mark.parametrize(
    ("expect", "path"),
    [
        # the entries commented out: reads as "expects none", checked nothing
        ("      hosted:\n        # - azure-eu\n", "cases[0].expect.hosted"),
        ("      hosted: null\n", "cases[0].expect.hosted"),
        ("      fallback: ~\n", "cases[0].expect.fallback"),
        ("      fallback_rule:\n", "cases[0].expect.fallback_rule"),
        ("      error:\n", "cases[0].expect.error"),
        ("      excluded: {}\n", "cases[0].expect.excluded"),
        ("      admitted: {}\n", "cases[0].expect.admitted"),
        ("      rules: []\n", "cases[0].expect.rules"),
    ],
)
def test_a_case_expectation_written_empty_is_an_error_not_a_pass(expect: str, path: str) -> None:
    """Each of these passed whatever the policy decided (here: it sends the request hosted)."""
    from gateway.policy.cases import parse_cases, run_cases

    text = CASES.replace("      private: [gpu]\n", expect)
    suites, errors = parse_cases("c.yaml", text)
    assert suites == []
    assert [e.path for e in errors] == [path], errors
    assert "check nothing" in errors[0].message
    policy_set = parse_policies([("p.yaml", POLICY)], HOSTED[1:])  # hosted only
    assert run_cases(policy_set, parse_cases("c.yaml", CASES)[0]).failed == 1  # the control


@pytest.mark.parametrize(
    "expect", ["      hosted: []\n", "      refusal: null\n", "      data_class: null\n"]
)
def test_an_empty_list_and_a_null_refusal_or_class_still_check(expect: str) -> None:
    from gateway.policy.cases import parse_cases, run_cases

    suites, errors = parse_cases("c.yaml", CASES.replace("      private: [gpu]\n", expect))
    assert errors == []
    policy_set = parse_policies([("p.yaml", POLICY)], HOSTED)
    decision = policy_set.decide("t", "m", None)
    assert (decision.hosted, decision.refusal, decision.data_class) != ((), None, None)
    wanted_fail = expect.strip() == "hosted: []"
    assert run_cases(policy_set, suites).failed == int(wanted_fail)


@pytest.mark.parametrize(
    "description",
    [
        # a folded block: the rule line is part of the text (reads "... fallback: {...}")
        ">\n        Protected health information.\n        fallback: {mode: never}\n",
        "|\n        Stays in the EU.\n          residency: {allow: [eu]}\n",
        '"Stays private.\n        fallback: {mode: never}"\n',
        "|\n        providers:\n          deny: [openai]\n",
        # the key quoted, as JSON writes it, or flow style
        '>\n        PHI.\n        "fallback": {"mode": "never"}\n',
        ">\n        PHI.\n        'fallback': {'mode': 'never'}\n",
        ">\n        PHI.\n        [require: attested_facts]\n",
        # written with characters a review does not see, or takes for ASCII
        ">\n        PHI.\n        fall\u200bback: {mo\u200bde: never}\n",  # zero-width space
        ">\n        PHI.\n        require\u00ad: [attested_facts]\n",  # soft hyphen
        ">\n        PHI.\n        require\u2060: [attested_facts]\n",  # word joiner
        ">\n        PHI.\n        require\uff1a [attested_facts]\n",  # full-width colon
        ">\n        PHI.\n        r\u0435quire: [attested_facts]\n",  # Cyrillic e
    ],
)
def test_a_rule_written_inside_a_description_is_an_error_not_text(description: str) -> None:
    """It reads as the data class's rule in a review and restricted nothing: `phi` requests
    went to every hosted provider the policy admits."""
    text = POLICY + f"  data_classes:\n    phi:\n      description: {description}"
    policy_set, errors, _warnings = check_sources([("p.yaml", text)], HOSTED, ["t"])
    assert policy_set is None
    assert [(e.line, e.path) for e in errors] == [(13, "spec.data_classes.phi.description")]
    assert "reads as a policy key but is text here" in errors[0].message


@pytest.mark.parametrize(
    "description",
    [
        "Protected health information",
        "'Fallback: never. Residency: EU only.'",
        "'Données de santé: restent dans l\u2019UE'",
        "'Данные пациентов: только \u0415\u0421'",
        "'Δεδομένα υγείας: μόνο \u0395\u0395'",
        "'the \"phi\" class: patient data'",
    ],
)
def test_a_description_in_prose_loads(description: str) -> None:
    text = POLICY + f"  data_classes:\n    phi:\n      description: {description}\n"
    parse_policies([("p.yaml", text)], HOSTED)
    text = POLICY.replace("metadata: {id: p}", f"metadata: {{id: p, description: {description}}}")
    parse_policies([("p.yaml", text)], HOSTED)


HIDDEN = (
    "---{br}apiVersion: policy.owngate.dev/v1{br}kind: Policy{br}metadata: {{id: q}}{br}"
    "spec: {{tenants: [evil], residency: {{allow: ['*']}}, retention: {{max_days: any}}, "
    "fallback: {{mode: when_private_unavailable, to: [{{provider: '*'}}]}}}}"
)


@pytest.mark.parametrize("br", ["\x85", "\u2028", "\u2029", "\r"])
def test_a_line_break_only_yaml_sees_is_an_error_not_a_hidden_document(br: str) -> None:
    """YAML 1.1 breaks lines at NEL, LS, PS and a lone CR; diffs, grep and editors show one
    line. A whole second Policy, binding tenant `evil` to a permissive profile, loaded from
    what a review showed as a comment."""
    comment = "# nothing hosted, ever"
    text = POLICY.replace('[{provider: "*"}]\n', '[{provider: "*"}]  ' + comment + "\n")
    assert len(text.splitlines()) == 10
    sneaky = text.replace(comment, comment + br + HIDDEN.format(br=br))
    assert sneaky.count("\n") == text.count("\n")  # the same lines to a reviewer
    policy_set, errors, _warnings = check_sources([("p.yaml", sneaky)], HOSTED, ["t", "evil"])
    assert policy_set is None
    assert [(e.line, e.column) for e in errors] == [(10, 50)], errors
    assert "YAML reads a line break there" in errors[0].message


def test_windows_line_endings_still_load() -> None:
    policy_set = parse_policies([("p.yaml", POLICY.replace("\n", "\r\n"))], HOSTED)
    assert policy_set.tenants() == {"t"}


def test_a_bidirectional_control_is_an_error() -> None:
    """Trojan Source (CVE-2021-42574): a line displayed in another order than it is read."""
    text = POLICY.replace("metadata: {id: p}", "metadata: {id: p}  # \u202eeulav")
    _set, errors, _warnings = check_sources([("p.yaml", text)], HOSTED, ["t"])
    assert [(e.line, e.column) for e in errors] == [(3, 22)], errors
    assert "U+202E RIGHT-TO-LEFT OVERRIDE" in errors[0].message


def test_gateway_yaml_refuses_a_hidden_line_break_too() -> None:
    """gateway.yaml declares the facts policies judge (`region`): the same trap."""
    from gateway.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match="U\\+2028 LINE SEPARATOR") as caught:
        parse_config("listen: {port: 8080}  # a comment\u2028backends: []\n", source="gw.yaml")
    assert [issue.line for issue in caught.value.issues] == [1]


GATEWAY = """\
backends:
  - id: gpu
    kind: vllm
    base_url: http://127.0.0.1:9
    models: [{{name: m}}]
    region: eu-west-1
    owner: acme
    retention:
      days: 30
      evidence: >
        Vendor DPA 2024, annex 3.
        {written}
"""


@pytest.mark.parametrize(
    ("written", "key"),
    [
        ("training: true", "training"),
        ('"zero_data_retention": false', "zero_data_retention"),
        ("da\u200bys: 365", "days"),  # a zero-width space inside
    ],
)
def test_a_fact_written_inside_evidence_is_an_error_not_text(written: str, key: str) -> None:
    """`evidence: >` runs on over the lines below it: read as a declared fact in a review,
    it was text, and the backend declared the default (`training: false`), admitted by
    policies that exclude training providers."""
    from gateway.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match=f"evidence holds '{key}:'") as caught:
        parse_config(GATEWAY.format(written=written), source="gw.yaml")
    assert [issue.line for issue in caught.value.issues] == [10]  # `evidence:`


def test_evidence_in_prose_loads() -> None:
    from gateway.config.loader import parse_config

    written = "Retention: 30 days, no training (signed 2024-05-01)."
    config = parse_config(GATEWAY.format(written=written), source="gw.yaml")
    assert config.backends[0].retention.days == 30


US = (
    _backend("virginia", "private", "own", "us-east-1"),
    _backend("azure-us", "private", "own", "eastus"),
    _backend("dublin", "private", "own", "eu-west-1"),
)


@pytest.mark.parametrize(
    ("deny", "warned"),
    [
        ('["us-*"]', True),  # denies AWS us-east-1, not Azure's eastus, also in the US
        ('["us-*", eastus]', False),
        ("[us]", False),
        ('["eu-west-*"]', False),  # no admitted backend in another region of Ireland
    ],
)
def test_check_warns_at_a_deny_glob_that_misses_part_of_a_country(deny: str, warned: bool) -> None:
    text = POLICY.replace('residency: {allow: ["*"]}', f'residency: {{allow: ["*"], deny: {deny}}}')
    policy_set, errors, warnings = check_sources([("p.yaml", text)], US, ["t"])
    assert policy_set is not None, errors
    found = [w for w in warnings if "is a region glob, not a jurisdiction: it denies" in w.message]
    assert [(w.path, w.message) for w in found] == (
        [
            (
                "spec.residency.deny[0]",
                "'us-*' is a region glob, not a jurisdiction: it denies us-east-1 in us but "
                "not azure-us ('eastus'), also in us; to deny a jurisdiction, name its code (us)",
            )
        ]
        if warned
        else []
    )


@pytest.mark.parametrize("entry", ["azure#openai", "openai#removed"])
def test_an_entry_with_a_hash_inside_is_an_error_not_a_comment(entry: str) -> None:
    """`- openai#removed` is the entry 'openai#removed' (YAML needs a space before `#`):
    it matched nothing, so the deny held for neither provider."""
    text = POLICY + f"  providers:\n    deny:\n      - {entry}\n"
    _set, errors, _warnings = check_sources([("p.yaml", text)], HOSTED, ["t"])
    assert [(e.line, e.path) for e in errors] == [(13, "spec.providers.deny[0]")], errors
    assert f"{entry!r} holds '#'" in errors[0].message


@pytest.mark.parametrize(
    ("old", "new", "path"),
    [
        ("max_days: any", "max_days: 9007199254740993", "spec.retention.max_days"),
        ("max_days: any", "max_days: 1000000", "spec.retention.max_days"),
        (
            "mode: when_private_unavailable",
            "mode: when_private_saturated\n    saturation_threshold: .inf",
            "spec.fallback.saturation_threshold",
        ),
        (
            "mode: when_private_unavailable",
            "mode: when_private_saturated\n    saturation_threshold: " + "9" * 400,
            "spec.fallback.saturation_threshold",
        ),
    ],
)
def test_a_number_too_large_for_the_digest_is_an_error_not_a_traceback(
    old: str, new: str, path: str
) -> None:
    """These raised ValueError from the digest's I-JSON encoder (not a PolicyError): a
    traceback from `check`, and a gateway that would not start, naming no file or line."""
    text = POLICY.replace(old, new)
    policy_set, errors, _warnings = check_sources([("p.yaml", text)], HOSTED, ["t"])
    assert policy_set is None
    assert [e.path for e in errors] == [path], errors
    with pytest.raises(PolicyError):
        parse_policies([("p.yaml", text)], HOSTED)


def test_the_largest_number_of_days_still_loads() -> None:
    text = POLICY.replace("max_days: any", "max_days: 999999")
    assert parse_policies([("p.yaml", text)], HOSTED).tenants() == {"t"}


def test_gateway_yaml_refuses_days_the_facts_digest_cannot_encode() -> None:
    from pydantic import ValidationError

    from gateway.config.schema import BackendSettings
    from tests.helpers.gateways import backend

    spec = backend("gpu", "http://127.0.0.1:9", "m")
    spec["retention"] = {"days": 2**53}
    with pytest.raises(ValidationError, match=r"retention\.days"):
        BackendSettings.model_validate(spec)
    spec["retention"] = {"days": 2**53 - 1}
    BackendSettings.model_validate(spec)
