"""gateway.yaml loading: strict schema, YAML paths and lines in errors, ${ENV}, key files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli.main import main
from gateway.config import ConfigError, load_config, parse_config
from gateway.provenance import Checkpoint, sign_checkpoint
from gateway.provenance.keys import write_signing_key
from gateway.provenance.testing import seeded_signer
from gateway.tenants import hash_api_key
from tests.helpers.log_capture import rendered_logs
from tests.helpers.paths import REPO_ROOT

OWNGATE = [sys.executable, "-m", "gateway"]

VALID = """\
listen: {host: 127.0.0.1, port: 9000}
backends:
  - id: gpu-a
    kind: vllm
    base_url: http://127.0.0.1:8001/
    models:
      - name: llama
        aliases: [chat]
    region: eu-west-1
    owner: ml-platform
    retention: {days: 0, zero_data_retention: true, evidence: own hardware}
  - id: openai
    kind: hosted
    provider: openai
    api_key_env: OPENAI_API_KEY
    models: [{name: gpt-4o-mini, provider_model: openai/gpt-4o-mini}]
    region: us
    owner: openai
tenants:
  - id: acme
    api_key_hashes: ["${ACME_KEY_HASH}"]
    models: [chat]
"""


def _issues(text: str, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, env=env or {})
    return [str(issue) for issue in info.value.issues]


def test_valid_config_loads_with_env_interpolation() -> None:
    key_hash = hash_api_key("og-test")
    config = parse_config(VALID, env={"ACME_KEY_HASH": key_hash})
    assert config.listen.port == 9000
    assert config.backends[0].base_url == "http://127.0.0.1:8001"  # trailing slash dropped
    assert config.tenants[0].api_key_hashes == (key_hash,)
    assert config.state.backend == "memory"


def test_every_error_is_reported_with_path_and_line() -> None:
    text = VALID.replace("kind: vllm", "kind: vllmx").replace(
        "    region: eu-west-1\n", "    region: eu-west-1\n    colour: blue\n", 1
    )
    issues = _issues(text, {"ACME_KEY_HASH": hash_api_key("k")})
    assert "line 4: backends[0].kind: Input should be" in issues[0]
    assert any(i.startswith("line 10: backends[0].colour: unknown key") for i in issues)
    assert len(issues) == 2


def test_missing_environment_variable_is_an_error_with_its_line() -> None:
    issues = _issues(VALID)
    assert issues == [
        "line 21: tenants[0].api_key_hashes[0]: environment variable ACME_KEY_HASH is not set"
    ]


def test_unset_variable_does_not_hide_other_errors() -> None:
    issues = _issues(VALID.replace("listen: {", "bogus: 1\nlisten: {"))
    assert any("environment variable ACME_KEY_HASH is not set" in i for i in issues)
    assert any(i.startswith("line 1: bogus: unknown key") for i in issues)


@pytest.mark.parametrize(
    ("url", "expected"),
    [("http://x:99999", "invalid port"), ("http://x:1/a b", "without spaces")],
)
def test_base_url_must_be_usable(url: str, expected: str) -> None:
    text = VALID.replace("http://127.0.0.1:8001/", url)
    issues = _issues(text, {"ACME_KEY_HASH": hash_api_key("k")})
    assert any(expected in issue for issue in issues), issues


def test_env_default_syntax() -> None:
    text = VALID.replace("${ACME_KEY_HASH}", "${NOPE:-" + hash_api_key("x") + "}")
    assert parse_config(text, env={}).tenants[0].api_key_hashes == (hash_api_key("x"),)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (("port: 9000", "port: 99999"), "listen.port: Input should be less than or equal"),
        (("http://127.0.0.1:8001/", "ftp://x"), "backends[0].base_url: base_url must be"),
        (("- id: openai", "- id: gpu-a"), "duplicate backends id 'gpu-a'"),
        (("api_key_env: OPENAI_API_KEY", "api_key: sk-plain"), "never from the config file"),
        (
            ("    region: us\n", "    region: us\n    region: eu\n"),
            "line 18: backends[1].region: duplicate key",
        ),
    ],
)
def test_semantic_errors(edit: tuple[str, str], expected: str) -> None:
    issues = _issues(VALID.replace(*edit), {"ACME_KEY_HASH": hash_api_key("k")})
    assert any(expected in issue for issue in issues), issues


def test_a_tenant_listing_a_model_no_backend_serves_loads_with_a_warning(
    tmp_path: Path,
) -> None:
    """A tenant's `models` naming what no backend serves (a typo, or a model taken off
    its backends) denies the tenant nothing it had: it is a warning naming it, escaped,
    never an error, or a reload taking a model off its backends failed and the model
    went on being served (tests/integration/test_reload_tenants.py)."""
    path = tmp_path / "gateway.yaml"
    path.write_text(VALID.replace("models: [chat]", 'models: [chat, "gone\\x1b[2J"]'))
    with rendered_logs("console", "warning") as logs:
        config = load_config(path, env={"ACME_KEY_HASH": hash_api_key("k")})
    assert config.tenants[0].models == ("chat", "gone\x1b[2J")
    text = logs.getvalue()
    assert "tenants list models no backend serves" in text
    assert "acme: gone" in text and "x1b[2J" in text
    assert [c for c in text if not c.isprintable() and c != "\n"] == []


def test_raw_keys_are_refused_in_place_of_hashes() -> None:
    issues = _issues(VALID, {"ACME_KEY_HASH": "og-raw-key"})
    assert any("never raw keys" in issue for issue in issues)


@pytest.mark.parametrize(
    ("admin", "expected"),
    [
        (
            "admin: {token_hashes: [D], tokens: [{hash: D, role: auditor}]}",
            "admin.token_hashes[0] (full access) and admin.tokens[0] (auditor)",
        ),
        (
            "admin: {tokens: [{hash: E, role: operator}, {hash: D, role: auditor},"
            " {hash: D, role: security}]}",
            "admin.tokens[1] (auditor) and admin.tokens[2] (security)",
        ),
    ],
)
def test_an_admin_token_digest_under_two_roles_is_refused(admin: str, expected: str) -> None:
    """One token in two roles (a pasted digest) acted in whichever came first, silently:
    refused, naming both entries and never the digest."""
    digest, other = hash_api_key("og-admin-a"), hash_api_key("og-admin-b")
    text = VALID + admin.replace("D", f'"{digest}"').replace("E", f'"{other}"') + "\n"
    issues = _issues(text, {"ACME_KEY_HASH": hash_api_key("k")})
    assert any(expected in issue for issue in issues), issues
    assert not any(digest[7:] in issue for issue in issues)


def test_invalid_yaml_reports_its_line() -> None:
    issues = _issues("backends:\n  - id: [unclosed\n")
    assert "not valid YAML" in issues[0] and issues[0].startswith("line ")


def _alias_bomb(depth: int) -> str:
    """YAML of `depth` levels of aliases, each naming the one before ten times."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, depth)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (_alias_bomb(5), "expands to more than"),  # 230 bytes, 10^5 values (9 levels: 10^9)
        ("a: " + "[" * 5000 + "]" * 5000, "nests too deep"),  # was a RecursionError
    ],
)
def test_a_config_that_explodes_is_refused(text: str, expected: str) -> None:
    # The admin API validates a client's candidate config with this (config/validate).
    issues = _issues(text)
    assert len(issues) == 1 and expected in issues[0]


def test_keys_new_stores_only_the_hash(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        VALID.replace('api_key_hashes: ["${ACME_KEY_HASH}"]', "api_key_hashes: []")
        + "keys_file: keys.yaml\n"
    )
    done = subprocess.run(
        [*OWNGATE, "keys", "new", "--tenant", "acme", "--config", str(config)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    key = done.stdout.strip()
    assert key.startswith("og-") and len(key) > 40
    stored = (tmp_path / "keys.yaml").read_text()
    assert key not in stored
    assert hash_api_key(key) in stored
    loaded = load_config(config, env={})
    assert loaded.tenants[0].api_key_hashes == (hash_api_key(key),)


def test_keys_new_refuses_unknown_tenant(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(VALID.replace("${ACME_KEY_HASH}", hash_api_key("k")) + "keys_file: k.yaml\n")
    done = subprocess.run(
        [*OWNGATE, "keys", "new", "--tenant", "nobody", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "not defined" in done.stderr
    assert not (tmp_path / "k.yaml").exists()


def test_config_validate_command_exit_codes(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(VALID.replace("${ACME_KEY_HASH}", hash_api_key("k")))
    bad = tmp_path / "bad.yaml"
    bad.write_text(VALID.replace("kind: vllm", "kind: nope"))
    ok = subprocess.run(
        [sys.executable, "-m", "gateway", "config", "validate", str(good)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OPENAI_API_KEY": "sk-test"},  # the hosted backend's key
    )
    assert ok.returncode == 0, ok.stderr
    assert "ok (2 backends" in ok.stdout
    fail = subprocess.run(
        [sys.executable, "-m", "gateway", "config", "validate", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert fail.returncode == 1
    assert f"{bad}:line 4: backends[0].kind" in fail.stderr


@pytest.mark.parametrize("verb", [["config", "validate"], ["serve", "--config"]])
def test_a_refused_config_never_prints_what_a_variable_filled_in(
    tmp_path: Path, verb: list[str]
) -> None:
    """`owngate config validate` and `serve` printed a problem quoting a value `${VAR}`
    filled in as it came (a base_url's bad port: `'<value>'`): the secret of the
    environment in a CI or pod log. It is written as `${VAR}`, escaped forms included."""
    secret = "Sec'ret\\Pw9x"  # a quote and a backslash: `repr` escapes them
    text = VALID.replace("http://127.0.0.1:8001/", '"http://127.0.0.1:${DB_PASSWORD}/"')
    config = tmp_path / "gateway.yaml"
    config.write_text(text.replace("${ACME_KEY_HASH}", hash_api_key("k")))
    run = subprocess.run(
        [*OWNGATE, *verb, str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DB_PASSWORD": secret, "OPENAI_API_KEY": "sk-test"},
    )
    assert run.returncode != 0
    assert "backends[0].base_url" in run.stderr and "${DB_PASSWORD}" in run.stderr, run.stderr
    assert "Pw9x" not in run.stdout + run.stderr, run.stderr


@pytest.mark.parametrize("verb", [["config", "validate"], ["serve", "--config"]])
def test_a_config_refused_at_assembly_never_prints_what_a_variable_filled_in(
    tmp_path: Path, verb: list[str]
) -> None:
    """Problems found past the loader, assembling the gateway (a policy file, a signing
    key file, a key variable's name), quoted the value a `${VAR}` filled in, in `config
    validate` and `serve` alike. It is written as `${VAR}`, escaped forms included."""
    secret = "Sec'ret\\Pw9x"
    text = VALID.replace("${ACME_KEY_HASH}", hash_api_key("k"))
    text = text.replace("api_key_env: OPENAI_API_KEY", "api_key_env: KEY_${DB_PASSWORD}")
    text += "policy: {paths: ['/nonexistent/${DB_PASSWORD}/policy.yaml']}\n"
    config = tmp_path / "gateway.yaml"
    config.write_text(text)
    run = subprocess.run(
        [*OWNGATE, *verb, str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DB_PASSWORD": secret},
    )
    assert run.returncode != 0
    printed = run.stdout + run.stderr
    assert "/nonexistent/${DB_PASSWORD}/policy.yaml" in printed, printed
    assert "KEY_${DB_PASSWORD}" in printed, printed
    assert "Pw9x" not in printed, printed


def test_a_keys_file_problem_never_quotes_what_a_variable_filled_in(tmp_path: Path) -> None:
    """The keys file is read past `parse_config`: a keys file path of `${VAR}` that was
    refused was named as it came, the secret in it."""
    secret = "Sec'ret\\Pw9x"
    config = tmp_path / "gateway.yaml"
    text = VALID.replace("${ACME_KEY_HASH}", hash_api_key("k"))
    config.write_text(text + "keys_file: keys-${DB_PASSWORD}.yaml\n")
    (tmp_path / f"keys-{secret}.yaml").write_text("tenants: [\n")
    with pytest.raises(ConfigError) as info:
        load_config(config, env={"DB_PASSWORD": secret})
    assert "keys-${DB_PASSWORD}.yaml" in str(info.value) and "Pw9x" not in str(info.value)


def test_shipped_example_configs_validate() -> None:
    config = load_config(REPO_ROOT / "deploy" / "gateway.example.yaml", env={})
    assert {b.kind for b in config.backends} == {"vllm", "llamacpp", "hosted"}


REFUSED = """\
backends:
  - id: gpu
    kind: vllm
    base_url: http://127.0.0.1:1
    models: [{name: llama}]
    region: eu-west-1
    owner: ml
    retention: {days: 0, zero_data_retention: true}
  - id: anthropic
    kind: hosted
    provider: anthropic
    api_key_env: OG_TEST_ANTHROPIC_KEY
    models: [{name: claude, provider_model: anthropic/claude-3-5-haiku-latest}]
    region: us
    owner: anthropic
  - id: mistral
    kind: hosted
    provider: mistral
    api_key_env: OG_TEST_MISTRAL_KEY
    models: [{name: mistral-small, provider_model: mistral/mistral-small-latest}]
    region: fr
    owner: mistral
policy: {paths: [policies]}
provenance: {dir: log, origin: example.com/log, signing_key_file: log.key}
tenants:
  - {id: acme, models: ["*"]}
"""

POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: acme}
spec:
  tenants: [acme]
  residency: {allow: ["*"]}
  retention: {max_days: 30}
  fallback: {mode: when_private_unavailable, to: [{provider: "*"}]}
"""


def _validate(*argv: str) -> int:
    code = main(["config", "validate", *argv])
    return code


@pytest.fixture
def refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config that loads, but that `owngate serve` refuses: two hosted key variables
    unset, a policy file with an error, no signing key."""
    for name in (
        "OG_TEST_ANTHROPIC_KEY",
        "OG_TEST_MISTRAL_KEY",
        "OWNGATE_VALIDATE_WITHOUT_SECRETS",
        "OWNGATE_WORKERS",
    ):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "acme.yaml").write_text(POLICY.replace("max_days: 30", "max_days: -1"))
    path = tmp_path / "gateway.yaml"
    path.write_text(REFUSED)
    return path


def _fix_policy_and_key_variables(refused: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Put right what `refused` has wrong but its missing signing key."""
    (refused.parent / "policies" / "acme.yaml").write_text(POLICY)
    monkeypatch.setenv("OG_TEST_ANTHROPIC_KEY", "sk-a")
    monkeypatch.setenv("OG_TEST_MISTRAL_KEY", "sk-m")


def test_config_validate_names_every_problem_serve_refuses(
    refused: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _validate(str(refused)) == 1
    err = capsys.readouterr().err
    assert f"{refused}: owngate serve would refuse this config (4 problem(s)):" in err
    assert (
        "  backend 'anthropic': environment variable OG_TEST_ANTHROPIC_KEY (api_key_env) is "
        "not set or empty"
    ) in err
    assert "  backend 'mistral': environment variable OG_TEST_MISTRAL_KEY" in err
    policy = refused.parent / "policies" / "acme.yaml"
    assert f"  invalid trust policy: {policy}:7:15: spec.retention.max_days: max_days is" in err
    assert f"  signing key {refused.parent / 'log.key'}: cannot read" in err
    # serve refuses it too, naming every key variable at once
    from gateway.app import AssemblyError, create_app

    with pytest.raises(AssemblyError) as info:
        create_app(load_config(refused, env={}), environ={}, config_dir=refused.parent)
    assert len(info.value.problems) == 3  # the log is opened later, in the lifespan
    # Fixed, it passes; and validating wrote nothing (no log directory).
    _fix_policy_and_key_variables(refused, monkeypatch)
    write_signing_key(refused.parent / "log.key", "example.com/log")
    assert _validate(str(refused)) == 0
    assert f"{refused}: ok (3 backends, 3 models, 1 tenants)" in capsys.readouterr().out
    assert not (refused.parent / "log").exists()


def test_serve_refuses_a_provider_url_variable_that_would_redirect_a_hosted_backend(
    refused: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fix_policy_and_key_variables(refused, monkeypatch)
    write_signing_key(refused.parent / "log.key", "example.com/log")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:1")  # no base_url in config
    assert _validate(str(refused)) == 1
    err = capsys.readouterr().err
    assert "  backend 'anthropic': environment variable ANTHROPIC_BASE_URL would redirect" in err
    assert "backend 'mistral'" not in err


def test_config_validate_checks_the_log_without_opening_it(
    refused: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fix_policy_and_key_variables(refused, monkeypatch)
    key = refused.parent / "log.key"
    write_signing_key(key, "example.com/log")
    key.chmod(0o644)
    history = refused.parent / "log" / "checkpoints"
    history.mkdir(parents=True)
    (history / f"{5:020d}").write_text("other.example/log\n5\nroot\n\nsignature\n")
    assert _validate(str(refused)) == 1
    err = capsys.readouterr().err
    assert "readable by group or others (mode 644); chmod 600 it" in err
    assert f"provenance.dir {refused.parent / 'log'} holds the log 'other.example/log'" in err
    assert sorted(p.name for p in (refused.parent / "log").iterdir()) == ["checkpoints"]


def test_config_validate_finds_a_log_directory_serve_would_refuse_to_fork(
    refused: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The high-water file beside the log directory records a checkpoint of size 7; the
    # directory holds nothing: `serve` would exit 3 (LogForkError), so validate fails too.
    _fix_policy_and_key_variables(refused, monkeypatch)
    write_signing_key(refused.parent / "log.key", "example.com/log")
    signed = sign_checkpoint(
        Checkpoint("example.com/log", 7, bytes(32)), [seeded_signer("example.com/log")]
    )
    (refused.parent / "log.high-water").write_bytes(signed)
    assert _validate(str(refused)) == 1
    err = capsys.readouterr().err
    assert "provenance.high_water_file: " in err
    assert "already signed a checkpoint of size 7" in err and "--new-log-origin" in err
    assert not (refused.parent / "log").exists()  # validating wrote nothing


def test_config_validate_checks_each_workers_high_water_file(
    refused: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `serve --workers 2` keeps worker i's log in log/worker-<i> and its high-water file
    # beside the configured directory (log.high-water-worker-<i>). Both workers' files
    # record size 7 and the directory was emptied: each worker would exit 3.
    _fix_policy_and_key_variables(refused, monkeypatch)
    write_signing_key(refused.parent / "log.key", "example.com/log")
    for index in (1, 2):
        origin = f"example.com/log/worker-{index}"
        signed = sign_checkpoint(Checkpoint(origin, 7, bytes(32)), [seeded_signer(origin)])
        (refused.parent / f"log.high-water-worker-{index}").write_bytes(signed)
    assert _validate(str(refused)) == 0  # one process: its own log.high-water, none yet
    capsys.readouterr()
    assert _validate("--workers", "2", str(refused)) == 1
    err = capsys.readouterr().err
    assert "(2 problem(s))" in err
    for index in (1, 2):
        assert f"{refused.parent / 'log' / f'worker-{index}'} holds no log" in err
        assert f"log.high-water-worker-{index}" in err
    monkeypatch.setenv("OWNGATE_WORKERS", "2")  # as `serve` reads it
    assert _validate(str(refused)) == 1
    assert _validate("--workers", "0", str(refused)) == 2
    assert not (refused.parent / "log").exists()  # validating wrote nothing


def test_config_validate_without_secrets_skips_what_only_the_server_has(
    refused: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """For a config whose secrets a pod mounts: unset key variables and the signing key
    are not this machine's; the policies still are."""
    assert _validate("--without-secrets", str(refused)) == 1
    err = capsys.readouterr().err
    assert "(1 problem(s))" in err and "invalid trust policy" in err
    (refused.parent / "policies" / "acme.yaml").write_text(POLICY)
    monkeypatch.setenv("OWNGATE_VALIDATE_WITHOUT_SECRETS", "1")
    assert _validate(str(refused)) == 0
    monkeypatch.setenv("OG_TEST_MISTRAL_KEY", "")  # set here but empty: still counted as set
    assert _validate(str(refused)) == 0


def test_keys_new_signing_writes_a_private_key_and_prints_the_verifier(tmp_path: Path) -> None:
    key_file = tmp_path / "log.key"
    done = subprocess.run(
        [*OWNGATE, "keys", "new", "--signing", "gw-1.example/log", "--key-file", str(key_file)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    vkey = done.stdout.strip()
    assert vkey.startswith("gw-1.example/log+")
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert vkey not in key_file.read_text()  # the private file holds the private key
    again = subprocess.run(
        [*OWNGATE, "keys", "new", "--signing", "x", "--key-file", str(key_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 1
