"""A key rotation keeps the key's name (docs/provenance.md, "Keys"): the log refuses, at
its open and before anything is written, a previous signing key or a retired verifier key
under another name than the signing key's, and `config validate` names it. Before, the
gateway signed under the new name, and `audit verify --key OLD --key NEW` failed every
checkpoint the renamed key signed alone (`another log's key signed it`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.api.recorder_log import open_log
from gateway.cli.main import main
from gateway.config.provenance import ProvenanceSettings
from gateway.logs import get_logger
from gateway.provenance import KeyFormatError, write_signing_key

ORIGIN = "gateway.example/log"
CONFIG = (
    "backends:\n"
    "  - {id: gpu, kind: vllm, base_url: 'http://127.0.0.1:9', models: [{name: m}],\n"
    "     region: eu-west-1, owner: me,\n"
    "     retention: {days: 0, zero_data_retention: true, evidence: own}}\n"
    "tenants: [{id: acme, models: ['*']}]\n"
    "provenance: {dir: log, origin: %s, signing_key_file: new.key, %s}\n"
)


def _keys(tmp_path: Path, new_name: str) -> str:
    """old.key named for the origin, new.key named `new_name`; the old verifier key."""
    write_signing_key(tmp_path / "new.key", new_name)
    return write_signing_key(tmp_path / "old.key", ORIGIN)


@pytest.mark.parametrize("setting", ["previous", "retired"])
def test_the_log_refuses_a_rotation_that_renames_its_key_before_it_opens(
    tmp_path: Path, setting: str
) -> None:
    old = _keys(tmp_path, "renamed.example/log")
    previous, retired = (("old.key",), ()) if setting == "previous" else ((), (old,))
    settings = ProvenanceSettings(
        dir="log",
        origin=ORIGIN,
        signing_key_file="new.key",
        previous_signing_key_files=previous,
        retired_verifier_keys=retired,
    )
    with pytest.raises(KeyFormatError, match="a key rotation keeps the key's name"):
        asyncio.run(open_log(settings, tmp_path, new_origin=False, events=get_logger("test")))
    assert not (tmp_path / "log").exists()  # refused before the log was opened


@pytest.mark.parametrize(("name", "problems"), [("renamed.example/log", 1), (ORIGIN, 0)])
def test_config_validate_names_a_renamed_key_and_passes_a_kept_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, problems: int
) -> None:
    old = _keys(tmp_path, name)
    rotation = f"previous_signing_key_files: [old.key], retired_verifier_keys: ['{old}']"
    config = tmp_path / "gateway.yaml"
    config.write_text(CONFIG % (ORIGIN, rotation))
    assert main(["config", "validate", str(config)]) == (1 if problems else 0)
    out = capsys.readouterr()
    assert (out.out + out.err).count("a key rotation keeps the key's name") == problems
