"""The active trust-policy set: loaded at start, hot-reloaded, never a gap in checking.

Policies are compiled by `gateway.policy`; this module owns their life in the server.
A reload (file change, SIGHUP) compiles the new files completely before one reference
swap makes them active; a file that fails validation, or changed while it was read,
leaves the last good set active and is reported (log, readiness detail, metric); one
that could not be read at all (out of file descriptors) is read again, unchanged, after
2 looks, then 4, 8, ... at most 64; in a worker of `serve --workers N` at every look, and
meanwhile the worker is `stale`: not ready, refusing requests (503), since the other
workers may enforce what the files say now.
Without a `policy` section in gateway.yaml a built-in set applies: every tenant may use
the private backends serving its models and nothing else (no hosted fallback) — deny by
default toward providers.

This is the set's lifecycle, not a routing filter: each request reads `current` once and
decides with it; the Decision's eligible set is applied by gateway/routing/filters/trust.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gateway.config.facts import backend_facts
from gateway.config.schema import GatewaySettings
from gateway.label_header import HeaderPin, relabels
from gateway.logs import get_logger
from gateway.policy import BackendFacts, PolicyError, PolicyIssue, PolicySet, parse_policies
from gateway.policy.loader import load_policies
from gateway.policy.source import is_yaml_name
from gateway.settling import Settling
from gateway.upstream.litellm_runtime import preload_litellm

__all__ = [
    "BUILTIN_POLICY_ID",
    "STALE_POLICIES",
    "UNLISTED",
    "TrustPolicies",
    "builtin_source",
    "policy_stamps",
]

BUILTIN_POLICY_ID = "builtin-private-only"
# The mtime `policy_stamps` gives a directory it could not list (no file has it)
UNLISTED = -(2**62)
Stamps = tuple[tuple[str, int, int, int, int], ...]
# A policy file that could not be read is read again after 2 looks, then 4, 8, ... at most
# 64 (about a minute at the default 1 s interval), as gateway.yaml and the keys file are
# (gateway/api/reload.py): a transient failure passes at the first retry.
_UNREADABLE_MAX_DOUBLINGS = 6
# What a request gets from a stale worker (`TrustPolicies.stale`): 503, retry at once
STALE_POLICIES = (
    "this gateway could not read its trust-policy files whole (unreadable, or changing "
    "while read), or they name another data-class header than its other workers read, "
    "so the policies it holds may not be what they say now; retry shortly"
)


_CHANGED = "the policy files changed while they were read; read again once settled"


class TrustPolicies:
    def __init__(
        self,
        config: GatewaySettings,
        config_dir: Path,
        *,
        clock: Callable[[], float] = time.time,
        pin: HeaderPin | None = None,
    ) -> None:
        """`pin`: in a worker of `serve --workers N`, the label header of its siblings."""
        self._facts: tuple[BackendFacts, ...] = backend_facts(config)
        self._tenants = tuple(t.id for t in config.tenants)
        self._clock = clock
        self._log = get_logger("owngate.policy")
        settings = config.policy
        # Each once: a config (a candidate sent to the admin API: some 20,000 in 256 KiB)
        # naming a directory again had it listed again, twice (stamps, then the read)
        paths = [config_dir / p for p in settings.paths] if settings else []
        self._paths = list(dict.fromkeys(paths))
        self.reload_interval_s = settings.reload_interval_s if settings else 1.0
        self.last_error: str | None = None
        self.reload_failures = 0
        self.loaded_at = clock()
        # The files' stamp before they are read, never after: a writer finishing between
        # the two would leave what was read (maybe half a file) active for good.
        self._stamp = self._fingerprint()
        # Raises PolicyError: the server refuses to start without valid policies; a config
        # reload retries one whose files could not be read or listed (`unreadable`).
        try:
            self.current: PolicySet = self._compile()
        except OSError as exc:
            raise _unreadable(self._paths, exc) from None
        after = self._fingerprint()
        if _unlisted(self._stamp) or _unlisted(after):
            raise _unreadable(self._paths, "a policy directory could not be listed")
        # Whether the files held still while `current` was read: a config reload installs
        # no set read from a file still being written (its watcher loads it once settled).
        self.read_whole = after == self._stamp
        self._settling = Settling()  # a change seen, until it holds still
        self._reads = 0  # reads of the files started; `current` is from read `_applied`
        self._applied = 0
        self._unreadable = 0  # reloads in a row that could not read a file
        self._retry_in: int | None = None  # looks left before an unreadable file is retried
        # A read failed unreadable since the last read that succeeded: the set held may be
        # older than the files (cleared only by a read that succeeds, not by a later read
        # that fails otherwise: invalid content, files changed while read)
        self._behind = False
        # One of the workers of `serve --workers N` (set by `assemble`): while its last read
        # of the files failed it is `stale` (its siblings may enforce what they say now)
        self.among_workers = False
        # And while its set names another label header than they read (label_header.py)
        self._pin = pin
        self.last_error = pin.refuses(self.current) if pin and self.read_whole else None
        self.off_pin = self.last_error is not None
        if self.off_pin:
            self._log.error("policy set not served: another label header", problem=self.last_error)
        # The policies of the config a gateway.yaml reload installed after this one's: the
        # requests still running on this config check their attempts against them too.
        self.successor: TrustPolicies | None = None

    def latest(self) -> PolicySet:
        """The set active now in the newest config (this one's, unless a config reload
        has replaced it: then its successor's)."""
        trust = self
        while trust.successor is not None:
            trust = trust.successor
        return trust.current

    @property
    def stale(self) -> bool:
        """A worker of `serve --workers N` one of whose reads of the policy files failed
        (unreadable: out of file descriptors, an I/O error) since its last that succeeded:
        its set may be older than what the files say, which the other workers may enforce
        already. It refuses requests and is not ready until a read succeeds (retried at
        every look); a later read that fails otherwise (invalid content written after the
        change it missed, files changed while read) leaves it stale: before, it turned
        ready on its older set while its siblings held the change it missed. One
        process keeps serving its last good set, as it always did: there is no sibling
        to disagree with. And any process whose first read (at start, or a worker the
        supervisor restarted) found the files changing while it read them: cut short, they
        may parse as a weaker set, and there is no last good set to serve instead; until
        a read finds them whole (the watcher's, once they hold still)."""
        return (self.among_workers and self._behind) or not self.read_whole or self.off_pin

    @property
    def read_failed(self) -> bool:
        """Whether a read of the files failed unreadable since the last that succeeded
        (in any process: `stale` is this in a worker of several)."""
        return self._behind

    @property
    def configured(self) -> bool:
        return bool(self._paths)

    @property
    def paths(self) -> tuple[Path, ...]:
        """The policy files and directories (`policy.paths`, resolved)."""
        return tuple(self._paths)

    def _compile(self) -> PolicySet:
        if not self._paths:
            return parse_policies([builtin_source(self._tenants)], self._facts)
        return load_policies(self._paths, self._facts)

    def reload(self, *, seen: Stamps | None = None) -> bool:
        """Compile the files again; swap only if every file is valid. True if swapped.
        `seen`: the stamps a look saw hold still (`_compiled`)."""
        self._reads += 1
        return self._apply(self._reads, self._compiled(seen))

    async def reload_off_loop(self, *, seen: Stamps | None = None) -> bool:
        """`reload`, the files read and compiled on a worker thread (a large policy set
        takes seconds: the event loop, and every stream on it, would stall for them), and
        LiteLLM loaded before a set that may fall back to a hosted backend is installed
        (the watcher's reloads and a config reload's: `PolicySet.falls_back`)."""
        self._reads += 1
        read = self._reads
        outcome = await asyncio.to_thread(self._compiled, seen)
        if isinstance(outcome, PolicySet) and outcome.falls_back():
            # Before it is installed: its first hosted call would import LiteLLM beside
            # traffic, the GIL that import holds stalling every request (litellm_runtime.py)
            await preload_litellm()  # at once where loaded; a failure is a warning
        return self._apply(read, outcome)

    def _compiled(self, seen: Stamps | None = None) -> PolicySet | PolicyError:
        """The files compiled, or why not: also when they changed while they were read (a
        SIGHUP or a config reload, which do not wait for them to hold still, caught one
        being written: cut short, it may still parse, as a weaker set). The watcher loads
        them once they hold still. A directory their stamps could not list, before or
        after, is a read that failed (`unreadable`: read again), as one the loader could
        not list is: before, its OSError escaped the reload, whose stamp was taken, and a
        narrowed policy waited for the files' next change. Files whose stamps are not
        `seen` (what a watcher's look saw hold still) when the read begins changed since
        (the next edit started between the look and the read, on a worker thread): they
        were read whole, unchanged while read, and loaded, maybe cut short; now their next
        looks see them, and load them once they hold still."""
        before = self._fingerprint()
        if seen is not None and before != seen and not _unlisted(before):
            return PolicyError([PolicyIssue(str(self._paths[0]), None, None, "", _CHANGED)])
        try:
            compiled = self._compile()
        except PolicyError as exc:
            return exc
        except OSError as exc:  # listing a directory failed (out of file descriptors)
            return _unreadable(self._paths, exc)
        after = self._fingerprint()
        if _unlisted(before) or _unlisted(after):
            return _unreadable(self._paths, "a policy directory could not be listed")
        if after == before:
            return compiled
        return PolicyError([PolicyIssue(str(self._paths[0]), None, None, "", _CHANGED)])

    def _apply(self, read: int, outcome: PolicySet | PolicyError) -> bool:
        """Make the outcome of read number `read` count, unless a later read's already
        does: a read that started earlier (on a thread) never undoes a later one."""
        if read < self._applied:
            return False
        self._applied = read
        why = self._relabels(outcome) if isinstance(outcome, PolicySet) else None
        if why is not None:  # not a read that failed: `_behind` and `_retry_in` unchanged
            where = str(self._paths[0]) if self._paths else "policy"
            outcome = PolicyError([PolicyIssue(where, None, None, "data_class_header", why)])
        if isinstance(outcome, PolicyError):
            exc = outcome
            # Not what the files say but whether they could be read: read again though
            # they did not change. Before, the watcher kept their new stamp and waited for
            # the next change: a narrowed policy one worker of `serve --workers` failed to
            # read (out of file descriptors) left it on the looser set, for good.
            self._unreadable = self._unreadable + 1 if exc.unreadable else 0
            self._behind = self._behind or exc.unreadable
            backoff = 2 ** min(self._unreadable, _UNREADABLE_MAX_DOUBLINGS)
            # a stale worker refuses every request until it reads them: at every look
            self._retry_in = (1 if self.among_workers else backoff) if exc.unreadable else None
            self.reload_failures += 1
            first = exc.issues[0] if exc.issues else None
            self.last_error = f"{len(exc.issues)} problem(s); first: {first}"
            self._log.error(
                "policy reload failed; keeping the last good policy set",
                active=self.current.id,
                active_digest=self.current.digest,
                problems=[str(issue) for issue in exc.issues[:20]],
            )
            return False
        fresh = outcome
        self._unreadable = 0
        self._behind = False
        self._retry_in = None
        changed = fresh.digest != self.current.digest
        self.current = fresh  # one reference swap: requests see the old set or the new
        self.read_whole = True
        self.off_pin = False
        self.last_error = None
        self.loaded_at = self._clock()
        if changed:
            self._log.info(
                "policy set loaded", id=fresh.id, version=fresh.version, digest=fresh.digest
            )
        return changed

    def _relabels(self, fresh: PolicySet) -> str | None:
        """Why `fresh` may not be served: in a worker, it names another label header than
        the pinned one; in one process, than the running set, unless that served nothing
        (read at start while a file changed: maybe it lost the PolicySet, cut short)."""
        if self._pin is not None:
            return self._pin.refuses(fresh)
        return relabels(self.current, fresh) if self.read_whole else None

    def _fingerprint(self) -> Stamps:
        return policy_stamps(self._paths)

    def poll(self) -> bool:
        """One look at the policy files: reload once a change has held still for a whole
        poll interval (the same size and mtime twice in a row), so a file caught half
        written, which may still parse as a weaker policy, is never loaded. True if it
        reloaded. (Write policy files atomically all the same: a temporary file renamed
        over the old one.) Files that could not be read are read again unchanged, after a
        number of looks that doubles while they keep failing."""
        seen = self._due()
        if seen is None:
            return False
        self.reload(seen=seen)
        return True

    def _due(self) -> Stamps | None:
        """The files' stamps if they are to be read now: a change that held still, or
        files that could not be read, due again."""
        stamp = self._fingerprint()
        if self._settling.settled(stamp, self._stamp):
            self._stamp = stamp
            return stamp
        if self._retry_in is not None and stamp == self._stamp:  # unchanged, unreadable
            self._retry_in -= 1
            return stamp if self._retry_in <= 0 else None
        return None

    async def watch(self) -> None:
        """`poll` every `reload_interval_s`, compiling off the event loop. Cancel to stop."""
        if not self._paths:
            return
        while True:
            await asyncio.sleep(self.reload_interval_s)
            try:
                seen = self._due()
                if seen is not None:
                    await self.reload_off_loop(seen=seen)
            except Exception as exc:  # noqa: BLE001 - a failed reload, reported: dead, the
                # watcher would apply no later change (a tightened policy never enforced)
                self.reload_failures += 1
                self.last_error = f"unexpected error: {type(exc).__name__}"
                self._log.error(
                    "policy reload failed; keeping the last good policy set",
                    active=self.current.id,
                    error=self.last_error,
                    problems=str(exc).splitlines()[:20],
                )

    def status(self) -> dict[str, Any]:
        policy = self.current
        return {
            "id": policy.id,
            "version": policy.version,
            "digest": policy.digest,
            "builtin": not self._paths,
            "loaded_at": self.loaded_at,
            "last_reload_error": self.last_error,
        }


def policy_stamps(paths: Sequence[Path]) -> Stamps:
    """Each policy file's (name, mtime, size, inode, ctime) under `paths`: a change shows
    as a new value. The mtime alone is the writer's to set (`cp -p`, `rsync -a`, an
    archive's normalized mtimes keep the source's): a file renamed into place is another
    inode, and any write or rename sets the ctime, which no writer chooses. A directory
    that could not be listed (out of file descriptors) is (its name, `UNLISTED`, -1, -1,
    -1): never an error escaping a watcher's look or a reload."""
    stamps: list[tuple[str, int, int, int, int]] = []
    for path in paths:
        try:
            candidates = (
                sorted(c for c in path.rglob("*") if is_yaml_name(c)) if path.is_dir() else [path]
            )
        except OSError:
            stamps.append((str(path), UNLISTED, -1, -1, -1))
            continue
        candidates = [c for c in candidates if not c.name.startswith(".")]
        for file in candidates:
            try:
                info = file.stat()
            except OSError:
                continue
            stamps.append(
                (str(file), info.st_mtime_ns, info.st_size, info.st_ino, info.st_ctime_ns)
            )
    return tuple(stamps)


def _unlisted(stamps: Stamps) -> bool:
    return any(stamp[1] == UNLISTED for stamp in stamps)


def _unreadable(paths: Sequence[Path], why: object) -> PolicyError:
    where = str(paths[0]) if paths else "<policies>"
    return PolicyError([PolicyIssue(where, None, None, "", f"cannot read: {why}", unreadable=True)])


def builtin_source(tenants: Sequence[str]) -> tuple[str, str]:
    """The set a gateway.yaml without a `policy` section enforces, as (name, YAML text):
    `owngate policy` decides with it too, so it agrees with the gateway."""
    return "<builtin>", _builtin_text(tenants)


def _builtin_text(tenants: Sequence[str]) -> str:
    listed = ", ".join(f'"{t}"' for t in tenants)
    return f"""
apiVersion: policy.owngate.dev/v1
kind: PolicySet
metadata: {{id: {BUILTIN_POLICY_ID}, version: "1",
           description: "No policy files configured: private backends only"}}
---
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {{id: {BUILTIN_POLICY_ID}, version: "1"}}
spec:
  tenants: [{listed}]
  residency: {{allow: ["*"]}}
  retention: {{max_days: any, training: true}}
  fallback: {{mode: never}}
"""
