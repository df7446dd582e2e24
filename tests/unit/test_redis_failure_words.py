"""What a failed Redis call says (gateway/state/redis_keys.py `describe_failure`): redis-py's
own words, never the text a server sent, which may quote the command it refused."""

from __future__ import annotations

import redis.exceptions as errors

from gateway.state.redis_keys import describe_failure

PASSWORD = "SecRedisUnit0a4f"


def test_a_servers_error_is_told_by_its_class_and_length_only() -> None:
    echoed = f"unknown command 'HELLO', with args beginning with: '3' 'AUTH' 'default' '{PASSWORD}'"
    for exc in (
        errors.ResponseError(echoed),
        errors.AuthenticationError(echoed),
        errors.BusyLoadingError(echoed),
        errors.NoPermissionError(echoed),
        errors.InvalidResponse(f"Protocol Error: b'{PASSWORD}'"),
    ):
        described = describe_failure(exc, 0.05)
        assert PASSWORD not in described, described
        assert described.startswith(type(exc).__name__ + ": [message withheld: ")


def test_redis_pys_own_words_are_kept() -> None:
    refused = "Error 111 connecting to 127.0.0.1:6379. Connection refused."
    assert describe_failure(errors.ConnectionError(refused), 0.05) == f"ConnectionError: {refused}"
    assert describe_failure(TimeoutError(), 0.05) == "no answer within 50 ms"
    assert describe_failure(errors.TimeoutError("Timeout reading"), 0.05).endswith("reading")


def test_redis_error_codes_without_a_class_of_their_own_are_named() -> None:
    """`WRONGTYPE` (another program's value under the prefix) and `BUSY` (another
    program's script holding Redis) have no class in redis-py: before, both read
    `ResponseError: [message withheld: N characters]`, as any other, and an operator
    could not tell which fault kept the replicas degraded. The code is named, as a word of
    a fixed list; the rest stays withheld."""
    for said in (
        "WRONGTYPE Operation against a key holding the wrong kind of value script: 1f, on "
        f"@user_script:20. {PASSWORD}",
        "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
    ):
        code = said.split(" ", 1)[0]
        described = describe_failure(errors.ResponseError(said), 0.05)
        assert described == f"ResponseError {code}: [message withheld: {len(said)} characters]"
    # A first word off the list is the server's own and stays withheld, whatever it is.
    for said in (f"{PASSWORD} unknown", "WRONGTYPEX x", "wrongtype x", "ERR x", "OOM"):
        described = describe_failure(errors.ResponseError(said), 0.05)
        assert described == f"ResponseError: [message withheld: {len(said)} characters]"
