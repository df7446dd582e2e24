"""A backend's `/metrics`, `/props` and `/slots` are its word, not a measurement: numbers no
server could report (negative or infinite counts, a negative KV use, a slot count past
`MAX_LEARNED_SLOTS`) are unknown, so a compromised backend cannot make itself look idle
and draw every request of its model (other tenants' prompts included)."""

from __future__ import annotations

import sys
from types import FrameType

import pytest

from gateway.routing.load import demand_and_slots
from gateway.routing.prometheus import parse_metrics
from gateway.routing.scorers.queue import queue_score
from gateway.routing.scraper import (
    MAX_KEPT_BYTES,
    MAX_KEPT_LINES,
    MAX_SCRAPE_BYTES,
    filter_exposition,
)
from gateway.routing.signals import (
    MAX_LEARNED_SLOTS,
    BackendKind,
    BackendLoad,
    load_from_metrics,
    slots_total_from_props,
    slots_total_from_slots,
)
from tests.helpers.gateways import lone_backend


@pytest.mark.parametrize(
    ("kind", "text"),
    [
        # a huge running count makes a huge slot count; a negative queue cancels it out
        ("vllm", "vllm:num_requests_running 1e9\nvllm:num_requests_waiting -999999999"),
        ("vllm", "vllm:num_requests_running 4\nvllm:num_requests_waiting -Inf"),
        ("sglang", "sglang:num_running_reqs 1e12\nsglang:num_queue_reqs -1e12"),
        ("llamacpp", "llamacpp:requests_processing 1e9\nllamacpp:requests_deferred -1e9"),
    ],
)
def test_impossible_counts_are_unknown_and_attract_nothing(kind: BackendKind, text: str) -> None:
    scraped = load_from_metrics(kind, parse_metrics(text))
    busy = lone_backend(None, inflight=40)  # this gateway alone sends it 40 requests
    honest = queue_score(*demand_and_slots(busy, None))  # as a backend that says nothing
    assert queue_score(*demand_and_slots(busy, scraped)) <= honest
    assert scraped.waiting is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("vllm:num_requests_running -1", BackendLoad(None, None, None, None)),
        ("vllm:num_requests_waiting +Inf", BackendLoad(None, None, None, None)),
        ("vllm:kv_cache_usage_perc -0.5", BackendLoad(None, None, None, None)),
        ("vllm:kv_cache_usage_perc Inf", BackendLoad(None, None, None, None)),
        # what a real server says: kept
        ("vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0", BackendLoad(None, 0, 0, None)),
    ],
)
def test_each_impossible_signal_is_unknown(text: str, expected: BackendLoad) -> None:
    assert load_from_metrics("vllm", parse_metrics(text)) == expected


@pytest.mark.parametrize(
    ("props", "expected"),
    [
        ({"total_slots": MAX_LEARNED_SLOTS}, MAX_LEARNED_SLOTS),
        ({"total_slots": MAX_LEARNED_SLOTS + 1}, None),
        ({"total_slots": 2**62}, None),
    ],
)
def test_a_learned_slot_count_is_bounded(props: dict[str, object], expected: int | None) -> None:
    assert slots_total_from_props(props) == expected


@pytest.mark.parametrize(
    ("length", "expected"),
    [(0, None), (4, 4), (MAX_LEARNED_SLOTS, MAX_LEARNED_SLOTS), (MAX_LEARNED_SLOTS + 1, None)],
)
def test_a_slot_count_from_the_slots_list_is_bounded(length: int, expected: int | None) -> None:
    # A 16 MiB `/slots` of `[0,0,...]` is four million slots.
    assert slots_total_from_slots([{"id": n} for n in range(length)]) == expected


# --- what a scrape may cost: the lines read are bounded, found without splitting it ---

WANTED = frozenset({"a", "b"})


def test_the_lines_read_are_bounded() -> None:
    line = b'a{engine="' + b"x" * 1000 + b'"} 1\n'
    fits = line * (MAX_KEPT_BYTES // len(line))
    assert filter_exposition(fits, WANTED) == fits.decode()
    with pytest.raises(ValueError, match="more than"):
        filter_exposition(fits + line, WANTED)
    # one label value of megabytes: refused before the parser sees it
    with pytest.raises(ValueError, match="more than"):
        filter_exposition(b'a{engine="' + b"x" * 4 * MAX_KEPT_BYTES + b'"} 1\n', WANTED)


def test_the_lines_read_are_counted() -> None:
    # Short wanted lines, 256 KiB of them, were 9,000 lines parsed in Python each round
    # (40 ms of the event loop every `scrape.interval_s`); a server has a few per engine.
    lines = [b'a{engine="%d"} 1\n' % n for n in range(MAX_KEPT_LINES)]
    assert len(b"".join(lines)) < MAX_KEPT_BYTES
    assert filter_exposition(b"".join(lines), WANTED).count("\n") == MAX_KEPT_LINES
    with pytest.raises(ValueError, match=f"more than {MAX_KEPT_LINES} lines"):
        filter_exposition(b"".join(lines) + b"b 1\n", WANTED)


def test_other_lines_cost_nothing_and_are_never_decoded() -> None:
    other = b'other_metric{label="\xff"} 1\n' * (MAX_KEPT_BYTES // 8)
    assert filter_exposition(other + b"b 2\n" + other + b"a 1", WANTED) == "b 2\na 1\n"


def _c_calls(body: bytes) -> tuple[str, int]:
    """What `filter_exposition` keeps of `body`, and the C functions it called meanwhile
    (`bytes.find` and the like: a count of the lines it looked at in Python)."""
    calls = 0

    def count(_frame: FrameType, event: str, _arg: object) -> None:
        nonlocal calls
        calls += event == "c_call"

    previous = sys.getprofile()
    sys.setprofile(count)
    try:
        kept = filter_exposition(body, WANTED)
    finally:
        sys.setprofile(previous)
    return kept, calls


def test_lines_a_wanted_name_only_begins_are_not_looked_at_one_by_one() -> None:
    # 4 MiB of lines that begin with a wanted name and go on (`a_total`, `bX`): each was
    # found, cut out and looked at in Python, some 300,000 a scrape (0.1 s of the event
    # loop each `scrape.interval_s`); found with the byte after the name, they are passed
    # over by the search itself, and what is done in Python is bounded by what is kept.
    near = b"a_total 1\nbX 2\n" * (MAX_SCRAPE_BYTES // 15)
    kept, calls = _c_calls(near + b"a 1\n" + near + b'b{x="y"} 2')
    assert kept == 'a 1\nb{x="y"} 2\n'
    assert calls < 50, f"{calls} calls for two lines kept"


def test_a_line_ends_at_a_newline_only() -> None:
    # U+2028 may stand in a label value; str.splitlines() would have cut the line there.
    body = 'a{model_name="x\u2028b 99"} 1\n'.encode()
    samples = parse_metrics(filter_exposition(body, WANTED))
    assert [(s.name, s.value) for group in samples.values() for s in group] == [("a", 1.0)]
