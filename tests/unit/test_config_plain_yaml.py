"""gateway.yaml is read as the plain data it shows, as the policy files are: a backend's
declared facts (retention days, provider, region, owner) cannot read as something other
than what a reviewer sees. YAML 1.1 number forms (`010` is 8), explicit tags (`!foo 3`
crashed the loader), and text a field would convert (`days: '30'`) are config errors
naming the file, line and path; `${VAR}` may still fill in a plain number."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli.main import main
from gateway.config import ConfigError, parse_config

CONFIG = """\
listen: {{host: 127.0.0.1, port: {port}}}
backends:
  - id: gpu
    kind: vllm
    base_url: http://127.0.0.1:8001
    models: [{{name: m}}]
    region: {region}
    owner: {owner}
    retention:
      days: {days}
      zero_data_retention: {zero}
      training: {training}
"""
PLAIN = {
    "port": "9000",
    "region": "eu-west-1",
    "owner": "ml",
    "days": "10",
    "zero": "false",
    "training": "false",
}


def config(**values: str) -> str:
    return CONFIG.format(**{**PLAIN, **values})


def issues(text: str, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="gw.yaml", env=env or {})
    return [str(issue) for issue in info.value.issues]


def test_plain_values_load() -> None:
    loaded = parse_config(config(), env={})
    assert loaded.backends[0].retention.days == 10
    assert loaded.listen.port == 9000


@pytest.mark.parametrize("days", ["010", "0x1e", "1_000", "1:30", "0b1010", "-010"])
def test_a_yaml_1_1_number_form_is_refused_with_its_line(days: str) -> None:
    # `010` read as 8 passed a policy's `max_days: 9` for a backend that keeps data 10 days.
    (found,) = issues(config(days=days))
    assert found.startswith("line 10: backends[0].retention.days: write numbers in plain decimal")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("days", "!foo 3"),
        ("days", "!!int '30'"),
        ("days", "!!float 3"),
        ("days", "!!str 30"),
        ("region", "!!binary ZXU="),
        ("owner", "!custom ml"),
        ("training", "!!bool 'no'"),
        ("days", "!!python/object/apply:os.system [x]"),
    ],
)
def test_an_explicit_tag_is_a_config_error_not_a_crash(key: str, value: str) -> None:
    found = issues(config(**{key: value}))
    assert len(found) == 1
    assert "YAML tags" in found[0] and "not allowed in gateway.yaml" in found[0]
    assert found[0].startswith("line ")


def test_a_tag_on_a_mapping_or_list_is_refused() -> None:
    text = config().replace("    retention:\n", "    retention: !!omap\n", 1)
    assert any("YAML tags" in issue and "retention" in issue for issue in issues(text))
    text = config().replace("models: [{name: m}]", "models: !!set {m}")
    assert any("YAML tags" in issue and "models" in issue for issue in issues(text))


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("days", "'30'", "a number written as text"),
        ("days", '"30"', "a number written as text"),
        ("port", "'9000'", "a number written as text"),
        ("days", "yes", "true/false where a number goes"),
        ("training", "'true'", "true/false written as text"),
        ("zero", "'yes'", "true/false written as text"),
        ("zero", "1", "a number where true or false goes"),
    ],
)
def test_text_a_setting_would_convert_is_refused(key: str, value: str, expected: str) -> None:
    found = issues(config(**{key: value}))
    assert len(found) == 1 and expected in found[0], found
    assert found[0].startswith("line ")


def test_an_unquoted_yes_where_a_name_goes_says_why() -> None:
    (found,) = issues(config(region="no"))
    assert "line 7: backends[0].region" in found and "'no' for Norway" in found


def test_a_variable_may_fill_in_a_plain_number_or_true_false() -> None:
    text = config(port='"${PORT}"', days='"${DAYS}"', training="${TRAINING}")
    loaded = parse_config(text, env={"PORT": "9001", "DAYS": "12", "TRAINING": "true"})
    assert loaded.listen.port == 9001
    assert loaded.backends[0].retention.days == 12
    assert loaded.backends[0].retention.training is True


@pytest.mark.parametrize("value", ["010x", "0x1e", "1_000", " 12", "yes", "12.0"])
def test_a_variable_that_is_not_a_plain_number_is_refused(value: str) -> None:
    found = issues(config(days="${DAYS}"), env={"DAYS": value})
    assert len(found) == 1 and "backends[0].retention.days" in found[0], found


def test_a_date_stays_the_text_written() -> None:
    text = config().replace("training: false", "training: false\n      evidence: 2025-06-01")
    assert parse_config(text, env={}).backends[0].retention.evidence == "2025-06-01"


def test_config_validate_reports_a_tag_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(config(days="!foo 3"))
    assert main(["config", "validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert "line 10: backends[0].retention.days: YAML tags" in err
    assert "Traceback" not in err


def test_a_float_with_a_bare_exponent_is_refused_saying_how_to_write_it() -> None:
    # YAML 1.1 (PyYAML) reads an unquoted 1e3 as text, a YAML 1.2 tool as 1000.0: the
    # message says which form both read as the number.
    text = config().replace("port: 9000}", "port: 9000, body_timeout_s: 1e3}")
    (found,) = issues(text)
    assert "listen.body_timeout_s" in found and "1.0e+3" in found
    loaded = parse_config(text.replace("1e3", "1.0e+3"), env={})
    assert loaded.listen.body_timeout_s == 1000.0


@pytest.mark.parametrize(
    ("field", "written", "escape"),
    [
        ("region", '"\\x75s-east-1"', "\\x75"),  # `us-east-1`, where a review reads an escape
        ("owner", '"\\u006dl"', "\\u006d"),
        ("region", '"eu-west-\\U00000031"', "\\U00000031"),
    ],
)
def test_a_declared_fact_spelled_with_an_escape_of_an_ascii_character_is_an_error(
    field: str, written: str, escape: str
) -> None:
    """A numeric escape in a double-quoted value that stands for a printable ASCII
    character reads as escape text and loads as the character, as in policy files."""
    found = issues(config(**{field: written}))
    assert len(found) == 1, found
    assert f"backends[0].{field}" in found[0] and f"`{escape}`" in found[0], found


def test_a_double_quoted_fact_without_such_an_escape_loads() -> None:
    parse_config(config(region='"eu-west-1"', owner='"m\\\\l"'), source="gw.yaml", env={})


@pytest.mark.parametrize(
    ("text", "path", "shown"),
    [
        (config().replace("    region:", '    "regi\\x6fn":'), "backends[0].region", "`\\x6f`"),
        (config(region='"us-\\\n      east-1"'), "backends[0].region", "`-\\`"),
        (config(owner='"m\\/l"'), "backends[0].owner", "`\\/`"),
    ],
)
def test_a_key_or_value_that_loads_other_text_than_it_shows_is_an_error(
    text: str, path: str, shown: str
) -> None:
    """A key spelled with an escape (`"regi\\x6fn":` is `region:`), a value joined across
    lines with no space (`"us-\\` / `east-1"` is `us-east-1`) or a needless named escape
    is refused, as in policy files."""
    found = [issue for issue in issues(text) if shown in issue]
    assert len(found) == 1, issues(text)
    assert f"{path}: " in found[0], found


def test_a_secret_from_the_environment_with_escapes_loads_as_it_is() -> None:
    """The check reads the file as written: a `${VAR}` value holding `\\x41` is kept."""
    text = config(owner='"${OWNER}"')
    loaded = parse_config(text, source="gw.yaml", env={"OWNER": "m\\x6c\\/"})
    assert loaded.backends[0].owner == "m\\x6c\\/"


@pytest.mark.parametrize("tag", ["!!int", "!custom", "!!binary"])
def test_a_tagged_key_is_an_error_as_a_tagged_value_is(tag: str) -> None:
    """`!custom region: us-east-1` loaded as `region:` (the tag dropped unread), where a
    tagged value is an error; a key is a plain name, as in policy files."""
    found = issues(config().replace("    region:", f"    {tag} region:"))
    assert found == ["line 7: backends[0]: keys must be plain names"], found
