"""The TLS files an operator names, loaded from the bytes read: a backend's `tls.ca_file`,
client certificate and key (gateway/upstream/tls.py), and the `owngate attest` sidecar's
`--tls-cert`, `--tls-key` and `--client-ca` (gateway/attest/listener.py).

Each file is read once as a regular file of at most `MAX_TLS_FILE` (`read_tls_file`,
gateway/small_files.py): a FIFO, a device or a larger file is refused with an OSError
naming it and why. OpenSSL never opens an operator's path itself: a FIFO there held the
opener waiting for a writer (a reload's thread and its lock; the sidecar's start), and
`/dev/zero` was read without end. What is loaded is the very bytes read, so a file swapped
in between cannot load bytes other than those checked and digested.

One rule reads a CA bundle on both sides (`load_ca_bundle`): its PEM blocks, as OpenSSL's
file loader reads them. Text around them (a bundle's explanatory lines, UTF-8 or not) is
skipped; a byte that is not ASCII inside a block, or no block at all, holds no PEM
certificate. Before, a backend's `ca_file` was refused for any non-ASCII byte while the
sidecar's `--client-ca` dropped every one, inside a block too.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from gateway.small_files import read_small_file

__all__ = ["MAX_TLS_FILE", "load_ca_bundle", "load_cert_chain", "read_tls_file"]

# A CA bundle (Mozilla's is about 220 kB), a certificate chain or a key: far below this.
MAX_TLS_FILE = 4 * 1024 * 1024

_NO_CERTIFICATE = "holds no PEM certificate"


def read_tls_file(path: Path) -> bytes:
    """The bytes of the regular file at `path`, at most `MAX_TLS_FILE`; OSError naming it
    (its `strerror` says why) when it is missing, not a regular file or larger."""
    return read_small_file(path, MAX_TLS_FILE)


def load_ca_bundle(context: ssl.SSLContext, pem: bytes) -> bytes:
    """Trust the CA certificates of the bundle `pem` in `context`; the PEM text loaded (as
    bytes, for `tls_anchors.partial_chain`). ValueError when it holds no PEM certificate
    OpenSSL loads (`_pem_blocks`)."""
    text = _pem_blocks(pem)
    try:
        context.load_verify_locations(cadata=text)
    except (ssl.SSLError, ValueError):  # what the file says: not an OSError (SSLError is)
        raise ValueError(_NO_CERTIFICATE) from None
    return text.encode("ascii")


def _pem_blocks(pem: bytes) -> str:
    """The PEM blocks of a CA bundle, every line from one starting `-----BEGIN ` to the
    next starting `-----END `, as OpenSSL's file loader reads them (text around them
    skipped, whatever its encoding); ValueError when there is none or one holds a byte
    that is not ASCII (OpenSSL's file loader refuses both)."""
    kept: list[bytes] = []
    inside = False
    for line in pem.splitlines():  # bytes: split at LF, CR and CRLF only
        if not inside and line.startswith(b"-----BEGIN "):
            inside = True
        if inside:
            kept.append(line)
            inside = not line.startswith(b"-----END ")
    if not kept:
        raise ValueError(_NO_CERTIFICATE)
    try:
        return b"\n".join(kept).decode("ascii") + "\n"
    except UnicodeDecodeError:
        raise ValueError(f"{_NO_CERTIFICATE} (a byte that is not ASCII in a PEM block)") from None


def load_cert_chain(
    context: ssl.SSLContext,
    cert_pem: bytes,
    key_pem: bytes,
    password: bytes | Callable[[], bytes],
) -> None:
    """`load_cert_chain` of the bytes read (`read_tls_file`), never of the paths opened
    again. They go through anonymous memory files (Linux `memfd_create`, named by
    `/proc/self/fd`); elsewhere, a private temporary directory removed at once. ssl.SSLError
    when they are not a PEM certificate and its key; OSError when no memory file can be
    made (out of descriptors)."""
    with _as_file(cert_pem, "cert") as cert, _as_file(key_pem, "key") as key:
        context.load_cert_chain(cert, key, password=password)


@contextlib.contextmanager
def _as_file(data: bytes, name: str) -> Iterator[str]:
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create(f"owngate-tls-{name}", os.MFD_CLOEXEC)
        try:
            with os.fdopen(os.dup(fd), "wb") as handle:
                handle.write(data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="owngate-tls-") as directory:  # mode 0700
        path = os.path.join(directory, name)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
            handle.write(data)
        yield path
