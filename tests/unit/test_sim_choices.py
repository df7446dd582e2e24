"""The simulator answers `n` choices, as vLLM and OpenAI do: a whole answer holds choices
0 to n-1 with `completion_tokens` summed over them; a stream sends every choice's chunks
with its `index`, a finish chunk for each and one usage chunk counting them all; the
engine runs one sequence per choice. A bad `n` is a 400 in OpenAI's error format.

Before: every answer held one choice (index 0) whatever `n` asked for, so `owngate demo`'s
hosted provider (a simulator) failed the gateway's check of a hosted answer's choices
(gateway/upstream/hosted_finish.py `short_of`) with a 502 for every `n` > 1.
"""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from typing import Any

import orjson
import pytest

from gateway.asgi import Message
from gateway.sim import Faults, SimApp, SimSettings, VirtualClock, create_sim_app

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
HELLO = [{"role": "user", "content": "Hello there!"}]
ASK: dict[str, dict[str, Any]] = {
    CHAT: {"messages": HELLO, "max_tokens": 6},
    TEXT: {"prompt": "Hello there!", "max_tokens": 6},
}
PROMPT_TOKENS = 3  # ceil(12 bytes / 4)

# (zero latency, coalesced chunks, token interval): every way the simulator writes.
MODES: dict[str, dict[str, Any]] = {
    "timed": {"zero_latency": False},
    "instant": {"zero_latency": True},
    "coalesced": {"zero_latency": True, "coalesce_chunks": True},
    "paced": {"zero_latency": True, "token_interval_s": 0.01},
}


def _app(**changes: Any) -> SimApp:
    settings = SimSettings(models=("m",), seed=7, slots=8, **changes)
    return create_sim_app(settings, clock=VirtualClock(), wall_time=lambda: 1_000.0)


async def _post(app: SimApp, path: str, payload: dict[str, Any]) -> tuple[int, list[bytes]]:
    """POST `payload` in process: the status and each body write."""
    body = orjson.dumps(payload)
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
    }
    requested = False
    never = asyncio.Event()
    status = 0
    writes: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()  # the client stays
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            writes.append(message["body"])

    await asyncio.wait_for(app(scope, receive, send), 10)
    await app.engine.aclose()
    return status, writes


def post(app: SimApp, path: str, payload: dict[str, Any]) -> tuple[int, list[bytes]]:
    return asyncio.run(_post(app, path, payload))


def events(writes: list[bytes]) -> list[dict[str, Any]]:
    """The JSON events of an SSE body, which must end with `[DONE]`."""
    raw = b"".join(writes).split(b"\n\n")
    assert raw[-2:] == [b"data: [DONE]", b""], raw[-3:]
    return [orjson.loads(e.removeprefix(b"data: ")) for e in raw[:-2]]


def text_of(choice: dict[str, Any]) -> str:
    return str(choice["message"]["content"] if "message" in choice else choice["text"])


@pytest.mark.parametrize("path", [CHAT, TEXT], ids=["chat", "text"])
@pytest.mark.parametrize("zero_latency", [False, True], ids=["timed", "instant"])
def test_a_whole_answer_holds_n_choices_and_sums_their_tokens(
    path: str, zero_latency: bool
) -> None:
    status, writes = post(_app(zero_latency=zero_latency), path, {**ASK[path], "n": 3})
    assert status == 200, writes
    answer = orjson.loads(b"".join(writes))
    choices = answer["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert all(c["finish_reason"] == "length" and text_of(c) for c in choices)
    assert len({text_of(c) for c in choices}) == 3  # each its own, deterministically
    assert answer["usage"] == {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": 3 * 6,
        "total_tokens": PROMPT_TOKENS + 18,
    }
    # Choice 0 is the answer to the same request without `n`, and the same again.
    _, one = post(_app(zero_latency=zero_latency), path, ASK[path])
    alone = orjson.loads(b"".join(one))["choices"]
    assert [text_of(c) for c in alone] == [text_of(choices[0])]
    _, again = post(_app(zero_latency=zero_latency), path, {**ASK[path], "n": 3})
    assert orjson.loads(b"".join(again))["choices"] == choices


@pytest.mark.parametrize("path", [CHAT, TEXT], ids=["chat", "text"])
@pytest.mark.parametrize("mode", list(MODES))
def test_a_stream_sends_every_choice_with_its_index_finish_and_usage(path: str, mode: str) -> None:
    app = _app(**MODES[mode])
    ask = {**ASK[path], "n": 2, "stream": True, "stream_options": {"include_usage": True}}
    status, writes = post(app, path, ask)
    assert status == 200
    sent = events(writes)
    *chunks, usage = sent
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 2 * 6
    assert usage["usage"]["prompt_tokens"] == PROMPT_TOKENS
    texts: dict[int, str] = defaultdict(str)
    finishes: dict[int, list[str]] = defaultdict(list)
    for chunk in chunks:
        (choice,) = chunk["choices"]  # one choice per chunk, as vLLM sends them
        index = choice["index"]
        texts[index] += (choice["delta"].get("content") or "") if path == CHAT else choice["text"]
        if choice["finish_reason"] is not None:
            finishes[index].append(choice["finish_reason"])
    assert dict(finishes) == {0: ["length"], 1: ["length"]}
    # Each choice streams the text its whole answer holds.
    _, whole = post(_app(**MODES[mode]), path, {**ASK[path], "n": 2})
    assert [texts[0], texts[1]] == [text_of(c) for c in orjson.loads(whole[0])["choices"]]
    if path == CHAT:  # a role chunk for each choice, before its first token
        roles = [c["choices"][0]["index"] for c in chunks if "role" in c["choices"][0]["delta"]]
        assert roles == [0, 1]
    assert app.engine.generation_tokens_total == 2 * 6


def _without_ids(writes: list[bytes]) -> list[bytes]:
    return [re.sub(rb'"id":"chatcmpl-[0-9a-f]+"', b'"id":""', w) for w in writes]


def test_an_n_of_one_or_null_streams_as_a_request_without_n() -> None:
    ask = {**ASK[CHAT], "stream": True, "stream_options": {"include_usage": True}}
    _, plain = post(_app(zero_latency=True), CHAT, ask)
    for n in (1, None):
        _, writes = post(_app(zero_latency=True), CHAT, {**ask, "n": n})
        assert _without_ids(writes) == _without_ids(plain)
    assert len(plain) == 1 + 6 + 1  # role, one write per token, the end
    assert b'"index":1' not in b"".join(plain)


@pytest.mark.parametrize("zero_latency", [False, True], ids=["timed", "instant"])
def test_a_stream_of_n_choices_that_dies_leaves_every_choice_unfinished(
    zero_latency: bool,
) -> None:
    app = _app(zero_latency=zero_latency)
    app.control.faults = Faults(die_mid_stream_rate=1.0)
    status, writes = post(app, CHAT, {**ASK[CHAT], "n": 2, "stream": True})
    assert status == 200
    body = b"".join(writes)
    assert b"[DONE]" not in body and b'"finish_reason":"length"' not in body
    assert b'"index":0' in body and b'"index":1' in body
    assert app.stats.died == 1


def test_the_engine_runs_one_sequence_per_choice() -> None:
    """n x max_tokens of work: the choices hold a slot each and count in the metrics."""

    async def scenario() -> tuple[int, list[int]]:
        app = _app(zero_latency=False)
        task = asyncio.ensure_future(_post(app, CHAT, {**ASK[CHAT], "n": 4}))
        seen: list[int] = []
        while not task.done():
            seen.append(app.engine.running + app.engine.waiting)
            await asyncio.sleep(0)
        status, _ = await task
        assert app.engine.generation_tokens_total == 4 * 6
        assert app.engine.prompt_tokens_total == 4 * PROMPT_TOKENS
        return status, seen

    status, seen = asyncio.run(scenario())
    assert status == 200
    assert max(seen) == 4


@pytest.mark.parametrize("n", [0, -1, 129, 1.5, "2", True, [2]])
@pytest.mark.parametrize("path", [CHAT, TEXT], ids=["chat", "text"])
def test_a_bad_n_is_refused_in_openai_error_format(path: str, n: object) -> None:
    app = _app(zero_latency=True)
    status, writes = post(app, path, {**ASK[path], "n": n})
    assert status == 400
    error = orjson.loads(b"".join(writes))["error"]
    assert error["message"] == "'n' must be an integer from 1 to 128"
    assert (error["type"], error["code"]) == ("BadRequestError", 400)
    assert app.stats.started == 0


def test_the_most_choices_are_served() -> None:
    status, writes = post(_app(zero_latency=True), TEXT, {**ASK[TEXT], "n": 128})
    assert status == 200
    assert [c["index"] for c in orjson.loads(writes[0])["choices"]] == list(range(128))


# -- a legacy `prompt` that is a list of prompts ----------------------------------------
# OpenAI and vLLM answer `n` choices for each prompt: choice `p * n + c` is choice `c` of
# prompt `p`, and usage sums every prompt's tokens and every choice's. Before, the
# simulator answered only `n` choices, and the gateway (`short_of`) 502ed the demo.

PROMPT_LISTS: dict[str, list[Any]] = {
    "strings": ["Hello there!", "Hi"],  # 3 and 1 tokens
    "token-ids": [[1, 2, 3], [4, 5, 6, 7]],  # 3 and 4 tokens
}


def _whole(app: SimApp, payload: dict[str, Any]) -> dict[str, Any]:
    status, writes = post(app, TEXT, payload)
    assert status == 200, writes
    answer: dict[str, Any] = orjson.loads(b"".join(writes))
    return answer


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("prompts", list(PROMPT_LISTS))
@pytest.mark.parametrize("zero_latency", [False, True], ids=["timed", "instant"])
def test_a_list_of_prompts_gets_n_choices_for_each(
    n: int, prompts: str, zero_latency: bool
) -> None:
    listed = PROMPT_LISTS[prompts]
    answer = _whole(_app(zero_latency=zero_latency), {"prompt": listed, "max_tokens": 6, "n": n})
    choices = answer["choices"]
    assert [c["index"] for c in choices] == list(range(2 * n))
    assert all(c["finish_reason"] == "length" for c in choices)
    # Choice p * n + c is choice c of prompt p asked alone.
    alone = [
        _whole(_app(zero_latency=zero_latency), {"prompt": p, "max_tokens": 6, "n": n})
        for p in listed
    ]
    assert [c["text"] for c in choices] == [c["text"] for a in alone for c in a["choices"]]
    prompt_tokens = sum(a["usage"]["prompt_tokens"] for a in alone)
    assert answer["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 2 * n * 6,
        "total_tokens": prompt_tokens + 2 * n * 6,
    }


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("mode", list(MODES))
def test_a_stream_of_a_list_of_prompts_sends_each_choice_with_its_index(n: int, mode: str) -> None:
    app = _app(**MODES[mode])
    listed = PROMPT_LISTS["strings"]
    ask = {"prompt": listed, "max_tokens": 6, "n": n, "stream": True}
    status, writes = post(app, TEXT, {**ask, "stream_options": {"include_usage": True}})
    assert status == 200
    *chunks, usage = events(writes)
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 2 * n * 6,
        "total_tokens": 4 + 12 * n,
    }
    texts: dict[int, str] = defaultdict(str)
    finishes: dict[int, list[str]] = defaultdict(list)
    for chunk in chunks:
        (choice,) = chunk["choices"]
        texts[choice["index"]] += choice["text"]
        if choice["finish_reason"] is not None:
            finishes[choice["index"]].append(choice["finish_reason"])
    assert dict(finishes) == {i: ["length"] for i in range(2 * n)}
    whole = _whole(_app(**MODES[mode]), {"prompt": listed, "max_tokens": 6, "n": n})
    assert [texts[i] for i in range(2 * n)] == [c["text"] for c in whole["choices"]]
    assert app.engine.generation_tokens_total == 2 * n * 6


def test_the_engine_prefills_each_choice_with_its_own_prompt() -> None:
    app = _app(zero_latency=False)
    _whole(app, {"prompt": PROMPT_LISTS["token-ids"], "max_tokens": 6, "n": 2})
    assert app.engine.prompt_tokens_total == 2 * 3 + 2 * 4
    assert app.engine.generation_tokens_total == 4 * 6


@pytest.mark.parametrize(
    "prompt", ["Hello there!", [1, 2, 3], ["Hello there!"]], ids=["string", "ids", "one"]
)
def test_a_single_prompt_still_gets_n_choices(prompt: object) -> None:
    answer = _whole(_app(zero_latency=True), {"prompt": prompt, "max_tokens": 6, "n": 2})
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    assert answer["usage"]["prompt_tokens"] == 3


@pytest.mark.parametrize(("prompts", "n"), [(2, 65), (129, 1), (3, 43)])
def test_more_than_128_choices_over_all_prompts_are_refused(prompts: int, n: int) -> None:
    app = _app(zero_latency=True)
    status, writes = post(app, TEXT, {"prompt": ["Hi"] * prompts, "max_tokens": 1, "n": n})
    assert status == 400
    error = orjson.loads(b"".join(writes))["error"]
    assert error["message"] == "'n' times the number of prompts must be at most 128"
    assert (error["type"], error["code"]) == ("BadRequestError", 400)
    assert app.stats.started == 0
    status, writes = post(
        _app(zero_latency=True), TEXT, {"prompt": ["Hi"] * 2, "max_tokens": 1, "n": 64}
    )
    assert status == 200
    assert len(orjson.loads(writes[0])["choices"]) == 128
