"""Text from outside read in linear time: a backend's `/metrics`, a stream as an auditor
received it, a candidate config from the admin API. Each search below backtracked
super-linearly on the hostile shape used here (seconds at a few thousand characters,
hours at the sizes the gateway accepts); a regex search holds the interpreter (the event
loop too, even from a worker thread), so each runs in its own process, with a deadline
far above the milliseconds it now takes. The other searches of gateway/ were measured
linear (docs/security.md, "Text from outside is searched in linear time")."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gateway.config.env_refs import referenced_variables
from gateway.provenance.formats.stream_body import committed_bodies
from gateway.routing.prometheus import parse_metrics

DEADLINE_S = 60.0


def _run(script: str, data: bytes) -> str:
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=data,
        capture_output=True,
        timeout=DEADLINE_S,
        check=True,
    )
    return done.stdout.decode().strip()


@pytest.mark.parametrize(
    "value",
    ["1" * 200_000 + "x", "1" * 100_000 + "." + "1" * 100_000 + "x"],
    ids=["digits", "fraction"],
)
def test_a_metrics_value_of_digits_is_refused_in_time(value: str) -> None:
    # A backend's wanted sample with a value of digits and a bad last character: the float
    # pattern split the run every way before failing (cubic; 4,000 digits took seconds,
    # and a kept line may be 256 KiB, parsed on the event loop every scrape).
    body = f"vllm:num_requests_running {value}\n".encode()
    script = (
        "import sys; from gateway.routing.prometheus import parse_metrics; "
        "from gateway.routing.scraper import filter_exposition; "
        "from gateway.routing.signals import metric_names\n"
        "try: parse_metrics(filter_exposition(sys.stdin.buffer.read(), metric_names('vllm')))\n"
        "except ValueError as exc: print(str(exc)[:21])"
    )
    assert _run(script, body) == "line 1: invalid value"


def test_metrics_values_still_read() -> None:
    text = "a 1\nb 1.\nc .5e-3\nd -1.5E+2\ne +Inf\nf NaN\n"
    assert [s[0].value for s in parse_metrics(text).values()][:4] == [1.0, 1.0, 0.0005, -150.0]


def test_a_stream_of_error_event_starts_is_read_in_time() -> None:
    # A backend's last line of 512 KiB of `data: {"error":{`: the error event was searched
    # for from each of them, reading the line to its end each time (quadratic: 12 s at
    # 64 KiB, so minutes here).
    received = b'data: {"error":{' * 32_768 + b"\n\n: owngate-receipt AAAA\n\n"
    script = (
        "import sys; from gateway.provenance.formats.stream_body import committed_bodies; "
        "print(len(committed_bodies(sys.stdin.buffer.read())))"
    )
    assert _run(script, received) == "1"


def test_the_error_event_is_still_found() -> None:
    before = b'data: {"a":1}\n\n'
    body = before + b'data: {"error":{"message":"x"}}\n\n'
    candidates = committed_bodies(body + b": owngate-receipt AAAA\n\n")
    assert candidates == (body, before, before[:-1], before[:-2])


def test_a_config_of_unclosed_references_is_read_in_time() -> None:
    # A candidate config (admin API, operator or security role) ending in `${a:-` with no
    # `}` after them: each was searched for a `}` to the end of the text (quadratic; the
    # validation thread held the interpreter, and so the gateway's event loop, for hours).
    text = ("y: ${B}\nx: " + "${a:-" * 50_000).encode()
    script = (
        "import sys; from gateway.config.env_refs import referenced_variables as r, "
        "interpolate as i\n"
        "t = sys.stdin.read(); print(sorted(r(t)), len(i(t, (), 1, [], {})))"
    )
    assert _run(script, text) == f"['B'] {len(text) - len('${B}')}"


def test_config_references_still_read() -> None:
    assert referenced_variables("a: ${A:-x}} ${B} ${C:-") == {"A", "B"}
