"""Secret files against a careless operator or another local user: a signing key file that
is damaged, huge, binary or not a file is refused with an error naming the file and never
quoting it; a link planted in the log directory never makes a log write land elsewhere."""

from __future__ import annotations

import base64
import errno
import os
import re
import threading
from pathlib import Path

import pytest

from gateway.cli.main import main
from gateway.provenance import KeyFormatError, load_signer, write_signing_key
from gateway.provenance.files import write_files_atomically
from gateway.provenance.formats.wal import segment_path
from gateway.provenance.writer.preflight import preflight
from gateway.provenance.writer.segment_writer import SegmentWriter


def _secret_of(path: Path) -> str:
    """The base64 field of a signer key file (algorithm byte and seed): the fifth `+`
    field, as base64 holds `+` itself (split from the right, about one key in fifty gave
    a short or empty tail, found in any text)."""
    secret = path.read_text().strip().split("+", 4)[4]
    assert len(base64.b64decode(secret)) == 33
    return secret


def test_the_secret_read_back_is_the_whole_field_when_base64_holds_a_plus(
    tmp_path: Path,
) -> None:
    key = tmp_path / "log.key"
    write_signing_key(key, "example.com/log", random=lambda n: b"\xfb" * n)
    field = key.read_text().strip().removeprefix("PRIVATE+KEY+example.com/log+").split("+", 1)
    assert "+" in field[1]  # the case: a `+` inside the base64
    assert _secret_of(key) == field[1]


def _private(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def test_a_damaged_key_file_is_refused_without_quoting_the_secret(tmp_path: Path) -> None:
    # A seed whose base64 has '+' in it: a key line that lost its name field splits the
    # secret at that '+', and its first part is read as the key id.
    seed = next(s for s in (bytes([i]) * 32 for i in range(256)) if "+" in _b64(s)[4:])
    key = tmp_path / "log.key"
    write_signing_key(key, "example.com/log", random=lambda n: seed[:n])
    line = key.read_text().strip()
    hex_id, secret = line.split("+", 4)[3:]
    assert "+" in secret
    damaged = _private(tmp_path / "damaged.key", f"PRIVATE+KEY+{hex_id}+{secret}\n".encode())
    with pytest.raises(KeyFormatError) as info:
        load_signer(damaged)
    message = str(info.value)
    assert str(damaged) in message
    assert secret.split("+")[0] not in message  # what was read as the key id


def _b64(seed: bytes) -> str:
    return base64.b64encode(b"\x01" + seed).decode()


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"\xff\xfe\x00binary\n", "not UTF-8 text"),
        (b"PRIVATE+KEY+" + b"A" * 10_000_000, "larger than a signing key file"),
        (b"", "must start with PRIVATE+KEY+"),
    ],
    ids=["binary", "huge", "empty"],
)
def test_a_key_file_that_is_not_a_key_is_a_key_format_error_naming_it(
    tmp_path: Path, content: bytes, why: str
) -> None:
    key = _private(tmp_path / "log.key", content)
    with pytest.raises(KeyFormatError, match=re.escape(why)) as info:
        load_signer(key)
    assert str(key) in str(info.value)
    [problem] = preflight("example.com/log", [key], directory=None)
    assert problem.startswith(f"signing key {key}") and why in problem


def test_a_fifo_named_as_the_key_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "log.key"
    os.mkfifo(fifo, 0o600)
    raised: list[Exception] = []

    def load() -> None:
        try:
            load_signer(fifo)
        except (KeyFormatError, OSError) as exc:  # handed to the test below
            raised.append(exc)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    loader.join(timeout=30)
    if loader.is_alive():  # waiting on the FIFO: release it, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        loader.join(timeout=30)
        pytest.fail("load_signer waited for a writer to open the FIFO")
    assert len(raised) == 1 and isinstance(raised[0], KeyFormatError)
    assert "not a regular file" in str(raised[0])


def test_a_symlinked_key_file_still_loads(tmp_path: Path) -> None:
    """Kubernetes mounts secrets as symlinks: following them stays allowed."""
    key = tmp_path / "data" / "log.key"
    key.parent.mkdir()
    vkey = write_signing_key(key, "example.com/log")
    (tmp_path / "log.key").symlink_to(key)
    assert load_signer(tmp_path / "log.key").vkey == vkey


def test_a_temporary_name_planted_as_a_link_never_redirects_a_log_write(
    tmp_path: Path,
) -> None:
    """Another user who can write in the log directory plants `checkpoint.tmp` pointing at
    the signing key: the checkpoint must not be written into the key."""
    key = tmp_path / "log.key"
    write_signing_key(key, "example.com/log")
    before = key.read_bytes()
    log = tmp_path / "log"
    log.mkdir()
    (log / "checkpoint.tmp").symlink_to(key)
    write_files_atomically([(log / "checkpoint", b"example.com/log\n1\n")], root=log)
    assert key.read_bytes() == before
    assert not (log / "checkpoint").is_symlink()
    assert (log / "checkpoint").read_bytes() == b"example.com/log\n1\n"
    assert _secret_of(key) not in (log / "checkpoint").read_text()


def test_a_temporary_file_left_by_a_crash_is_replaced(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.tmp").write_bytes(b"half a checkpoint from before a crash")
    write_files_atomically([(tmp_path / "checkpoint", b"whole\n")], root=tmp_path)
    assert (tmp_path / "checkpoint").read_bytes() == b"whole\n"
    assert not (tmp_path / "checkpoint.tmp").exists()


def test_a_segment_name_planted_as_a_link_is_refused_not_written_through(
    tmp_path: Path,
) -> None:
    """The next WAL segment's name is predictable: a link planted there must make the
    append fail, not truncate and overwrite what it points at."""
    key = tmp_path / "log.key"
    write_signing_key(key, "example.com/log")
    before = key.read_bytes()
    wal = tmp_path / "wal"
    wal.mkdir()
    planted = segment_path(wal, 0)
    planted.symlink_to(key)
    with pytest.raises(OSError, match="Too many levels of symbolic links") as info:
        SegmentWriter(planted, valid_bytes=0)
    assert info.value.errno == errno.ELOOP
    assert key.read_bytes() == before


def test_keys_new_signing_into_a_missing_directory_is_an_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "missing" / "log.key"
    argv = ["keys", "new", "--signing", "example.com/log", "--key-file", str(target)]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # no verifier key for a key that was not written
    assert f"error: cannot write {target}: No such file or directory" in captured.err
