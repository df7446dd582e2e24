"""Policy files: strict schema errors with file, line and column; cross-file checks; file
discovery; the digest (stable under formatting, changed by meaning); `check` warnings."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gateway.canonical import canonical_json
from gateway.policy import (
    BackendFacts,
    PolicyError,
    PolicyIssue,
    check_policies,
    check_sources,
    load_policies,
    parse_policies,
)

M = frozenset({"m"})
BACKENDS = (
    BackendFacts("gpu", "private", "vllm", "own", "eu-west-1", "own", 0, True, False, M),
    BackendFacts("azure-eu", "hosted", "hosted", "azure", "westeurope", "ms", 0, True, False, M),
    BackendFacts("openai", "hosted", "hosted", "openai", "us", "openai", 30, False, False, M),
)

VALID = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata:
  id: eu-health
spec:
  tenants: [clinic]
  residency:
    allow: [eu]
  retention:
    max_days: zero
  fallback:
    mode: when_private_unavailable
    to:
      - backend: azure-eu
"""


def errors(text: str) -> list[str]:
    policy_set, issues, _warnings = check_sources([("p.yaml", text)], BACKENDS)
    assert policy_set is None
    return [str(issue) for issue in issues]


def warnings(*texts: str, tenants: tuple[str, ...] = ()) -> list[str]:
    sources = [(f"p{i}.yaml", text) for i, text in enumerate(texts)]
    policy_set, issues, found = check_sources(sources, BACKENDS, tenants, tenants_source="gw.yaml")
    assert policy_set is not None, issues
    return [str(issue) for issue in found]


def assert_prefixes(found: list[str], *expected: str) -> None:
    assert len(found) == len(expected), found
    for issue, prefix in zip(found, expected, strict=True):
        assert issue.startswith(prefix), (issue, prefix)


def test_the_valid_policy_loads_clean() -> None:
    assert warnings(VALID, tenants=("clinic",)) == []


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            ("    allow: [eu]\n", "    allow: [eu]\n    colour: blue\n"),
            "p.yaml:9:5: spec.residency.colour: unknown key (not part of the schema)",
        ),
        (
            ("allow: [eu]", "allow: [eu, no]"),
            "p.yaml:8:17: spec.residency.allow[1]: expected a string; YAML reads unquoted "
            "yes/no/on/off as true/false, so quote it (e.g. 'no' for Norway)",
        ),
        (
            ("max_days: zero", 'max_days: "30"'),
            "p.yaml:10:5: spec.retention.max_days: max_days is 'zero', 'any' or a whole number",
        ),
        (("max_days: zero", "max_days: -1"), "spec.retention.max_days: max_days is 'zero'"),
        (
            ("mode: when_private_unavailable", "mode: sometimes"),
            "p.yaml:12:5: spec.fallback.mode: Input should be 'never', 'when_private_unavailable' "
            "or 'when_private_saturated'",
        ),
        (
            ("  residency:\n    allow: [eu]\n", ""),
            "p.yaml:5:1: spec.residency: required key is missing",
        ),
        (
            ("    to:\n      - backend: azure-eu\n", ""),
            "p.yaml:11:3: spec.fallback: fallback.to is required unless mode is never",
        ),
        (
            ("mode: when_private_unavailable", "mode: when_private_saturated"),
            "p.yaml:11:3: spec.fallback: mode when_private_saturated needs saturation_threshold",
        ),
        (
            ("- backend: azure-eu", "- {backend: azure-eu, provider: azure}"),
            "p.yaml:14:9: spec.fallback.to[0]: each fallback.to entry names exactly one",
        ),
        (
            ("mode: when_private_unavailable", "mode: never"),
            "p.yaml:11:3: spec.fallback: fallback.to has no effect when mode is never",
        ),
        (("id: eu-health", "id: eu/health"), "p.yaml:4:3: metadata.id: String should match"),
        (("tenants: [clinic]", "tenants: [clinic, clinic]"), "spec.tenants: tenant listed more"),
        (
            ("  tenants: [clinic]\n", "  tenants: [clinic]\n  data_classes: {PHI: {}}\n"),
            "p.yaml:7:18: spec.data_classes.PHI.[key]: String should match",
        ),
        (
            ("  residency:\n", "  residency:\n    allow: [us]\n"),
            "p.yaml:9:5: spec.residency.allow: duplicate key",
        ),
        (
            ("apiVersion: policy.owngate.dev/v1", "apiVersion: policy.owngate.dev/v2"),
            "p.yaml:1:1: apiVersion: unsupported apiVersion 'policy.owngate.dev/v2' "
            "(this owngate reads policy.owngate.dev/v1)",
        ),
        (("kind: Policy", "kind: PolicyTest"), "p.yaml:2:1: kind: this is a test case file"),
        (
            ("    allow: [eu]\n", "    allow: &regions [eu]\n    deny: *regions\n"),
            "p.yaml:9:5: spec.residency.deny: YAML aliases are not allowed",
        ),
        (("kind: Policy", "kind: Polcy"), "p.yaml:2:1: kind: unknown kind 'Polcy'"),
        # A name or glob that can match nothing must not load: a deny entry written so
        # would protect nothing (these loaded, and excluded no backend).
        (
            ("allow: [eu]", 'allow: [eu]\n    deny: ["us "]'),
            "p.yaml:9:12: spec.residency.deny[0]: 'us ' has spaces at its ends",
        ),
        (
            ("  residency:\n", '  providers: {deny: [" openai"]}\n  residency:\n'),
            "spec.providers.deny[0]: ' openai' has spaces at its ends",
        ),
        (
            ("  residency:\n", '  backends: {deny: ["\\u200bopenai"]}\n  residency:\n'),
            "spec.backends.deny[0]: '\\u200bopenai' has U+200B ZERO WIDTH SPACE at position 0",
        ),
        # A look-alike letter: `gpt-4o` with U+043E CYRILLIC SMALL LETTER O (this loaded,
        # and never matched the model it was meant to deny).
        (
            ("  residency:\n", '  models: {deny: ["gpt-4\\u043e"]}\n  residency:\n'),
            "p.yaml:7:19: spec.models.deny[0]: 'gpt-4\u043e' has U+043E CYRILLIC SMALL LETTER O",
        ),
        (
            ("allow: [eu]", 'allow: ["\\u0435u"]'),
            "spec.residency.allow[0]: '\u0435u' has U+0435 CYRILLIC SMALL LETTER IE at position 0",
        ),
        (
            ("- backend: azure-eu", '- provider: "\\uff4fpenai"'),
            "spec.fallback.to[0].provider: '\uff4fpenai' has U+FF4F FULLWIDTH LATIN SMALL",
        ),
        (("- backend: azure-eu", "- backend: 'azure-eu\t'"), "spec.fallback.to[0].backend"),
        (("allow: [eu]", "allow: [eu"), "p.yaml:9:12: not valid YAML: expected ',' or ']'"),
    ],
)
def test_schema_errors_name_file_line_column_and_path(edit: tuple[str, str], expected: str) -> None:
    text = VALID.replace(*edit)
    assert text != VALID
    found = errors(text)
    assert any(expected in issue for issue in found), found


def test_every_problem_is_reported_at_once() -> None:
    text = VALID.replace("max_days: zero", "max_days: soon").replace("kind: Policy", "kind: Policy")
    text = text.replace("allow: [eu]", "allow: eu")
    found = errors(text)
    assert [issue.split(": ")[1] for issue in found] == [
        "spec.residency.allow",
        "spec.retention.max_days",
    ]


def test_cross_file_errors() -> None:
    other = VALID.replace("tenants: [clinic]", "tenants: [lab, clinic]")
    policy_set, issues, _ = check_sources([("a.yaml", VALID), ("b.yaml", other)], BACKENDS)
    assert policy_set is None
    assert [str(i) for i in issues] == [
        "b.yaml:4:3: metadata.id: policy id 'eu-health' is also used at a.yaml:4"
    ]
    renamed = other.replace("id: eu-health", "id: other")
    _, issues, _ = check_sources([("a.yaml", VALID), ("b.yaml", renamed)], BACKENDS)
    assert [str(i) for i in issues] == [
        "b.yaml:6:18: spec.tenants[1]: tenant 'clinic' is already bound to policy 'eu-health' "
        "at a.yaml:6; a tenant has exactly one policy"
    ]
    header = "apiVersion: policy.owngate.dev/v1\nkind: PolicySet\nmetadata: {id: s}\n"
    _, issues, _ = check_sources(
        [("a.yaml", VALID + "---\n" + header + "---\n" + header)], BACKENDS
    )
    assert [str(i) for i in issues] == [
        "a.yaml:21:1: kind: a second PolicySet document (first at a.yaml:16)"
    ]
    _, issues, _ = check_sources([("a.yaml", header)], BACKENDS)
    assert [i.message for i in issues] == ["no Policy documents: every tenant would be denied"]
    _, issues, _ = check_sources([("a.yaml", "# nothing\n")], BACKENDS)
    assert [i.message for i in issues] == ["the file is empty"]


def test_files_and_directories(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "a.yaml").write_text(VALID)
    (tmp_path / "sub" / "b.yml").write_text(
        VALID.replace("eu-health", "b").replace("[clinic]", "[lab]")
    )
    (tmp_path / "tests" / "cases.yaml").write_text(
        "apiVersion: policy.owngate.dev/v1\nkind: PolicyTest\n"
    )  # not a policy: skipped
    (tmp_path / "README.md").write_text("# not yaml\n")
    policy_set = load_policies([tmp_path], BACKENDS)
    assert policy_set.policy_ids() == ("b", "eu-health")
    assert policy_set.tenants() == {"clinic", "lab"}
    with pytest.raises(PolicyError) as info:
        load_policies([tmp_path / "missing", tmp_path / "tests"], BACKENDS)
    messages = [str(issue) for issue in info.value.issues]
    assert messages[0] == f"{tmp_path / 'missing'}: no such file or directory"
    assert "kind: this is a test case file" in messages[1]
    empty = tmp_path / "empty"
    empty.mkdir()
    _, issues, _ = check_policies([empty], BACKENDS)
    assert [i.message for i in issues] == ["no *.yaml files"]
    (tmp_path / "sub" / "b.yml").write_text(VALID.replace("zero", "soon"))
    with pytest.raises(PolicyError) as info:
        load_policies([tmp_path], BACKENDS)
    assert [i.path for i in info.value.issues] == ["spec.retention.max_days"]
    assert "1 problem(s)" in str(info.value)


REORDERED = """\
# the same policy: other key order, flow style, comments, list order and case
kind: Policy
spec:
  fallback: {to: [{backend: AZURE-EU}], mode: when_private_unavailable}
  retention: {training: false, max_days: zero}
  residency: {deny: [], allow: [EU, eu]}
  tenants: [clinic]
metadata: {description: "words do not change decisions", id: eu-health}
apiVersion: policy.owngate.dev/v1
"""


def digest(*texts: str) -> str:
    return parse_policies([(f"{i}.yaml", t) for i, t in enumerate(texts)], BACKENDS).digest


def test_digest_ignores_formatting_and_order() -> None:
    assert digest(VALID) == digest(REORDERED)
    other = VALID.replace("eu-health", "lab").replace("[clinic]", "[lab]")
    assert digest(VALID, other) == digest(other, VALID) == digest(VALID + "---\n" + other)


@pytest.mark.parametrize(
    "edit",
    [
        ("allow: [eu]", "allow: [eu, ch]"),
        ("max_days: zero", "max_days: 0"),
        ("tenants: [clinic]", "tenants: [clinic, lab]"),
        ("backend: azure-eu", "provider: azure"),
        ("id: eu-health", "id: eu-health\n  version: '2'"),
        (
            "mode: when_private_unavailable",
            "mode: when_private_saturated\n    saturation_threshold: 2",
        ),
    ],
)
def test_digest_changes_with_meaning(edit: tuple[str, str]) -> None:
    assert digest(VALID) != digest(VALID.replace(*edit))


def test_fallback_order_is_part_of_the_digest() -> None:
    two = VALID.replace("- backend: azure-eu", "- backend: azure-eu\n      - backend: openai")
    swapped = VALID.replace("- backend: azure-eu", "- backend: openai\n      - backend: azure-eu")
    assert digest(two) != digest(swapped)


def test_digest_is_sha256_of_the_canonical_document() -> None:
    policy_set = parse_policies([("p.yaml", VALID)], BACKENDS)
    document = policy_set.document()
    assert policy_set.digest == "sha256:" + hashlib.sha256(canonical_json(document)).hexdigest()
    assert document["policies"][0]["residency"] == {"allow": ["eu"], "deny": []}
    assert "eu-west-1" in document["jurisdictions"]["eu"]  # pins what `eu` meant
    assert "description" not in document["policies"][0]


def test_check_warnings() -> None:
    text = (
        VALID.replace("allow: [eu]", "allow: [eu, ch]")
        .replace(
            "  tenants: [clinic]\n", "  tenants: [clinic, ghost]\n  providers: {deny: [opnai]}\n"
        )
        .replace(
            "- backend: azure-eu",
            "- backend: azure-eu\n      - backend: gpu\n      - provider: nobody",
        )
        + "  data_classes:\n    phi:\n      fallback:\n        mode: when_private_saturated\n"
        "        saturation_threshold: 3\n"
    )
    assert_prefixes(
        warnings(text, tenants=("clinic", "lonely")),
        "p0.yaml:6:21: spec.tenants[1]: tenant 'ghost' is not defined in gw.yaml",
        "p0.yaml:9:17: spec.residency.allow[1]: 'ch' matches no configured backend region "
        "(regions: eu-west-1, us, westeurope)",
        "p0.yaml:7:22: spec.providers.deny[0]: 'opnai' matches no configured provider",
        "p0.yaml:16:9: spec.fallback.to[1]: matches only private backends",
        "p0.yaml:17:9: spec.fallback.to[2]: matches no configured backend",
        "p0.yaml:21:9: spec.data_classes.phi.fallback.mode: is looser than the policy's fallback "
        "(when_private_unavailable); a data class only tightens",
        "gw.yaml: tenants.lonely: has no policy: deny by default",
    )


def test_check_warns_about_rules_that_leave_nothing() -> None:
    nobody = VALID.replace("  tenants: [clinic]\n", "")
    nothing = VALID.replace("eu-health", "nothing").replace("allow: [eu]", "allow: []")
    nothing = nothing.replace("[clinic]", "[other]")
    no_fallback = VALID.replace("eu-health", "nofb").replace("[clinic]", "[x]")
    no_fallback = no_fallback.replace("- backend: azure-eu", "- backend: openai")
    found = warnings(nobody, nothing, no_fallback)
    assert_prefixes(
        found,
        "p0.yaml:5:1: spec.tenants: binds no tenants: this policy applies to nobody",
        "p1.yaml:5:1: spec: no configured backend complies with this policy",
        "p2.yaml:11:3: spec.fallback: fallback is allowed (when_private_unavailable) but no "
        "configured hosted backend complies with this policy",
    )


def test_issue_rendering() -> None:
    assert str(PolicyIssue("f.yaml", 3, 7, "spec.x", "bad")) == "f.yaml:3:7: spec.x: bad"
    assert str(PolicyIssue("f.yaml", None, None, "", "bad")) == "f.yaml: bad"


DEFAULTS = VALID.replace("  tenants: [clinic]\n", "  tenants: [clinic, lab]\n") + (
    "  data_classes:\n"
    "    phi:\n"
    "      fallback: {mode: never}\n"
    "  default_data_class: phi\n"
    "  default_data_class_by_tenant:\n"
    "    lab: phi\n"
)


def test_default_data_classes_load_and_change_the_digest() -> None:
    with_default = parse_policies([("p.yaml", DEFAULTS)], BACKENDS)
    assert with_default.compiled("eu-health").default_for("lab") == (
        "phi",
        "eu-health/default_data_class_by_tenant.lab",
    )
    without = DEFAULTS.replace("  default_data_class: phi\n", "")
    assert parse_policies([("p.yaml", without)], BACKENDS).digest != with_default.digest


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            ("default_data_class: phi", "default_data_class: pii"),
            "p.yaml:18:3: spec.default_data_class: default data class 'pii' is not defined "
            "in spec.data_classes (defined: phi)",
        ),
        (
            ("    lab: phi", "    lab: secret"),
            "p.yaml:20:5: spec.default_data_class_by_tenant.lab: default data class 'secret' "
            "is not defined in spec.data_classes (defined: phi)",
        ),
        (
            ("    lab: phi", "    other: phi"),
            "p.yaml:20:5: spec.default_data_class_by_tenant.other: tenant 'other' is not "
            "among this policy's tenants",
        ),
        (
            ("default_data_class: phi", "default_data_class: PHI"),
            "p.yaml:18:3: spec.default_data_class: String should match pattern",
        ),
    ],
)
def test_a_default_data_class_must_be_defined(edit: tuple[str, str], expected: str) -> None:
    found = errors(DEFAULTS.replace(*edit))
    assert len(found) == 1 and found[0].startswith(expected), found


@pytest.mark.parametrize(
    "version",
    [
        '"3\\e[2K\\rok"',  # YAML's escapes: ESC and CR in a double-quoted string
        '"4\\u202e"',
        '"v1 beta"',
        '" 1"',
        '""',
        "-1",
        '"' + "1" * 65 + '"',
    ],
)
def test_a_version_is_a_bounded_plain_name(version: str) -> None:
    """It reaches every record, a metric label and the logs: refused, with file and line
    and without quoting it back, unless it is 1-64 of letters, digits and `._:+-`."""
    text = VALID.replace("id: eu-health", f"id: eu-health\n  version: {version}")
    found = errors(text)
    assert_prefixes(found, "p.yaml:5:3: metadata.version: version is 1-64 letters, digits")
    assert "\x1b" not in found[0] and "\u202e" not in found[0]


@pytest.mark.parametrize(
    ("version", "loaded"),
    [("'3'", "3"), ("2025-06-01", "2025-06-01"), ("7", "7"), ("v1.2.0+build_5", "v1.2.0+build_5")],
)
def test_a_plain_version_loads(version: str, loaded: str) -> None:
    text = VALID.replace("id: eu-health", f"id: eu-health\n  version: {version}")
    assert parse_policies([("p.yaml", text)], BACKENDS).compiled("eu-health").version == loaded
