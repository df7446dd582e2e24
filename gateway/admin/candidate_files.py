"""Which files a candidate config (`POST /admin/v1/config/validate`) may make the gateway
read: those under the running config's directory, and those the running config itself
reads (under a policy or log directory it names, or a file it names).

A candidate comes from an admin client (an operator's or a security team's token), and
validating it reads every file it names, as `owngate serve` would: policy files and
directories (walked for `*.yaml`), the keys file, the backends' TLS files, the log's key
files, directory and high-water file. Named anywhere on the host, that was a read of the
host's files for a token that was never given them: `policy: {paths: ["/"]}` walked the
whole filesystem (tens of seconds of a worker thread, the one candidate parse held, and
an answer of thousands of problems naming every YAML file on the host), and a problem
about a file quoted what it held (a document's `apiVersion` and `kind`, a mapping's key
names, a YAML tag). A path outside both is a problem named before any file is read, and
so is a link to a file outside both among the files of a policy directory it names (the
policy loader reads a link to a file wherever it points); `owngate config validate` on
the host checks any path. The paths are checked before anything is read, and read a
moment later: the admin API reads them inside `confined_reads.confined(reading_roots(...))`,
which checks each file as it is opened, so a link swapped in between is refused, not read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from gateway.config.issues import ConfigIssue
from gateway.config.schema import GatewaySettings
from gateway.confined_reads import within
from gateway.policy.source import discover

__all__ = ["outside_files", "reading_roots"]

_OUTSIDE = (
    "{value!r} is outside the files this gateway reads: a candidate sent to the admin API "
    "may name files under the running config's directory or those the running config "
    "reads (check any other path with `owngate config validate` on the host)"
)
_NUL = "a path may not hold a NUL byte"
_UNLISTED = "{value!r} cannot be listed"
_LINKED = (
    "{value!r} holds {file!r}, a link to a file outside the files this gateway reads (a "
    "candidate sent to the admin API reads none of those)"
)


def outside_files(
    candidate: GatewaySettings, running: GatewaySettings, config_dir: Path
) -> list[ConfigIssue]:
    """A problem for each path `candidate` names (relative to `config_dir`, as both
    configs' are) that resolves outside `config_dir` and outside what `running` reads."""
    roots = reading_roots(running, config_dir)
    issues: list[ConfigIssue] = []
    walked: set[str] = set()  # a policy path named again is checked (walked) once
    for loc, value in _named(candidate, config_dir):
        if loc[0] == "policy":
            if value in walked:
                continue
            walked.add(value)
        if "\0" in value:  # names no file (and resolving it raised ValueError: a 500)
            issues.append(ConfigIssue(_where(loc), None, _NUL, loc))
        elif not _inside(_resolved(config_dir, value), roots):
            issues.append(ConfigIssue(_where(loc), None, _OUTSIDE.format(value=value), loc))
        elif (files := _policy_files([(loc, value)], config_dir)) is None:
            issues.append(ConfigIssue(_where(loc), None, _UNLISTED.format(value=value), loc))
        else:  # a policy directory's files too: a link among them may point anywhere
            issues += [
                ConfigIssue(_where(loc), None, _LINKED.format(value=value, file=str(file)), loc)
                for file in files
                if not _inside(os.path.realpath(file), roots)
            ]
    return issues


def reading_roots(running: GatewaySettings, config_dir: Path) -> list[str]:
    """The real paths a candidate's files may lie under: `config_dir`, and what `running`
    reads (its named paths, and the files of its policy directories, links resolved)."""
    read = list(_named(running, config_dir))
    roots = [_resolved(config_dir, ".")] + [_resolved(config_dir, value) for _, value in read]
    return roots + [os.path.realpath(file) for file in _policy_files(read, config_dir) or ()]


def _named(
    config: GatewaySettings, config_dir: Path
) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """Every path `config` makes the gateway read, with where it is set."""
    if config.policy is not None:
        for index, path in enumerate(config.policy.paths):
            yield ("policy", "paths", index), path
    if config.keys_file is not None:
        yield ("keys_file",), config.keys_file
    for index, backend in enumerate(config.backends):
        tls = backend.tls
        for name in ("ca_file", "client_cert_file", "client_key_file"):
            value = getattr(tls, name) if tls is not None else None
            if value is not None:
                yield ("backends", index, "tls", name), value
    log = config.provenance
    if log is not None:
        yield ("provenance", "dir"), log.dir
        yield ("provenance", "signing_key_file"), log.signing_key_file
        for index, path in enumerate(log.previous_signing_key_files):
            yield ("provenance", "previous_signing_key_files", index), path
        # As written, relative to `config_dir` like the others: `high_water_path` has
        # joined it already, and a relative `config_dir` joined twice (`serve --config
        # deploy/gateway.yaml`) let `../x` pass for a file under it. Unset: its default.
        high_water = log.high_water_file or str(log.high_water_path(config_dir))
        yield ("provenance", "high_water_file"), high_water


def _policy_files(
    named: Iterable[tuple[tuple[str | int, ...], str]], config_dir: Path
) -> list[Path] | None:
    """The files read of the policy paths among `named`, as the policy loader finds them
    (a directory listed, links to files kept, links to directories never walked); None
    when they cannot be listed (a name too long for the filesystem: OSError)."""
    paths = [config_dir / value for loc, value in named if loc[0] == "policy"]
    try:
        return discover(paths)[0] if paths else []
    except OSError:
        return None


def _where(loc: tuple[str | int, ...]) -> str:
    """`policy.paths[0]`: where a value is set, as the config loader names it."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)[1:]


def _resolved(config_dir: Path, value: str) -> str:
    """The path `value` names, relative to `config_dir`, with every link followed."""
    return os.path.realpath(os.path.join(config_dir, value))


def _inside(path: str, roots: list[str]) -> bool:
    return any(within(path, root) for root in roots)
