"""The TLS files an operator names, loaded from the bytes read: a backend's `tls.ca_file`,
client certificate and key (gateway/upstream/tls.py), and the `owngate attest` sidecar's
`--tls-cert`, `--tls-key` and `--client-ca` (gateway/attest/listener.py).

Each file is read once as a regular file of at most `MAX_TLS_FILE` (`read_tls_file`,
gateway/small_files.py): a FIFO, a device or a larger file is refused with an OSError
naming it and why. OpenSSL never opens an operator's path itself: a FIFO there held the
opener waiting for a writer (a reload's thread and its lock; the sidecar's start), and
`/dev/zero` was read without end. What is loaded is the very bytes read, so a file swapped
in between cannot load bytes other than those checked and digested.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from gateway.small_files import read_small_file

__all__ = ["MAX_TLS_FILE", "load_cert_chain", "read_tls_file"]

# A CA bundle (Mozilla's is about 220 kB), a certificate chain or a key: far below this.
MAX_TLS_FILE = 4 * 1024 * 1024


def read_tls_file(path: Path) -> bytes:
    """The bytes of the regular file at `path`, at most `MAX_TLS_FILE`; OSError naming it
    (its `strerror` says why) when it is missing, not a regular file or larger."""
    return read_small_file(path, MAX_TLS_FILE)


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
