"""The Redis ACL docs/state.md gives owngate's user ("Who else may use the Redis") allows
every command owngate runs on Redis and nothing more: the commands of every script in
gateway/state/lua.py, redis_revocations.py and redis_replay.py, and what redis-py sends
itself. A script that starts running a command the rule lacks fails here, before a deployment that
followed the docs finds its replicas degraded (`NoPermissionError`)."""

from __future__ import annotations

import re

from gateway.state import lua
from gateway.state.redis_keys import RedisKeys
from gateway.state.redis_replay import CHARGE
from gateway.state.redis_revocations import READ
from tests.helpers.paths import REPO_ROOT

# What redis-py sends besides the scripts: EVALSHA, SCRIPT LOAD when Redis lacks a script,
# CLIENT SETNAME as it connects (`_client` names each connection), SELECT for a database
# other than 0. (AUTH and HELLO need no permission.)
CLIENT_COMMANDS = {"evalsha", "script|load", "client|setname", "select"}


def documented_rule() -> list[str]:
    text = (REPO_ROOT / "docs" / "state.md").read_text()
    rules = [line for line in text.splitlines() if line.startswith("ACL SETUSER owngate ")]
    assert len(rules) == 1, rules
    return rules[0].split()


def scripts_commands() -> set[str]:
    scripts = [getattr(lua, name) for name in lua.__all__ if name != "RESTORE_BATCH"]
    scripts += [READ, CHARGE]
    assert all(isinstance(script, str) for script in scripts)
    called = {c.lower() for script in scripts for c in re.findall(r"redis\.call\('(\w+)'", script)}
    # every call names its command as a literal: a computed one would escape this check
    assert sum(script.count("redis.call(") for script in scripts) == sum(
        len(re.findall(r"redis\.call\('\w+'", script)) for script in scripts
    )
    assert not any("redis.pcall(" in script for script in scripts)
    return called


def test_the_documented_acl_allows_what_owngate_runs_and_nothing_more() -> None:
    rule = documented_rule()
    assert rule[:5] == ["ACL", "SETUSER", "owngate", "on", ">PASSWORD"]
    modifiers = rule[5:]
    assert modifiers[:4] == ["resetkeys", "~{owngate}:*", "resetchannels", "-@all"]
    allowed = [m.removeprefix("+") for m in modifiers[4:]]
    assert all(m.startswith("+") for m in modifiers[4:]), modifiers
    needed = scripts_commands() | CLIENT_COMMANDS
    assert set(allowed) == needed, (sorted(set(allowed) - needed), sorted(needed - set(allowed)))
    assert len(allowed) == len(set(allowed))


def test_every_key_owngate_writes_matches_the_documented_pattern() -> None:
    keys = RedisKeys("owngate")
    names = [value for name, value in vars(keys).items() if not name.startswith("_")]
    names += [keys.slots("t"), keys.held("t"), keys.requests("t"), keys.tokens("t")]
    assert len(names) == 10, names
    assert all(name.startswith("{owngate}:") for name in names), names
