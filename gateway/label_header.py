"""The header requests' data-class labels are read from, which no reload changes.

`relabels`: a reload whose set reads labels from another header than the running one is
refused until a restart (requests labelled with the running one, `x-sensitivity: phi`,
would become unlabelled, their class's `fallback: never` no longer applied).

`HeaderPin`: under `serve --workers N` a worker the supervisor restarts (it died) reads the
files afresh, and after a refused header change it compiled the new header while its
siblings kept the old one: a request labelled under one header was read differently by
different workers. So the header is pinned for the supervisor's life, in its runtime
directory (`OWNGATE_WORKER_RUNTIME_DIR`, removed when it exits): by the first worker to
serve a set read whole. A worker whose files name another header serves nothing (stale:
503, not ready, the reason in its log and status) and loads no set naming it, until they
name the pinned one again or the whole server restarts."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from gateway.policy import PolicySet
from gateway.worker_identity import worker_identity

__all__ = ["PIN_FILE", "HeaderPin", "header_pin", "relabels"]

PIN_FILE = "data-class-header"
_HEADER = re.compile(r"[a-z0-9][a-z0-9-]{0,63}\Z")  # as compiled: lower case
_RELABEL = (
    "data_class_header would change from {old!r} to {new!r} (a PolicySet edited or "
    "removed): requests labelled with {old!r} would lose their data class; the running "
    "set stays; restart the gateway to change the header"
)
_PINNED = (
    "data_class_header is {new!r} in the policy files, but the workers of this server "
    "read labels from {old!r} (a PolicySet edited or removed since they started): this "
    "worker serves no set naming {new!r}; restart the whole server to change the header"
)


def relabels(running: PolicySet, fresh: PolicySet) -> str | None:
    """Why `fresh` may not replace `running` in a running gateway: it reads requests'
    data-class labels from another header. None if it reads the same one."""
    if fresh.data_class_header == running.data_class_header:
        return None
    return _RELABEL.format(old=running.data_class_header, new=fresh.data_class_header)


class HeaderPin:
    """The header every worker of one `serve --workers N` reads labels from."""

    def __init__(self, runtime_dir: Path) -> None:
        self.path = runtime_dir / PIN_FILE
        self._pinned: str | None = None  # once known, for good: no file read again

    def claim(self, header: str) -> str:
        """The pinned header: `header`, pinned now, if none was yet, else the one pinned
        (a link, so exactly one worker's is, written whole). Raises OSError (the runtime
        directory gone or unwritable) or ValueError (the pin holds no header)."""
        if self._pinned is None:
            written = self.path.with_name(f"{PIN_FILE}.{os.getpid()}")
            written.write_text(header)
            try:
                os.link(written, self.path)
                pinned = header
            except FileExistsError:
                pinned = self.path.read_text()
            finally:
                written.unlink(missing_ok=True)
            if _HEADER.match(pinned) is None:
                raise ValueError("the pinned data_class_header is not a header name")
            self._pinned = pinned
        return self._pinned

    def refuses(self, fresh: PolicySet) -> str | None:
        """Why this worker may not serve `fresh`: it reads labels from another header than
        the pinned one, or the pin could not be read (fail closed). None: the same."""
        try:
            pinned = self.claim(fresh.data_class_header)
        except (OSError, ValueError) as exc:
            return f"the workers' data_class_header could not be read: {exc}; serving nothing"
        if pinned == fresh.data_class_header:
            return None
        return _PINNED.format(old=pinned, new=fresh.data_class_header)


def header_pin(environ: Mapping[str, str]) -> HeaderPin | None:
    """The pin of the server this process is a worker of; None when it is not one."""
    identity = worker_identity(environ)
    return None if identity is None else HeaderPin(identity.runtime_dir)
