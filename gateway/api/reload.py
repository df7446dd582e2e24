"""Reloading gateway.yaml in a running gateway, without dropping a connection.

SIGHUP (and a poll of the file's, the keys file's and the backends' TLS files' mtimes and
sizes, once a change has held still for a whole poll interval) loads the file again through
the same strict loader as startup; a backend whose CA or client certificate file changed on
disk is rebuilt even when gateway.yaml did not change. A file that fails validation, or
whose trust policies no longer compile against its backends, leaves the running config
untouched: the failure is logged, counted (`owngate_config_reload_failures_total`) and shown
in the readiness detail, as a failed policy reload is. A valid file is assembled completely
by the composition root's `assemble` (backend registry and TLS contexts, tenant keys, trust
policies, scraper, proxy) on a worker thread, as it is read and parsed there, and swapped in
whole by the app's `install` on the event loop: the reloader gets both as callables and
knows nothing of the app. A request is decided and routed by the parts active once its body
is read, and finishes on them (each further attempt also checked against the new config's
policies, `TrustPolicies.successor`, and skipped when the new config moved its backend or
changed its TLS trust, `Registry.successor`; a policy change the running set loaded while
the new config was being built is read again before the swap, never undone: if that read
fails, nothing is installed, and what assembling adjusted in the running backends is put
back); the connections of a removed or changed backend close once the requests that were
running at the swap are done (bounded by `limits.drain_timeout_s`; past it, one still
running opens no new connection on them: `HttpPool.close`); those of a backend whose TLS
changed take the new TLS settings at once, also those of its pools from older configs
(`Registry.hand_over_tls`: no connection a new CA file refuses is opened or reused for a
request that was running). Unchanged backends keep their connection pools, in-flight counts
and health. Settings only a restart can change (`listen`, `provenance`, `state`, `logging`,
and `admin.listen`, `admin.sample_interval_s`, `admin.history_s`) keep their running values,
the log says "needs restart", and `status()` lists them (`needs_restart`:
`state.revocations_file`, say) until a file that no longer changes them is read.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.api.reload_parts import Adjusted, adjustable, put_back, replaced_backends, retire
from gateway.api.reload_pins import (
    ADMIN_RESTART_ONLY,
    RESTART_ONLY,
    changes,
    pin_restart_only,
    restart_pending,
    tls_paths,
)
from gateway.config.env_refs import unquoted
from gateway.config.issues import ConfigError, ConfigIssue
from gateway.config.loader import load_config_file
from gateway.config.schema import GatewaySettings
from gateway.label_header import relabels
from gateway.logs import get_logger
from gateway.policy import PolicyError
from gateway.policy_set import UNLISTED, policy_stamps
from gateway.settling import Settling, written_since
from gateway.upstream.litellm_runtime import preload_litellm

if TYPE_CHECKING:
    from gateway.api.parts import Assembly

__all__ = ["ADMIN_RESTART_ONLY", "RESTART_ONLY", "ConfigReloader"]

# How long before the reading began a file must have been last written for the first
# look not to reload it: coarse file systems keep mtimes in whole seconds (FAT: two).
_MTIME_SLACK_S = 2.0
# A file that cannot be read is read again after 2 looks, then 4, 8, ... at most 64 (about a
# minute at the default 1 s interval): a transient failure (out of file descriptors) passes
# at the first retry, and one that lasts (a keys file missing, a directory, too large, not
# permitted) is not re-read, parsed and logged every other second for as long as it lasts.
_UNREADABLE_MAX_DOUBLINGS = 6


class ConfigReloader:
    """Owns reloads of one config file (see the module docstring).

    `current()` is the active assembly; `assemble(config, running)` builds the parts of a
    new config from the running ones (raising `AssemblyError` or `PolicyError`);
    `install(parts)` makes them active and returns the requests running at the swap,
    which finish on the old parts."""

    def __init__(
        self,
        path: Path,
        *,
        current: Callable[[], Assembly],
        assemble: Callable[[GatewaySettings, Assembly], Assembly],
        install: Callable[[Assembly], Collection[asyncio.Task[Any]]],
        prepare: Callable[[GatewaySettings], GatewaySettings] = lambda config: config,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        read_at: float | None = None,
        environ: Mapping[str, str] | None = None,
        among_workers: bool = False,
    ) -> None:
        self.path = path
        self.among_workers = among_workers  # one of `serve --workers N` (`stale`)
        self._behind = False  # a read failed unreadable since the last that succeeded
        # What the file's `${VAR}`s read (None: the process environment, as at start).
        self._environ = environ
        self._current = current
        self._assemble = assemble
        self._install = install
        # What `serve` does to a loaded file (per-worker log, ...); runs on a worker thread.
        self._prepare = prepare
        self.interval_s = interval_s
        self._clock = clock
        self._log = get_logger("owngate.config")
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()  # reloads and retirements under way
        self._queued = False  # a triggered reload waits for the lock
        self.reload_failures = 0
        self.last_error: str | None = None
        self.needs_restart: list[str] = []  # what the file read last changes, kept running
        self._text = ""  # the config file's text the last reload read (`_failed`)
        self.loaded_at = clock()
        # No file's stamp: the running config was read before this watcher existed (by
        # `serve`, maybe mid-edit), so the first settled look reloads, and keeps it only if
        # the file says otherwise; unless every file was last written well before `read_at`
        # (when the reading began): a second parse (seconds for a large keys file, beside
        # the first requests) would change nothing. One written since is not served meanwhile.
        self._retry_paths: tuple[Path, ...] = ()  # a refused config's policy and TLS files
        self._stamp: tuple[object, ...] = ()
        self._settling = Settling()
        self._unreadable = 0  # reloads in a row that could not read a file
        self._retry_in: int | None = None  # looks left before an unreadable file is retried
        if read_at is not None and self._unchanged_since(read_at - _MTIME_SLACK_S):
            self._stamp = self._fingerprint()
        self._unsettled = read_at is not None and written_since(self._files(), read_at)

    @property
    def stale(self) -> bool:
        """A worker of `serve --workers N` a read of whose files failed (unreadable) since
        the last that succeeded: its config (a key revoked?) may be older than its
        siblings'. It refuses requests and is not ready until a read succeeds, retried at
        every look (`TenantAuth.refuse_if_stale`). And any process whose files were written
        since its reading began (maybe cut short) until a settled look reads them."""
        return (self.among_workers and self._behind) or self._unsettled

    def _files(self) -> list[Path]:
        files = [self.path]
        current = self._current()
        if current.config.keys_file is not None:
            files.append(self.path.parent / current.config.keys_file)
        files += current.registry.tls_files()  # a CA or client certificate rotated on disk
        return files

    def _unchanged_since(self, when: float) -> bool:
        """Whether every watched file was last modified before `when` (seconds), and every
        policy file and directory too (the first look's reload reads them again as well,
        and their own watcher took its stamp only after reading them)."""
        config = self._current().config
        policies = [self.path.parent / p for p in (config.policy.paths if config.policy else ())]
        limit = int(when * 1e9)
        try:
            files = [f.stat().st_mtime_ns for f in (*self._files(), *policies)]
        except OSError:
            return False
        files += [stamp[1] for stamp in policy_stamps(policies)]  # their mtimes
        return all(UNLISTED < mtime < limit for mtime in files)  # a directory unlisted: no

    def _fingerprint(self) -> tuple[object, ...]:
        stamps: list[object] = []
        for file in self._files():
            try:
                info = file.stat()
            except OSError:
                stamps.append((-1, -1, -1, -1))
                continue
            # The inode and ctime too: a file renamed into place with the source's mtime
            # and size (`cp -p`, `rsync -a`) is a change (as gateway/policy_set.py's).
            stamps.append((info.st_mtime_ns, info.st_size, info.st_ino, info.st_ctime_ns))
        # After a config refused for its policy files (missing, invalid: a deploy that
        # writes gateway.yaml before them), their change retries it; without this the
        # process, or one worker of several, kept the old config until gateway.yaml changed.
        stamps.append(policy_stamps(self._retry_paths))
        return tuple(stamps)

    async def watch(self) -> None:
        """Poll the files every `interval_s` (`poll`). Cancel to stop."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.poll()
            except Exception as exc:  # noqa: BLE001 - a failed reload, reported: the watcher
                # must outlive any one bug; dead, it would apply no later change (a key
                # revoked in the keys file would be accepted until a restart)
                self._failed(f"unexpected error: {type(exc).__name__}", exc)

    async def poll(self) -> bool:
        """One look at the files: reload once a change has held still for a whole poll
        interval (the same size and mtime twice in a row), as the policy files' poll does.
        A gateway.yaml caught half written can still be valid YAML and a valid config, and
        a weaker one: cut before its `policy:` section it means the built-in policy, cut
        inside a tenant's `limits` it means no limit. A file that could not be read is
        read again unchanged, after a number of looks that doubles while it keeps
        failing. True if a changed config became active."""
        stamp = self._fingerprint()
        if self._settling.settled(stamp, self._stamp):
            return await self.reload(seen=stamp)
        if self._retry_in is not None and stamp == self._stamp:  # unchanged, unreadable
            self._retry_in -= 1
            if self._retry_in <= 0:
                return await self.reload(seen=stamp)
        return False

    def trigger(self) -> None:
        """Reload soon (SIGHUP): on the event loop, after any reload already running. A
        storm of signals queues at most one reload: one still waiting for the lock reads
        the files after every signal that came before it started."""
        if self._queued:
            return
        self._queued = True
        task = asyncio.create_task(self._triggered())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _triggered(self) -> None:
        async with self._lock:
            self._queued = False  # a signal from now on may follow what this one reads
            try:
                await self._reload()
            except Exception as exc:  # noqa: BLE001 - as in `watch`: a failed reload,
                # reported; raised here it only ended the signal's task, and the file's
                # new stamp (taken before) kept the poll from trying it again: unseen
                self._failed(f"unexpected error: {type(exc).__name__}", exc)

    async def reload(self, *, seen: tuple[object, ...] | None = None) -> bool:
        """Load the file again (and the policy files); True if a changed config, or an
        unchanged config's changed policy set, became active; `seen`: the look's stamp."""
        async with self._lock:
            if seen is not None and self._fingerprint() != seen:  # left to the next looks
                return False
            return await self._reload()

    async def _reload(self) -> bool:
        running = self._current()
        self._stamp = before = self._fingerprint()
        self._retry_in = None
        try:
            # Off the event loop: a keys file of 20,000 keys takes seconds to parse, and
            # every stream in flight would stall for them. The lock keeps reloads in order.
            fresh = await asyncio.to_thread(self._load)
            if self._fingerprint()[:-1] != before[:-1]:
                # Caught being written (a SIGHUP does not wait): cut short, maybe weaker
                why = "changed while it was read; read again once it holds still"
                raise ConfigError(str(self.path), [ConfigIssue("", None, why)])
        except ConfigError as exc:
            # Not what the file says but whether it could be read (out of file descriptors
            # under load, say): read again though it did not change, or a key revoked in
            # the keys file stayed valid in this process (one worker of `serve --workers`
            # while the others refused it); after 2 looks, then twice as many each time
            # it still fails (`_UNREADABLE_MAX_DOUBLINGS`).
            self._unreadable = self._unreadable + 1 if exc.unreadable else 0
            if exc.unreadable:
                self._read_again()
            return self._failed(f"{len(exc.issues)} problem(s); first: {exc.issues[0]}", exc)
        self._unreadable = 0
        self.needs_restart = restart_pending(running.config, fresh)
        fresh = pin_restart_only(running.config, fresh, self._log)
        # The same file, but a backend's CA or client certificate replaced on disk (a CA
        # withdrawn, a key rotated): its backend is rebuilt like a changed one.
        tls_changed = running.registry.tls_changed()
        if fresh == running.config and not tls_changed:
            # Only the policy files may have changed: whether a new set became active is
            # what this reload changed (the admin API answers it as `changed`).
            changed = await running.policies.reload_off_loop()
            self._succeeded()
            return changed
        read = running.policies.current
        # What assembling adjusts in the running backends it keeps (breaker settings, a
        # tenant's share of connections): put back if the assembly is not installed.
        adjusted = adjustable(running)
        paths = tuple(self.path.parent / p for p in (fresh.policy.paths if fresh.policy else ()))
        # And the TLS files it names: a refused config's new CA (invalid when read, written
        # after gateway.yaml or caught half written) is no running backend's file; without
        # its stamp here, its fix was never seen and the CA it replaces stayed trusted.
        paths += tls_paths(fresh, self.path.parent)
        policy_files = policy_stamps(paths)  # before they are read, never after
        try:
            # Off the event loop too: compiling a large policy set and building the
            # backends' TLS contexts (reading CA, certificate and key files) would stall
            # every stream in flight. The lock keeps reloads in order; the swap below
            # stays on the loop, between two requests' reads of the parts.
            parts = await asyncio.to_thread(self._assemble, fresh, running)
        except (PolicyError, ValueError) as exc:
            self._retry_paths = paths
            self._stamp = (*self._stamp[:-1], policy_files)
            if isinstance(exc.__cause__, OSError) or getattr(exc, "unreadable", False):
                # A backend's CA, certificate or key file, or a policy file or directory of
                # the new config, that could not be read (out of descriptors, an I/O error):
                # read again unchanged, as gateway.yaml is. Before, a CA withdrawn on disk
                # stayed trusted until the next change, and a config whose policy files
                # could not be read (a key revoked beside) waited for their next change.
                self._unreadable += 1
                self._read_again()
            return self._failed(str(exc).splitlines()[0], exc)
        if parts.policies.current.falls_back():  # its first hosted call waits for none
            await preload_litellm()
        await parts.scraper.scrape_once()  # know the new backends' health before routing
        while running.policies.current is not read:
            # The running set's watcher loaded a policy change while the new config was
            # built or probed: the files read for it may be older than what is enforced
            # now; never install them over it. Read them again (off the loop) until no
            # change was loaded meanwhile; nothing awaits between the last look and the swap.
            read = running.policies.current
            await parts.policies.reload_off_loop()
        # Labels from another header: refused (`relabels`), unless what runs served nothing
        # (read cut short, or its header not the other workers': `off_pin`)
        served = running.policies.read_whole and not running.policies.off_pin
        served = served and not self._unsettled
        relabel = relabels(read, parts.policies.current) if served else None
        if relabel or parts.policies.last_error is not None or not parts.policies.read_whole:
            # Read again and refused (the next edit caught half written): what was compiled
            # first is older than the set in force, a narrowing maybe. Or read while being
            # written (maybe weaker, cut short). Nothing changes; their next change retries.
            self._retry_paths = paths
            self._stamp = (*self._stamp[:-1], policy_files)
            self._discard(parts, running, adjusted)
            if parts.policies.read_failed:  # not what they say: read again unchanged
                self._unreadable += 1
                self._read_again()
            why = relabel or parts.policies.last_error or "they changed while they were read"
            return self._failed(f"policy files: {why}", ValueError(why))
        requests = self._install(parts)
        # Requests running now finish on the old parts: their next connection to a
        # backend whose TLS changed is made (and checked) with the new files.
        running.registry.hand_over_tls(parts.registry)
        self._succeeded()
        self._log.info(
            "config reloaded", **changes(running.config, fresh), tls_files_changed=tls_changed
        )
        retiring = replaced_backends(running, parts)
        timeout = fresh.limits.drain_timeout_s
        task = asyncio.create_task(retire(requests, timeout, retiring, running.proxy))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    def _read_again(self) -> None:
        """A file could not be read (`_unreadable` times in a row): behind (`stale`), and
        read again though unchanged, at the next look in a worker of several, else after
        a number of looks that doubles while it keeps failing."""
        self._behind = True
        backoff = 2 ** min(self._unreadable, _UNREADABLE_MAX_DOUBLINGS)
        self._retry_in = 1 if self.among_workers else backoff

    def _discard(self, parts: Assembly, running: Assembly, adjusted: Adjusted) -> None:
        """Undo what an assembly never installed did: put back the running backends'
        settings it adjusted (`adjustable`), close its own backends' pools (those it
        shares with the running one stay) and its proxy."""
        put_back(adjusted)
        own = replaced_backends(parts, running)
        task = asyncio.create_task(retire((), 0.0, own, parts.proxy))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _load(self) -> GatewaySettings:
        self._text = ""
        config, self._text = load_config_file(self.path, env=self._environ)
        return self._prepare(config)

    def _succeeded(self) -> None:
        self._behind = self._unsettled = False
        if self._retry_paths:  # the policy files of the refused config no longer matter
            self._retry_paths = ()
            self._stamp = (*self._stamp[:-1], ())
        self.last_error = None
        self.loaded_at = self._clock()

    def _failed(self, summary: str, exc: Exception) -> bool:
        """Count and report a failed reload; neither the summary (`last_error`, which the
        admin API answers) nor the logged problems quote what a `${VAR}` of the file read
        filled in: assembling it finds problems in values (a URL, a path) past the loader."""
        environ = os.environ if self._environ is None else self._environ
        summary, *problems = unquoted([summary, *str(exc).splitlines()[:20]], self._text, environ)
        self.reload_failures += 1
        self.last_error = summary
        self._log.error(
            "config reload failed; keeping the running config",
            path=str(self.path),
            problems=problems,
        )
        return False

    def status(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "loaded_at": self.loaded_at,
            "last_reload_error": self.last_error,
            "reload_failures": self.reload_failures,
            "needs_restart": self.needs_restart,
        }
