"""A double-quoted YAML string may spell a character as a numeric escape (`"\\x2a"`,
`"\\u0061"`, `"\\U0000002a"`): a review reads the escape text, the loader the character.
`residency: {allow: ["\\x2a"]}` loaded as `allow: ["*"]` (everywhere, a US provider
admitted) while it reads as an odd literal that matches nothing; a tenant bound as
`"\\x61cme"` is found by no `grep acme` over the policies. Such an escape of a printable
ASCII character is an error naming the file, line and column, in a value or a key; the
named escapes a value may need (`\\n` in a description, `\\\\` for a backslash) still load."""

from __future__ import annotations

import pytest

from gateway.policy import BackendFacts, check_sources, parse_policies

M = frozenset({"m"})
BACKENDS = (
    BackendFacts("gpu", "private", "vllm", "own", "eu-west-1", "own", 0, True, False, M),
    BackendFacts("openai", "hosted", "hosted", "openai", "us", "openai", 30, False, False, M),
)
POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: p, description: "DESCRIPTION"}
spec:
  tenants: [TENANT]
  residency: {allow: [ALLOW]}
  retention: {max_days: any, training: true}
  fallback: {mode: when_private_unavailable, to: [{provider: "*"}]}
"""


def _policy(allow: str = '"eu"', tenant: str = "t", description: str = "d") -> str:
    return (
        POLICY.replace("ALLOW", allow).replace("TENANT", tenant).replace("DESCRIPTION", description)
    )


@pytest.mark.parametrize(
    ("text", "where", "escape"),
    [
        (_policy(allow='"\\x2a"'), "p.yaml:6:23", "\\x2a"),  # `*`: everywhere
        (_policy(allow='"\\u002a"'), "p.yaml:6:23", "\\u002a"),
        (_policy(allow='"\\U0000002a"'), "p.yaml:6:23", "\\U0000002a"),
        (_policy(allow='"e\\x75"'), "p.yaml:6:23", "\\x75"),  # `eu`, written to hide it
        (_policy(tenant='"\\x74"'), "p.yaml:5:13", "\\x74"),  # the tenant `t`
        (_policy().replace("  residency", '  "resid\\x65ncy"'), "p.yaml:6:3", "\\x65"),
    ],
)
def test_an_escape_of_a_printable_ascii_character_is_an_error(
    text: str, where: str, escape: str
) -> None:
    policy_set, errors, _warnings = check_sources([("p.yaml", text)], BACKENDS, ("t",))
    assert policy_set is None, "loaded; expected it refused"
    problems = [str(e) for e in errors if "stands for" in str(e)]
    assert len(problems) == 1, [str(e) for e in errors]
    assert problems[0].startswith(f"{where}:"), problems
    assert f"`{escape}`" in problems[0], problems


def test_the_escaped_allow_would_admit_everywhere_written_plainly() -> None:
    """What the escape hid: `"*"` written plainly admits the US provider `"eu"` refuses."""
    everywhere = parse_policies([("p.yaml", _policy(allow='"*"'))], BACKENDS)
    assert everywhere.decide("t", "m", None).eligible == ("gpu", "openai")
    eu = parse_policies([("p.yaml", _policy())], BACKENDS)
    assert eu.decide("t", "m", None).eligible == ("gpu",)


@pytest.mark.parametrize(
    "description",
    [
        "Line one.\\nLine two.",  # a line break: named, not a printable character
        "a \\\\x2a backslash",  # `\\` is an escaped backslash: the text `\x2a`
        "caf\\u00e9",  # not ASCII: left to what a description may hold
        "tab\\there",
    ],
)
def test_escapes_that_stand_for_no_printable_ascii_character_still_load(description: str) -> None:
    policy_set = parse_policies([("p.yaml", _policy(description=description))], BACKENDS)
    assert policy_set.decide("t", "m", None).eligible == ("gpu",)


@pytest.mark.parametrize(
    ("text", "where", "shown"),
    [
        # `acme`, which no `grep acme` finds: an escaped line break joins `a` and `cme`
        (_policy(tenant='"a\\\n    cme"'), "p.yaml:5:13", "`a\\`"),
        (_policy(allow='"e\\\n    u"'), "p.yaml:6:23", "`e\\`"),
        (_policy(allow='"e\\\n    u"').replace("\n", "\r\n"), "p.yaml:6:23", "`e\\`"),
        (_policy(description="a\\/b"), "p.yaml:3:19", "`\\/`"),  # `/` as a named escape
        (_policy(allow='"e\\ u"'), "p.yaml:6:23", "`\\ `"),
    ],
)
def test_a_named_escape_or_an_escaped_line_break_that_hides_text_is_an_error(
    text: str, where: str, shown: str
) -> None:
    """The other escapes that load a printable ASCII text a review does not read: `\\/`
    and `\\ ` (as `\\x2f`, `\\x20`), and a line ending in `\\` after a letter, which the
    loader joins to the next line with no space (`"a\\` / `cme"` is `acme`)."""
    policy_set, errors, _warnings = check_sources(
        [("p.yaml", text)], BACKENDS, ("t", "acme", "a cme")
    )
    assert policy_set is None, "loaded; expected it refused"
    problems = [str(e) for e in errors if shown in str(e)]
    assert len(problems) == 1, [str(e) for e in errors]
    assert problems[0].startswith(f"{where}:"), problems


def test_a_description_broken_after_a_space_still_loads() -> None:
    """A long description broken with `\\` after a space loads as the words it shows."""
    text = _policy(description="Long text, \\\n    continued").replace(
        'description: "', 'description:\n    "'
    )
    policy_set = parse_policies([("p.yaml", text)], BACKENDS)
    assert policy_set.decide("t", "m", None).eligible == ("gpu",)
