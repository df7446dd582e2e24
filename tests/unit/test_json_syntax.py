"""The syntax scan for answers past the read bounds (gateway/api/json_syntax.py): the
verdict of `json.loads`, with memory bounded and its steps counted."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api import answer_reads, json_syntax
from gateway.api.answer_reads import Unscanned, check_readable
from gateway.api.usage_read import MAX_CONTAINERS, MAX_FALLBACK
from gateway.upstream.http import UpstreamError


def loads_refuses(text: bytes) -> bool:
    """Whether `json.loads` refuses `text`, UTF-8 as `utf8_document` hands it on (a byte
    order mark taken off already: one more is refused)."""
    try:
        json.loads(text.decode("utf-8", "surrogatepass"))
    except ValueError:  # (UnicodeDecodeError is one)
        return True
    return False


CASES = [
    b"{}",
    b" [ ] ",
    b'{"a":[1,2.5e-3,-0,true,false,null,NaN,-Infinity,Infinity,"\\u00e9\\n\\"x"]}',
    b"[" * 40 + b"]" * 40,
    b'{"a":' * 40 + b"1" + b"}" * 40,
    b"[[[[[1],[2,[[]]]]]],{}]",
    b'{"a":[{"b":[{"c":[{"d":[]}]}]}],"e":{"f":{"g":{"h":{}}}}}',
    b'"\xed\xa0\x80"',  # a lone surrogate, as `surrogatepass` writes it
    b'"\xc3\xa9"',
    b"123456789012345678901234567890",
    b"",
    b"  ",
    b"[1,]",
    b'{"a":1,}',
    b"[,1]",
    b'{"a" 1}',
    b"{1:2}",
    b'{"a":1 "b":2}',
    b"[1 2]",
    b"[01]",
    b"[1.]",
    b"[.5]",
    b"[+1]",
    b"[1e]",
    b"[-]",
    b"[tru]",
    b"[nul]",
    b"[-NaN]",
    b"[Infinityx]",
    b'["\\x"]',
    b'["\\u12g4"]',
    b'["a\x01"]',
    b'["\xff"]',
    b'["\xc3"]',
    b"[" * 40 + b"]" * 39,
    b"[" * 40 + b"]" * 41,
    b"[[[[[[}]]]]]",
    b"{}{}",
    b"{} x",
    b"\xef\xbb\xbf{}",
    b'{"a":' + b"[" * 20 + b"x",
    b"[1]\x00",
    # `int` converts no more than 4,300 digits: `json.loads` refuses a longer integer
    b"1" * 4300,
    b"[" + b"1" * 4301 + b"]",
    b'{"a":-' + b"9" * 4301 + b"}",
    b"[" + b"1" * 4301 + b".5," + b"1" * 4301 + b"e-3]",  # a float of any length reads
    b"[" + b"1" * 4301 + b".]",
    b"[" + b"1" * 4301 + b"e]",
]


@pytest.mark.parametrize("text", CASES)
def test_the_scan_refuses_what_json_loads_refuses(text: bytes) -> None:
    assert json_syntax.refused(text) is loads_refuses(text)


_SCALARS = st.sampled_from([b"1", b"-0.5e+3", b'"s\\"x"', b"true", b"null", b"NaN", b'""'])
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda xs: b"[" + b" , ".join(xs) + b"]"),
        st.lists(inner, max_size=4).map(
            lambda xs: b"{" + b",".join(b'"k":' + x for x in xs) + b"}"
        ),
    ),
    max_leaves=30,
)
_PIECES = st.sampled_from([b"[", b"]", b"{", b"}", b",", b":", b'"', b"1", b"\\", b" ", b"x"])


@settings(max_examples=400, deadline=None)
@given(_VALUES, st.integers(min_value=0), st.integers(min_value=0, max_value=2), _PIECES)
def test_the_scan_agrees_with_json_loads_on_values_and_their_mutations(
    value: bytes, at: int, how: int, piece: bytes
) -> None:
    at %= len(value) + 1
    text = [value, value[:at] + piece + value[at:], value[:at] + value[at + 1 :]][how]
    assert json_syntax.refused(text) is loads_refuses(text)


def test_past_its_steps_a_document_is_unchecked_not_judged() -> None:
    # each level a step or more: `[1,` nests deeper than one match takes
    deep = b"[1," * json_syntax.MAX_STEPS + b"2" + b"]" * json_syntax.MAX_STEPS
    with pytest.raises(json_syntax.Unchecked):
        json_syntax.refused(deep)
    assert json_syntax.refused(b"[1," * 1000 + b"2" + b"]" * 1000) is False


@pytest.mark.parametrize(
    "body",
    [
        b'{"a":[' + b"[]," * (5 << 20) + b"0]}",  # 15 MiB, one match
        b'{"a":[' + b'{"a":{}},' * (1 << 20) + b"0]}",
        b"[" * (4 << 20) + b"]" * (4 << 20),  # a byte a level on the stack
    ],
    ids=["arrays", "objects", "nested"],
)
def test_the_scan_builds_nothing(body: bytes) -> None:
    """Where `orjson.loads` of the first grew the process by 510 MB."""
    json_syntax.refused(b"[]")  # its expressions compiled
    cut = body[:-1]
    tracemalloc.start()
    try:
        assert json_syntax.refused(body) is False
        assert json_syntax.refused(cut) is True
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # a few MiB of text decoded or sliced at a time; the stack, a byte an open level
    assert peak < (8 << 20) + (len(body) if body.startswith(b"[[") else 0)


PAST = b'{"id":"c","x":[' + b"[]," * (MAX_CONTAINERS + 1) + b"0]}"


def test_an_answer_past_the_bound_is_judged_by_its_syntax() -> None:
    assert check_readable(PAST) is None  # read: relayed with its usage unknown
    assert check_readable(PAST, closed=True) is None  # whole
    for broken in (PAST[:-1], PAST + b"x", PAST.replace(b"[],", b"[]x", 1)):
        with pytest.raises(UpstreamError) as shape:
            check_readable(broken)
        assert shape.value.kind == "shape"
        with pytest.raises(UpstreamError) as closed:
            check_readable(broken, closed=True)
        assert closed.value.kind == "closed"
    with pytest.raises(UpstreamError) as not_object:
        check_readable(PAST[PAST.index(b"[") : -1])
    assert not_object.value.kind == "shape"


def test_an_answer_past_the_fallback_bound_with_a_long_integer_is_refused() -> None:
    """Over 1 MiB, an answer orjson refuses is past the standard library's bound too
    (`MAX_FALLBACK`): one whose integer of 5,000 digits `json.loads` refuses (`int`
    converts at most 4,300) was judged readable, relayed and recorded as served."""
    padding = b'"' + b"a" * (MAX_FALLBACK + 1) + b'"'
    body = b'{"id":"c","n":' + b"7" * 5000 + b',"pad":' + padding + b"}"
    with pytest.raises(UpstreamError) as shape:
        check_readable(body)
    assert shape.value.kind == "shape"
    readable = body.replace(b"7" * 5000, b"7" * 4300)
    assert check_readable(readable) is None  # read: relayed with its usage unknown


def test_the_event_loop_keeps_turning_while_an_answer_past_the_bound_is_scanned() -> None:
    """Run on the loop, one 4 MiB answer held it for the whole scan (no turn at all); in a
    worker thread, in matches of a few ms, the loop gets the interpreter back in between."""
    body = b'{"a":[' + b"[1,2]," * (700 << 10) + b"0]}"
    json_syntax.refused(b"[]")  # its expressions compiled

    async def turns_during_the_check() -> int:
        done = asyncio.Event()
        turns = 0

        async def turn() -> None:
            nonlocal turns
            while not done.is_set():
                await asyncio.sleep(0)
                turns += 1

        turning = asyncio.create_task(turn())
        await asyncio.sleep(0)  # it turned once before the check
        before = turns
        with pytest.raises(Unscanned) as past:
            check_readable(body, aside=True)
        await past.value.scanned()
        during = turns - before
        done.set()
        await turning
        return during

    assert asyncio.run(turns_during_the_check()) > 2


class _BlockedScan:
    """`json_syntax.refused` held until `release` is set, telling the loop it started."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.started = asyncio.Event()
        self.release = threading.Event()
        self._loop = loop

    def __call__(self, text: bytes) -> bool:
        self._loop.call_soon_threadsafe(self.started.set)
        self.release.wait(60)
        return False


def test_a_scan_takes_no_thread_of_the_default_executor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hostile backend's answers past the bound took every thread of the loop's default
    executor, which also looks up the host names of connections to the other backends,
    reloads the config and writes cosignature files: those waited for its scans."""

    async def other_thread_work_while_a_scan_runs() -> int:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))  # one, taken by a scan before
        scan = _BlockedScan(loop)
        monkeypatch.setattr(json_syntax, "refused", scan)
        with pytest.raises(Unscanned) as past:
            check_readable(PAST, aside=True)
        scanning = asyncio.create_task(past.value.scanned())
        try:
            await asyncio.wait_for(scan.started.wait(), 30)
            return await asyncio.wait_for(asyncio.to_thread(int, "42"), 10)
        finally:
            scan.release.set()
            await scanning

    assert asyncio.run(other_thread_work_while_a_scan_runs()) == 42


def test_a_cancelled_scan_is_waited_for_while_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The relay gives the answer's budget back once the request ends: a request whose
    client left mid-scan ended at once while the thread still held the answer (16 MiB,
    one a thread), uncounted."""

    async def cancelled_mid_scan() -> tuple[bool, bool]:
        scan = _BlockedScan(asyncio.get_running_loop())
        monkeypatch.setattr(json_syntax, "refused", scan)
        with pytest.raises(Unscanned) as past:
            check_readable(PAST, aside=True)
        scanning = asyncio.create_task(past.value.scanned())
        try:
            await asyncio.wait_for(scan.started.wait(), 30)
            scanning.cancel()
            for _ in range(20):  # turns enough for a cancelled await to end
                await asyncio.sleep(0)
            ended_while_scanning = scanning.done()
        finally:
            scan.release.set()
        try:
            await scanning
        except asyncio.CancelledError:
            return ended_while_scanning, True
        return ended_while_scanning, False

    assert asyncio.run(cancelled_mid_scan()) == (False, True)


def test_a_long_answer_with_logprobs_past_the_bound_is_relayed() -> None:
    """60,000 tokens with one alternative each: past `MAX_CONTAINERS` (five arrays and
    objects a token), some 8 steps a token; the fixed 262,144 steps gave up on it and the
    answer the client reads was a failed attempt (`shape`), 502 with no other backend."""
    token = (
        b'{"token":"tok","logprob":-0.12,"bytes":[116,111,107],'
        b'"top_logprobs":[{"token":"alt","logprob":-1.5,"bytes":[97,108,116]}]}'
    )
    body = (
        b'{"id":"c","object":"chat.completion","choices":[{"index":0,"message":'
        b'{"role":"assistant","content":"hi"},"logprobs":{"content":['
        + b",".join([token] * 60000)
        + b"]}}]}"
    )
    assert check_readable(body) is None  # read: relayed with its usage unknown
    with pytest.raises(UpstreamError) as cut:
        check_readable(body[:-1])
    assert cut.value.kind == "shape"


def test_a_refused_scan_leaves_no_cycle_holding_the_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The relay gives the answer's budget back when the attempt fails: the scan's error
    must not keep it (`Unscanned` holds the answer) in a cycle only the collector frees.
    (The scan's thread lets go of its future a moment after the loop got the verdict:
    its executor is shut down, the thread joined, before the collection.)"""
    scans = ThreadPoolExecutor(1)
    monkeypatch.setattr(answer_reads, "_SCANS", scans)

    async def refused_scan() -> bool:
        try:
            check_readable(PAST[:-1], aside=True)
        except Unscanned as past:
            try:
                await past.scanned()
            except UpstreamError:
                return True
        return False

    gc.collect()
    gc.disable()
    try:
        assert asyncio.run(refused_scan())
        scans.shutdown(wait=True)
        gc.set_debug(gc.DEBUG_SAVEALL)  # what the collection finds unreachable, kept
        gc.collect()
        cyclic = [type(found).__name__ for found in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert "Unscanned" not in cyclic


def test_a_string_of_many_escapes_does_not_hold_the_loop_for_its_scan() -> None:
    """A match took a string whole, each escape a turn of the expression engine, which
    never lets go of the interpreter: 16 MiB of `\\/` (past the bounds: over 1 MiB, and
    orjson refuses its lone surrogate) held the loop 0.59 s, its whole scan, in one match.
    The loop's longest wait is told against the scan's length, on any machine."""
    body = b'{"id":"c","s":"' + b"\\/" * (4 << 20) + b'\\ud800"}'
    json_syntax.refused(b"[]")  # its expressions compiled

    async def longest_wait_and_scan() -> tuple[float, float]:
        done = asyncio.Event()
        longest = 0.0

        async def turn() -> None:
            nonlocal longest
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0)
                now = time.perf_counter()
                longest, last = max(longest, now - last), now

        with pytest.raises(Unscanned) as past:
            check_readable(body, aside=True)
        turning = asyncio.create_task(turn())
        await asyncio.sleep(0)  # it turned once before the scan
        started = time.perf_counter()
        await past.value.scanned()
        scan = time.perf_counter() - started
        done.set()
        await turning
        return longest, scan

    longest, scan = asyncio.run(longest_wait_and_scan())
    assert longest < scan / 4
