"""A llama.cpp backend's `/props` and `/slots` answers are its word, read within bounds.

The scraper asks a llama.cpp backend without `capacity.max_concurrency` for its slot count
on every round until it learns one (gateway/routing/scraper.py). A hostile backend that
answers both with a document of millions of empty arrays (`[[],[],...]`, within the 4 MiB
a scrape may read) never lets it learn one, and each parse of such a document built some
1.4 million lists on the event loop: about 120 MB and 0.3 s a document, two a round,
every `scrape.interval_s` (0.5 s by default), so one backend held the gateway's event
loop most of the time. A document longer, or with more arrays and objects, than any slot
list is not parsed: no slot count is learned from it, and it costs no more than its bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import tracemalloc
from collections.abc import AsyncIterator, Callable

import orjson
import pytest

from gateway.config.schema import ScrapeSettings
from gateway.routing.registry import BackendState, Registry
from gateway.routing.scraper import (
    MAX_SCRAPE_BYTES,
    MAX_SLOT_BACKOFF_ROUNDS,
    MAX_SLOTS_BYTES,
    MetricsScraper,
)
from tests.helpers.accepted import close_server
from tests.helpers.gateways import backend, gateway_config
from tests.helpers.scripted_upstream import read_request

MIB = 1024 * 1024
# Millions of empty arrays, a few bytes under what a scrape reads.
LISTS = b"[" + b"[]," * (MAX_SCRAPE_BYTES // 3 - 2) + b"[]]"
OBJECTS = b"[" + b"{}," * (MAX_SCRAPE_BYTES // 3 - 2) + b"{}]"
# One object, of some 400,000 members
MEMBERS = b"{" + b",".join(b'"%x":0' % n for n in range(MAX_SCRAPE_BYTES // 11)) + b"}"


def _answer(body: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    return head % len(body) + body


@dataclasses.dataclass
class _Llama:
    """A llama.cpp backend answering each request with `answer(path)`, as the scraper of a
    gateway sees it: the paths it was asked for and the connections opened to it."""

    answer: Callable[[bytes], bytes]
    asked: list[bytes] = dataclasses.field(default_factory=list)
    connections: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                path = (await read_request(reader)).split(b" ", 2)[1]
                self.asked.append(path)
                writer.write(self.answer(path))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    @contextlib.asynccontextmanager
    async def scraped(self) -> AsyncIterator[tuple[BackendState, MetricsScraper]]:
        """The backend served, and a scraper of it (as a `kind: llamacpp` backend without
        `capacity.max_concurrency`)."""
        server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        config = gateway_config([backend("cpu", url, "m", kind="llamacpp")])
        state = Registry.build(config, environ={}).backends["cpu"]
        scraper = MetricsScraper([state], ScrapeSettings(timeout_s=60.0, staleness_s=120.0))
        try:
            yield state, scraper
        finally:
            await scraper.close()
            await close_server(server)


async def _learn_from(
    document: bytes, props: bytes | None = None
) -> tuple[int | None, list[bytes], int]:
    """One scrape round of a llama.cpp backend answering `/props` and `/slots` with
    `document` (`/props` with `props` if given): the slot count it learned, the paths it
    asked for, and the peak of the memory allocated meanwhile."""

    def answer(path: bytes) -> bytes:
        if path == b"/props" and props is not None:
            return _answer(props)
        return _answer(document if path in (b"/props", b"/slots") else b"")

    llama = _Llama(answer)
    async with llama.scraped() as (state, scraper):
        tracemalloc.start()
        try:
            await scraper.scrape_once()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    return state.learned_slots, llama.asked, peak


@pytest.mark.parametrize(
    "document", [LISTS, OBJECTS, MEMBERS], ids=["arrays", "objects", "members"]
)
def test_a_slot_answer_of_millions_of_values_is_not_parsed(document: bytes) -> None:
    learned, asked, peak = asyncio.run(_learn_from(document))
    assert learned is None
    assert b"/props" in asked and b"/slots" in asked  # both were read, and refused
    # The two answers' bytes, and the copies the read makes of them; parsed, each was
    # some 120 MB of lists (objects: as many dicts; members: 90 MB of keys)
    assert peak < 40 * MIB, f"{peak / MIB:.0f} MiB allocated while learning slots"


# Within the byte bound: some 175,000 empty arrays or objects, under 512 KiB.
SHORT_LISTS = b"[" + b"[]," * (MAX_SLOTS_BYTES // 3 - 2) + b"[]]"
SHORT_OBJECTS = b"[" + b"{}," * (MAX_SLOTS_BYTES // 3 - 2) + b"{}]"


@pytest.mark.parametrize("document", [SHORT_LISTS, SHORT_OBJECTS], ids=["arrays", "objects"])
def test_a_short_answer_of_many_arrays_is_not_parsed(document: bytes) -> None:
    # Its arrays and objects are counted before it is parsed: parsed, each was ~28 MB.
    assert len(document) <= MAX_SLOTS_BYTES
    learned, asked, peak = asyncio.run(_learn_from(document))
    assert learned is None
    assert b"/slots" in asked
    assert peak < 8 * MIB, f"{peak / MIB:.0f} MiB allocated while learning slots"


# What llama-server answers: a slot of its `/slots` as today's server writes it (its
# request's sampling parameters; 1.3 KiB, more with the prompt an older server added),
# as many as fit the bound, and a `/props` of 1,024 slots whose chat template is long and
# full of braces. A `/props` without `total_slots` (servers before 2024) sends the scraper
# to `/slots`, learned up to some 400 such slots (docs/configuration.md).
_PARAMS = {
    **dict.fromkeys(("n_predict", "max_tokens", "n_keep", "n_discard", "n_probs"), -1),
    **dict.fromkeys(("temperature", "dynatemp_range", "dynatemp_exponent", "top_p"), 0.8),
    **dict.fromkeys(("min_p", "top_n_sigma", "xtc_probability", "xtc_threshold"), 0.05),
    **dict.fromkeys(("typical_p", "repeat_penalty", "presence_penalty"), 1.0),
    **dict.fromkeys(("frequency_penalty", "dry_multiplier", "dry_base", "mirostat_tau"), 0.1),
    **dict.fromkeys(("seed", "top_k", "repeat_last_n", "dry_allowed_length"), 4294967295),
    **dict.fromkeys(("dry_penalty_last_n", "mirostat", "min_keep", "mirostat_eta"), 4096),
    **dict.fromkeys(("ignore_eos", "stream", "grammar_lazy", "reasoning_in_content"), False),
    **dict.fromkeys(("thinking_forced_open", "timings_per_token", "post_sampling_probs"), False),
    **dict.fromkeys(("speculative.n_max", "speculative.n_min", "speculative.p_min"), 0.75),
    **{key: [] for key in ("stop", "logit_bias", "grammar_triggers", "preserved_tokens", "lora")},
    "dry_sequence_breakers": ["\n", ":", '"', "*"],
    "grammar": "",
    "chat_format": "Content-only",
    "reasoning_format": "auto",
    "samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc"],
}
_NEXT = {"has_next_token": True, "has_new_line": False, "n_remain": -1, "n_decoded": 0}


def _slot(n: int) -> bytes:
    return orjson.dumps(
        {
            "id": n,
            "n_ctx": 4096,
            "speculative": False,
            "is_processing": False,
            "id_task": 123456,
            **dict.fromkeys(("n_prompt_tokens", "n_prompt_tokens_processed"), 0),
            "params": _PARAMS,
            "next_token": _NEXT,
        }
    )


SLOT = _slot(0)
FITTING = MAX_SLOTS_BYTES // (len(SLOT) + 2)  # slots of a `/slots` within the bound
SLOTS = b"[" + b",".join(_slot(n) for n in range(FITTING)) + b"]"
TEMPLATE = "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] }}{% endfor %}"
PROPS = b'{"total_slots":1024,"chat_template":"%s","default_generation_settings":%s}' % (
    (TEMPLATE * 400).encode(),
    SLOT,
)


def test_what_llama_server_answers_is_still_learned() -> None:
    assert 1200 < len(SLOT) < 1400  # as llama-server's (1,345 bytes), within some
    assert len(SLOTS) <= MAX_SLOTS_BYTES
    learned, asked, _ = asyncio.run(_learn_from(SLOTS, props=b"{}"))
    assert b"/slots" in asked
    assert learned == FITTING
    learned, asked, _ = asyncio.run(_learn_from(PROPS))
    assert learned == 1024
    assert b"/slots" not in asked


# --- what a backend that never says its slot count costs, round after round ---


async def _rounds(
    answers: list[bytes], rounds: int, health: bytes = b""
) -> tuple[list[int | None], list[bytes], int, int]:
    """`rounds` scrape rounds of a llama.cpp backend answering `/props` with `answers[n]`
    in round n (the last one after), `/slots` with 404 and `/health` with `health`: the
    slot count known after each round, the paths asked for, the connections the scraper
    opened, and the health probes failed in a row at the end."""
    round_no = 0

    def answer(path: bytes) -> bytes:
        if path == b"/props":
            return _answer(answers[min(round_no, len(answers) - 1)])
        if path == b"/slots":
            return b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
        return _answer(health if path == b"/health" else b"")

    llama = _Llama(answer)
    learned: list[int | None] = []
    async with llama.scraped() as (state, scraper):
        for round_no in range(rounds):  # noqa: B007 - `answer` reads it
            await scraper.scrape_once()
            learned.append(state.learned_slots)
    return learned, llama.asked, llama.connections, state.probe.failures


def test_a_backend_that_says_no_slot_count_is_asked_less_and_less() -> None:
    # Asked every round, a hostile backend's two answers were read (up to 4 MiB each) and
    # scanned every `scrape.interval_s`, for as long as it said no slot count.
    learned, asked, _, _ = asyncio.run(_rounds([MEMBERS], 40))
    props = asked.count(b"/props")
    assert learned == [None] * 40
    assert 4 <= props <= 8, f"/props asked {props} times in 40 rounds"  # 1+2+4+8+16 rounds


def test_a_slot_count_said_later_is_still_learned() -> None:
    # Rounds 0-9 answer nothing usable; from round 10 on, /props says 4 slots: learned
    # within the longest wait, and never asked for again.
    props = b'{"total_slots":4}'
    answers = [b"{}"] * 10 + [props]
    learned, asked, _, _ = asyncio.run(_rounds(answers, 10 + 2 * MAX_SLOT_BACKOFF_ROUNDS))
    assert learned[:10] == [None] * 10
    assert learned[-1] == 4
    first = learned.index(4)
    assert 10 <= first <= 10 + MAX_SLOT_BACKOFF_ROUNDS
    assert asked.count(b"/props") <= 7  # none after it was learned


def test_an_answer_past_the_bound_is_not_read_on() -> None:
    # 4 MiB announced: the connection is dropped at its head, not read to its end and
    # kept for the next request (a scrape after it dials again).
    learned, _, connections, _ = asyncio.run(_rounds([MEMBERS], 1))
    assert learned == [None]
    assert connections == 2


def test_a_health_answer_past_its_bound_is_not_read_on() -> None:
    # A `/health` answer is its status: its body (none from vLLM and SGLang, 15 bytes from
    # llama-server) was read up to the scrape's 4 MiB each round and thrown away. Past
    # 64 KiB its connection is dropped at its head, and the probe counts as failed.
    props = [b'{"total_slots":4}']
    learned, _, connections, failures = asyncio.run(_rounds(props, 1, b"x" * MIB))
    assert (learned, connections, failures) == ([4], 2, 1)
    learned, _, connections, failures = asyncio.run(_rounds(props, 1, b'{"status":"ok"}'))
    assert (learned, connections, failures) == ([4], 1, 0)
