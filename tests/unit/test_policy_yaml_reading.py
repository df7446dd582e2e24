"""Policy files are read as the plain data they show, or refused: an empty value is not a
key left out (`allow:` is not "allow everything"), an explicit YAML tag is an error
(never a crash, never ignored), a whole number is written in decimal digits (YAML 1.1's
`010`, `0x1e`, `1_000`, `1:30` are not), a date or time stays the text written, and
`require` is part of the digest and of a policy's default version."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.policy import BackendFacts, check_policies, check_sources, parse_policies
from gateway.policy_set import TrustPolicies, policy_stamps
from tests.helpers.gateways import backend, gateway_config

M = frozenset({"m"})
BACKENDS = (
    BackendFacts("gpu", "private", "vllm", "own", "eu-west-1", "own", 0, True, False, M),
    BackendFacts("azure-eu", "hosted", "hosted", "azure", "westeurope", "ms", 0, True, False, M),
    BackendFacts("openai", "hosted", "hosted", "openai", "us", "openai", 30, False, False, M),
)

POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata:
  id: p
  version: "1"
spec:
  tenants: [t]
  residency:
    allow: [eu]
  retention:
    max_days: zero
  providers:
    allow: [azure]
  fallback:
    mode: when_private_unavailable
    to:
      - provider: "*"
"""


def edited(old: str, new: str) -> str:
    assert old in POLICY
    return POLICY.replace(old, new, 1)


def only_error(text: str) -> str:
    policy_set, errors, _warnings = check_sources([("p.yaml", text)], BACKENDS, ("t",))
    assert policy_set is None, "loaded; expected it refused"
    assert len(errors) == 1, [str(e) for e in errors]
    return str(errors[0])


def test_the_unedited_policy_admits_only_azure() -> None:
    policy_set = parse_policies([("p.yaml", POLICY)], BACKENDS)
    assert policy_set.decide("t", "m", None).eligible == ("azure-eu",)


@pytest.mark.parametrize(
    ("old", "new", "where"),
    [
        ("    allow: [azure]\n", "    allow:\n", "p.yaml:13:5: spec.providers.allow: "),
        ("    allow: [azure]\n", "    allow: ~\n", "p.yaml:13:5: spec.providers.allow: "),
        (
            "    allow: [azure]\n",
            "    deny: [openai]\n    allow: null\n",
            "p.yaml:14:5: spec.providers.allow: ",
        ),
        ("    allow: [azure]\n", "    # allow: [azure]\n", "p.yaml:12:3: spec.providers: "),
        (
            "    allow: [azure]\n",
            "    allow: [azure]\n  data_classes:\n    phi:\n      backends:\n        allow:\n",
            "p.yaml:17:9: spec.data_classes.phi.backends.allow: ",
        ),
        ("  tenants: [t]\n", "  tenants: [t]\n  require:\n", "p.yaml:8:3: spec.require: "),
        ('  version: "1"\n', "  version:\n", "p.yaml:5:3: metadata.version: "),
    ],
)
def test_a_key_written_with_no_value_is_refused_not_taken_as_left_out(
    old: str, new: str, where: str
) -> None:
    # `allow:` with nothing after it (or its entries commented out) reads as "allow
    # nothing"; as null it meant a missing allow, which allows everything: the private
    # backend of provider `own` was admitted, with no warning.
    error = only_error(edited(old, new))
    assert error.startswith(where), error
    assert "has no value" in error


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("max_days: zero", "max_days: !foo bar"),
        ("max_days: zero", "max_days: !!int abc"),
        ("max_days: zero", "max_days: !!float x"),
        ("max_days: zero", "max_days: !!bool maybe"),
        ("max_days: zero", "max_days: !!timestamp nope"),
        ("max_days: zero", "max_days: !!python/name:os.system ''"),
        ("max_days: zero", "max_days: !!str 0"),
        ("max_days: zero", "max_days: !!int '30'"),
        ("  providers:\n", "  providers: !!python/object:builtins.dict\n"),
        ("allow: [azure]", "allow: !!set {azure: null}"),
        ("allow: [azure]", "allow: [!!binary YXp1cmU=]"),
    ],
)
def test_an_explicit_yaml_tag_is_an_error_never_a_crash_or_ignored(old: str, new: str) -> None:
    error = only_error(edited(old, new))
    assert "YAML tags" in error and "are not allowed in policy files" in error


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("max_days: zero", "max_days: 010"),  # YAML 1.1: 8; YAML 1.2: 10
        ("max_days: zero", "max_days: 0x1e"),  # 30
        ("max_days: zero", "max_days: 1_000"),  # 1000; YAML 1.2: a string
        ("max_days: zero", "max_days: 1:30"),  # 90 (base 60); YAML 1.2: a string
        ('version: "1"', "version: 010"),  # was recorded as version "8"
        ('version: "1"', "version: 1:30"),  # was recorded as version "90"
        ('version: "1"', "version: 0x10"),  # was recorded as version "16"
    ],
)
def test_a_yaml_1_1_number_form_is_refused(old: str, new: str) -> None:
    error = only_error(edited(old, new))
    assert "write numbers in plain decimal digits" in error


@pytest.mark.parametrize(("written", "days"), [("30", 30), ("+30", 30), ("0", 0)])
def test_a_decimal_number_still_reads_as_written(written: str, days: int) -> None:
    text = edited("max_days: zero", f"max_days: {written}")
    policy_set = parse_policies([("p.yaml", text)], BACKENDS)
    assert policy_set.document()["policies"][0]["retention"]["max_days"] == days


def test_a_timestamp_version_is_the_text_written() -> None:
    text = edited('version: "1"', "version: 2025-06-01T10:00:00Z")
    policy_set = parse_policies([("p.yaml", text)], BACKENDS)
    # YAML reads it as a datetime, which printed back as 2025-06-01T10:00:00+00:00.
    assert policy_set.compiled("p").version == "2025-06-01T10:00:00Z"


def test_require_changes_the_digest_and_the_default_version() -> None:
    unversioned = POLICY.replace('  version: "1"\n', "")
    tenants = "  tenants: [t]\n"
    required = unversioned.replace(tenants, tenants + "  require: [attested_facts]\n")
    plain = parse_policies([("p.yaml", unversioned)], BACKENDS)
    strict = parse_policies([("p.yaml", required)], BACKENDS)
    assert plain.decide("t", "m", None).eligible != strict.decide("t", "m", None).eligible
    # Two policies that decide differently must never be recorded as the same one.
    assert plain.digest != strict.digest
    assert plain.version != strict.version
    assert plain.compiled("p").version != strict.compiled("p").version
    # `require: []` requires nothing, as leaving it out does: the same digest.
    empty = unversioned.replace("  tenants: [t]\n", "  tenants: [t]\n  require: []\n")
    assert parse_policies([("p.yaml", empty)], BACKENDS).digest == plain.digest


def test_require_written_as_one_requirement_is_the_one_item_list() -> None:
    """Issue 15 writes `require: attested_facts`; it was refused ("Input should be a valid
    tuple"), so a policy written from the issue's words could not be loaded."""
    tenants = "  tenants: [t]\n"
    listed = POLICY.replace(tenants, tenants + "  require: [attested_facts]\n")
    bare = POLICY.replace(tenants, tenants + "  require: attested_facts\n")
    as_list = parse_policies([("p.yaml", listed)], BACKENDS)
    as_word = parse_policies([("p.yaml", bare)], BACKENDS)
    assert as_word.digest == as_list.digest
    # It requires what the list does: the declared-only and hosted backends are out.
    assert parse_policies([("p.yaml", POLICY)], BACKENDS).decide("t", "m", None).eligible
    assert as_word.decide("t", "m", None).eligible == ()
    assert "attested_facts" in only_error(bare.replace("attested_facts", "attested"))


def test_a_reload_onto_a_tagged_file_keeps_the_last_good_set_and_says_why(
    tmp_path: Path,
) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(
        POLICY.replace("  tenants: [t]", "  tenants: [acme]").replace(
            "    allow: [eu]", '    allow: ["*"]'
        )
    )
    config = gateway_config(
        [backend("gpu", "http://127.0.0.1:9", "m")], policy={"paths": ["p.yaml"]}
    )
    trust = TrustPolicies(config, tmp_path)
    before = trust.current
    policy.write_text(policy.read_text().replace("max_days: zero", "max_days: !foo bar"))
    assert trust.reload() is False  # raised ConstructorError (the SIGHUP reload path)
    assert trust.current is before
    assert trust.reload_failures == 1
    assert trust.last_error is not None and "YAML tags" in trust.last_error


@pytest.mark.parametrize("name", ["eu.YAML", "eu.Yml", "eu.yaml"])
def test_a_yaml_file_in_any_letter_case_is_loaded_and_watched(tmp_path: Path, name: str) -> None:
    # `EU.YAML` was skipped on Linux (and read on a case-insensitive filesystem): its
    # tenants had no policy here, and a PolicySet in it (the data-class header) was
    # silently not applied.
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / name).write_text(POLICY)
    policy_set, errors, _warnings = check_policies([policies], BACKENDS, ("t",))
    assert errors == [] and policy_set is not None
    assert policy_set.policy_for("t") == "p"
    assert [Path(stamp[0]).name for stamp in policy_stamps([policies])] == [name]


def test_a_case_file_too_large_is_refused_naming_it(tmp_path: Path) -> None:
    """Case files under `tests/` (what `owngate policy test` and `POST
    /admin/v1/policies/test` run) were read whole, whatever their size: a case file
    padded past what a policy file may be (1 MiB) loaded, where it must be an error
    naming the file, as for a policy file."""
    from gateway.policy.cases import load_cases

    cases = tmp_path / "tests" / "big.yaml"
    cases.parent.mkdir()
    head = (
        "apiVersion: policy.owngate.dev/v1\nkind: PolicyTest\nmetadata: {id: c}\n"
        "cases:\n  - name: one\n    input: {tenant: t, model: m}\n    expect: {refusal: null}\n"
    )
    padding = ("#" * 79 + "\n") * (1024 * 1024 // 80 + 1)  # past 1 MiB
    cases.write_text(head + padding)
    suites, errors = load_cases([tmp_path / "tests"])
    assert suites == []
    assert [(e.file, "larger than" in e.message) for e in errors] == [(str(cases), True)]
