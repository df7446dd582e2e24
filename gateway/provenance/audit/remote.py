"""A log served over HTTP as C2SP tlog-tiles (`checkpoint`, `tile/<L>/<N>[.p/<W>]`,
`tile/entries/<N>[.p/<W>]`, e.g. by owngate's admin API under /log/), copied into a
directory laid out like a log directory, so `verify_log` audits it like a copied one.

Standard library only (urllib): an auditor installs `gateway.provenance` and nothing else.
The served checkpoint is fetched first and, given the log's keys, verified before anything
else is (its tree size is the server's word until then: a hostile server could claim any
size); then exactly the tiles and bundles its tree size needs are fetched (tiles only
grow, so later ones still hold it), one at a time, so the first one missing ends the copy;
a 429 (the admin API's log reads all taken) is asked again as its `retry-after` says
(remote_busy.py). tlog-tiles serves no checkpoint history: the copy's history is that one
checkpoint; earlier ones an auditor holds are checked with `--checkpoint` as usual.

A hostile server is held to `FetchLimits`: each read waits at most `read_timeout_s`; each
file, from its host name's lookup to its last byte, at most `file_deadline_s` (a watchdog
shuts the connection's socket down, so a server dripping a byte just inside every read
timeout, in the TLS handshake, the headers or the body, still ends; a lookup that hangs is
given up: remote_socket.py); the whole copy, from the
checkpoint's GET to the last file's last byte, at most `copy_deadline_s` (a server
dripping every file just inside its deadline would otherwise hold the auditor for as many
deadlines as the log has files); a hash tile is exactly its width times 32 bytes and a
bundle at most its width times 2 + 65535, at least 2 bytes an entry (`length_problem`: an
empty file spent no byte, so a vast checkpoint's empty tiles were fetched until the copy's
deadline); the whole copy at most `max_bytes`, and never more than the tiles and bundles
of the tree size can hold, so a checkpoint that is only the server's word cannot fill the
disk. A redirect is followed only within the URL's origin (scheme, host and port): one
to another host, to plain http from https or to ftp:// would carry the auditor's
`--token` there (urllib copies every header onto the redirected request) and read the
log from a server the auditor never named. It ends the copy (MalformedError), as one to a
location that does not parse or to a URL with userinfo (`http://user:pass@host/`: urllib
takes `user:pass@host` for the host name) does; nor may the log URL hold one (the token
is `--token`). Neither is ever quoted with its userinfo (`without_userinfo`). With a
token, no proxy is used: urllib took one from `http_proxy` (for a loopback URL too,
without `no_proxy`) and handed it a plain-http log URL's (the admin listener's) request
with its `Authorization` header; without one, a public log goes through the proxy.
"""

from __future__ import annotations

import functools
import http.client
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.provenance.audit.remote_busy import patiently, refused
from gateway.provenance.audit.remote_socket import Watch, watched
from gateway.provenance.errors import MalformedError
from gateway.provenance.formats.checkpoint import Checkpoint, open_checkpoint
from gateway.provenance.formats.layout import CHECKPOINT, history_path
from gateway.provenance.formats.note import Verifier
from gateway.provenance.formats.tiles import (
    MAX_ENTRY_SIZE,
    TILE_WIDTH,
    copy_budget,
    first_of,
    length_problem,
    tile_width,
    tree_files,
)
from gateway.tls_options import client_context

__all__ = ["FetchLimits", "copy_budget", "is_url", "mirror_log", "without_userinfo"]

_MAX_NOTE = 1 << 20  # a checkpoint: its lines and signatures
_HASH = 32  # bytes per hash in a tile
_ENTRY = 2 + MAX_ENTRY_SIZE  # bytes per entry in a bundle, at most: length prefix + entry


@dataclass(frozen=True, slots=True)
class FetchLimits:
    """What a log server may take: seconds per read, per file and in all, bytes in all."""

    read_timeout_s: float = 30.0
    file_deadline_s: float = 300.0
    copy_deadline_s: float = 3600.0
    max_bytes: int = 16 << 30


def is_url(location: str) -> bool:
    return location.startswith(("http://", "https://"))


def mirror_log(
    url: str,
    directory: Path,
    *,
    token: str | None = None,
    verifiers: Sequence[Verifier] = (),
    origin: str | None = None,
    limits: FetchLimits = FetchLimits(),
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Copy the log at `url` (the prefix under which `checkpoint` is served) into
    `directory`; returns the checkpoint's tree size. With `verifiers` (and `origin`), the
    served checkpoint must be signed by one of them before a tile is fetched (else
    SignatureError or MalformedError). Raises MalformedError when the server lacks a file
    the checkpoint needs or serves more than `limits` allow, OSError when it cannot be
    reached or a file does not arrive whole within the deadline."""
    if not is_url(url):
        raise ValueError(f"{without_userinfo(url)!r} is not an http:// or https:// URL")
    if _has_userinfo(url):
        raise ValueError(
            f"{without_userinfo(url)!r} holds userinfo (user:password@): give the log URL "
            "without it (an auditor's token is --token)"
        )
    base = url.rstrip("/") + "/"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    budget = _Budget(limits.max_bytes, "--max-download")
    end = clock() + limits.copy_deadline_s

    def fetch(name: str, limit: int) -> bytes | None:
        request = urllib.request.Request(base + name, headers=headers)  # noqa: S310 - http(s) only, checked above
        get = functools.partial(_get, request, min(limit, budget.left), limits, clock, end)
        data = patiently(get, clock, end)  # a 429 asked again after its retry-after
        if data is None:
            return None
        if len(data) > limit:
            raise MalformedError(f"{name} is larger than {limit} bytes")
        budget.spend(data, base)
        return data

    note = fetch(CHECKPOINT, _MAX_NOTE)
    if note is None:
        raise MalformedError(f"{base}{CHECKPOINT} is not served")
    if verifiers:
        size = open_checkpoint(note, verifiers, origin=origin).checkpoint.size
    else:
        size = _tree_size(note)
    needed = copy_budget(size)
    if needed < budget.left:  # the server's files, not the auditor's cap, are the limit
        budget = _Budget(needed, f"the most the tiles of tree size {size} can hold")
    _write(directory / CHECKPOINT, note)
    _write(history_path(directory, size), note)
    for tile, bundle in tree_files(size):  # one at a time: never a list as long as the log
        for name, per_item in ((tile, _HASH), (bundle, _ENTRY)):
            if name is None:
                continue
            data, served = fetch(name, tile_width(name) * per_item), name
            if data is None and ".p/" in name:  # grown since: the full file begins with it
                served = name.partition(".p/")[0]
                data = fetch(served, TILE_WIDTH * per_item)
            if data is None:
                raise MalformedError(f"{base}{served} is not served (tree size {size})")
            problem = length_problem(served, len(data))  # an empty file spent no byte
            if problem is None and served != name:  # kept as the partial one: verify takes
                cut = first_of(name, data)  # no full file past its tree's end
                problem, data = (cut, data) if isinstance(cut, str) else (None, cut)
            if problem is not None:
                raise MalformedError(f"{base}{served} is {problem} (tree size {size})")
            _write(directory / name, data)
    return size


class _Budget:
    """The bytes a copy may still take; `why` names the limit."""

    def __init__(self, left: int, why: str) -> None:
        self.left, self._limit, self._why = left, left, why

    def spend(self, data: bytes, base: str) -> None:
        if len(data) > self.left:
            raise MalformedError(
                f"{base} serves more than {self._limit} bytes in all ({self._why}): "
                "the copy stops there"
            )
        self.left -= len(data)


def _get(
    request: urllib.request.Request,
    limit: int,
    limits: FetchLimits,
    clock: Callable[[], float],
    end: float,
) -> bytes | None:
    """The body of `request`, at most `limit` + 1 bytes of it (None on 404), all of it
    within `limits.file_deadline_s` of `clock` and before `end` (the whole copy's
    deadline), or OSError."""
    seconds = min(limits.file_deadline_s, end - clock())
    late = _late(request, limits, whole_copy=seconds < limits.file_deadline_s)
    if seconds <= 0:
        raise late
    watch = Watch()
    handlers: list[urllib.request.BaseHandler] = [
        _Handler(watch),
        _SecureHandler(watch),
        _SameOrigin(),
    ]
    if request.has_header("Authorization"):  # the token goes to the URL, never a proxy
        handlers.append(urllib.request.ProxyHandler({}))
    opener = urllib.request.build_opener(*handlers)
    timer = threading.Timer(seconds, watch.expire)
    timer.daemon = True
    deadline = clock() + seconds
    timer.start()
    try:
        with opener.open(request, timeout=limits.read_timeout_s) as response:
            chunks: list[bytes] = []
            got = 0
            while got <= limit and not watch.expired:  # bounded: by `limit` bytes
                chunk: bytes = response.read1(min(1 << 16, limit + 1 - got))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
                if clock() > deadline:
                    watch.expire()
    except urllib.error.HTTPError as exc:
        exc.close()  # it holds the answer's connection open
        if watch.expired:
            raise late from exc
        if exc.code == 404:
            return None
        raise refused(request.full_url, exc.code, exc.headers) from exc  # 429: Busy
    except (OSError, http.client.HTTPException) as exc:
        if watch.expired:
            raise late from exc
        raise OSError(f"GET {request.full_url}: {exc}") from exc
    finally:
        timer.cancel()
        watch.release()
    if watch.expired:  # a socket shut down reads as the end: what came is not the file
        raise late
    return b"".join(chunks)


def _late(request: urllib.request.Request, limits: FetchLimits, *, whole_copy: bool) -> OSError:
    if whole_copy:
        return OSError(
            f"GET {request.full_url}: the copy of the log is not done within "
            f"{limits.copy_deadline_s:g} s (the deadline for the whole copy, --copy-deadline)"
        )
    return OSError(
        f"GET {request.full_url}: not received whole within {limits.file_deadline_s:g} s "
        "(the per-file deadline, --file-deadline)"
    )


class _Handler(urllib.request.HTTPHandler):
    def __init__(self, watch: Watch) -> None:
        super().__init__()
        self._connection = watched(http.client.HTTPConnection, watch)

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._connection, req)


class _SecureHandler(urllib.request.HTTPSHandler):
    def __init__(self, watch: Watch) -> None:
        self.tls = client_context()  # the system's roots, as urlopen's
        super().__init__(context=self.tls)
        self._connection = watched(http.client.HTTPSConnection, watch)

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._connection, req, context=self.tls)


class _SameOrigin(urllib.request.HTTPRedirectHandler):
    """Redirects followed only to the request's origin, to a location that parses."""

    def http_error_302(self, req: Any, fp: Any, code: int, msg: str, headers: Any) -> Any:
        fp.close()  # its body unread: urllib's fp.read() held an endless one till the deadline
        try:
            return super().http_error_302(req, fp, code, msg, headers)
        except ValueError:  # urllib's urlparse of the location: an ill-formed host
            raise MalformedError(
                f"GET {req.full_url}: HTTP {code} redirects to a URL that does not parse: "
                "not followed"
            ) from None

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        if _has_userinfo(newurl):
            fp.close()
            raise MalformedError(
                f"GET {req.full_url}: HTTP {code} redirects to "
                f"{without_userinfo(newurl)[:200]}, a URL holding userinfo "
                "(user:password@): not followed"
            )
        if _origin(newurl) != _origin(req.full_url):
            fp.close()
            raise MalformedError(
                f"GET {req.full_url}: HTTP {code} redirects to "
                f"{without_userinfo(newurl)[:200]}, another origin than the log URL's: not "
                "followed (it would take the token there)"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _has_userinfo(url: str) -> bool:
    """Whether `url`'s authority holds userinfo (`user[:password]@`)."""
    return "@" in urllib.parse.urlsplit(url).netloc


def without_userinfo(url: str) -> str:
    """`url` with any userinfo in its authority replaced by `***`, for a message: the
    credential a hostile redirect (or a mistyped log URL) carries is never repeated."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # e.g. an unbalanced [ in the host: quote nothing of it
        return "<a URL that does not parse>"
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"***@{host}"))


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or {"http": 80, "https": 443}.get(scheme)
    except ValueError:  # a port out of range or not a number: matches nothing
        port = -1
    return scheme, (parts.hostname or ""), port


def _tree_size(note: bytes) -> int:
    """The tree size of a served checkpoint no key checked (`audit show` and `audit report`
    copy unverified), its text read as `Checkpoint.parse` reads a signed one's: a size no
    tlog has (past 2^64-1, with leading zeros) ends the copy before any tile is fetched.
    Only digits were asked for: 2^70 had the copy fetch tiles up to --max-download (16 GiB
    by default) before it failed, and 5,000 digits ended it with Python's int() error."""
    text, blank, _ = note.partition(b"\n\n")
    try:
        return Checkpoint.parse(text.decode("utf-8") + "\n").size
    except (MalformedError, UnicodeDecodeError) as exc:
        why = exc if blank else "it has no blank line before its signatures"
        raise MalformedError(f"the served checkpoint is not a checkpoint: {why}") from None


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
