"""The shared-state benchmark (`owngate bench state`): a short run against a real
redis-server reports acquire and release for both backends, memory and Redis."""

from __future__ import annotations

import argparse
import io

import pytest

from owngate_bench import state as state_bench
from tests.helpers.redis_server import RedisServer

pytestmark = [pytest.mark.bench, pytest.mark.redis]


def test_bench_reports_both_backends(redis_server: RedisServer) -> None:
    parser = argparse.ArgumentParser()
    state_bench.add_arguments(parser)
    argv = ["--redis-url", redis_server.url, "--requests", "300", "--timeout-ms", "5000"]
    out = io.StringIO()
    code = state_bench.run(parser.parse_args(argv), out=out)
    lines = out.getvalue().splitlines()
    assert code == 0, lines
    assert [line.split()[:2] for line in lines[1:]] == [
        ["memory", "acquire"],
        ["memory", "release"],
        ["redis", "acquire"],
        ["redis", "release"],
    ]
