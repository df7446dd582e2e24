"""The `owngate` examples in README.md and docs/*.md that run offline in seconds run as
written and exit 0: the read-only checks (`config validate --without-secrets`, `policy
check|explain|test`) on the repository's own files, with the environment their block
exports, and docs/backend-tls.md's certificate commands in an empty directory."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.doc_commands import DocCommand, doc_commands
from tests.helpers.paths import REPO_ROOT
from tests.helpers.processes import owngate_argv


def _runs_offline(command: DocCommand) -> bool:
    """A read-only check whose files are all in the repository (not `gateway.yaml`,
    a file the reader writes)."""
    words = command.words
    read_only = words[:1] == ("policy",) or (
        words[:2] == ("config", "validate") and "--without-secrets" in words
    )
    files = [w for w in words[1:] if not w.startswith("-") and ("/" in w or w.endswith(".yaml"))]
    return (
        command.in_block
        and read_only
        and bool(files)
        and all((REPO_ROOT / name).exists() for name in files)
    )


OFFLINE = sorted(
    {
        (c.source, c.words, tuple(sorted(c.environ.items())))
        for c in doc_commands()
        if _runs_offline(c)
    }
)


def test_the_docs_show_offline_examples() -> None:
    sources = {source for source, _, _ in OFFLINE}
    assert {"README.md", "docs/deploy.md", "docs/policies.md"} <= sources


@pytest.mark.parametrize(("source", "words", "environ"), OFFLINE, ids=lambda v: str(v)[:60])
def test_an_offline_example_runs_as_written(
    source: str, words: tuple[str, ...], environ: tuple[tuple[str, str], ...]
) -> None:
    done = subprocess.run(
        owngate_argv(*words),
        cwd=REPO_ROOT,
        env={**os.environ, **dict(environ)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{source}: owngate {' '.join(words)}\n{done.stderr[-2000:]}"


def test_the_backend_certificate_commands_run_in_order(tmp_path: Path) -> None:
    """docs/backend-tls.md's block: a CA, a server certificate with facts, the gateway's
    client certificate, in a fresh directory (they write `pki/`)."""
    commands = [
        c.words
        for c in doc_commands()
        if c.source == "docs/backend-tls.md" and c.in_block and c.words[:2] == ("backend", "cert")
    ]
    assert commands[:1] == [("backend", "cert", "ca", "--out", "pki")]
    for words in commands:
        done = subprocess.run(
            owngate_argv(*words),
            cwd=tmp_path,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
            },
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"owngate {' '.join(words)}\n{done.stderr[-2000:]}"
    assert (tmp_path / "pki" / "ca.pem").is_file()
    assert (tmp_path / "pki" / "gateway.pem").is_file()


def test_the_witness_key_commands_run_in_order(tmp_path: Path) -> None:
    """docs/provenance.md's witness keys: `keys new --signing NAME --key-file witness.key`,
    then `witness vkey --key witness.key` prints the cosignature verifier key of the same
    name: another key type than the note verifier key `keys new` printed (C2SP
    tlog-cosignature's 0x04, not signed-note's Ed25519 0x01), which the page says."""
    shown = [
        c.words
        for c in doc_commands()
        if c.source == "docs/provenance.md"
        and c.in_block
        and c.words[:2] in (("keys", "new"), ("witness", "vkey"))
        and "witness.key" in c.words
    ]
    assert [w[:2] for w in shown] == [("keys", "new"), ("witness", "vkey")]
    printed = []
    for words in shown:
        done = subprocess.run(
            owngate_argv(*words),
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"owngate {' '.join(words)}\n{done.stderr[-2000:]}"
        printed.append(done.stdout.strip())
    name = "witness.example.com/w1+"
    assert printed[0].startswith(name) and printed[1].startswith(name)
    assert printed[0] != printed[1]
