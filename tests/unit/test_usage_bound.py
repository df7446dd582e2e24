"""A backend's reported usage is charged only up to what the request justifies
(gateway/api/usage_bound.py): a hostile or broken backend reporting 2**53 tokens no
longer puts the tenant 30 days in debt. The completion record keeps the usage as the
backend reported it and says which bound was charged instead (`usage_bound`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from gateway.api.reservation import tokens_to_reserve
from gateway.api.trail import Trail
from gateway.api.usage_bound import (
    COMPLETION_ALLOWANCE,
    MEDIA_ALLOWANCE,
    MEDIA_MOST,
    PROMPT_ALLOWANCE,
    counted_media,
    media_parts,
    over_bound,
    tokens_bound,
)
from gateway.canonical import canonical_json
from gateway.errors import GatewayError
from gateway.provenance import LogEntry, RecordError, Salts, Usage, completion_record
from gateway.provenance.formats.record_parser import parse_record
from gateway.provenance.formats.schema import problem

CHAT = [{"role": "user", "content": "hi"}]
IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
HUGE = {"prompt_tokens": 2**53, "completion_tokens": 2**53, "total_tokens": 2**53}


@pytest.mark.parametrize(
    ("ask", "body_bytes", "answer_bytes", "bound"),
    [
        # a limit bounds each choice's output; the answer's bytes plus the allowance too
        ({"max_tokens": 5}, 100, 300, 100 + PROMPT_ALLOWANCE + 300 + 5),
        ({"max_completion_tokens": 7, "max_tokens": 5}, 100, 300, 100 + PROMPT_ALLOWANCE + 300 + 7),
        ({"max_tokens": 5, "n": 3}, 100, 300, 100 + PROMPT_ALLOWANCE + 300 + 15),
        ({"max_tokens": 5, "best_of": 4, "n": 2}, 100, 300, 100 + PROMPT_ALLOWANCE + 300 + 20),
        (
            {"max_tokens": 10**9},
            100,
            300,
            100 + PROMPT_ALLOWANCE + 300 + COMPLETION_ALLOWANCE,
        ),
        # no limit: the answer's bytes, plus tokens that leave none
        ({}, 100, 300, 100 + PROMPT_ALLOWANCE + 300 + COMPLETION_ALLOWANCE),
        (None, 100, 300, 100 + PROMPT_ALLOWANCE + 300 + COMPLETION_ALLOWANCE),
        ({"n": 2}, 100, 300, 100 + PROMPT_ALLOWANCE + 300 + 2 * COMPLETION_ALLOWANCE),
        # a limit that is not a whole number is no limit; a negative count is none
        (
            {"max_tokens": True, "best_of": -3},
            100,
            300,
            100 + PROMPT_ALLOWANCE + 300 + COMPLETION_ALLOWANCE,
        ),
        # each non-text content part may become many tokens from a short URL
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [IMAGE, IMAGE]}]},
            100,
            300,
            100 + PROMPT_ALLOWANCE + 2 * MEDIA_ALLOWANCE + 300 + 5,
        ),
        (
            {"max_tokens": 5, "messages": [{"content": [{"type": "text", "text": "x"}]}]},
            100,
            300,
            100 + PROMPT_ALLOWANCE + 300 + 5,
        ),
        # embeddings' media: llama.cpp's prompt objects in `input` or `content`, and the
        # `image` and `video` of SGLang's input objects, each fetched and decoded alike
        (
            {"input": [{"prompt_string": "x", "multimodal_data": ["A", "B"]}, "text"]},
            100,
            300,
            100 + PROMPT_ALLOWANCE + 2 * MEDIA_ALLOWANCE + 300 + COMPLETION_ALLOWANCE,
        ),
        (
            {"content": {"prompt_string": "x", "multimodal_data": ["A"]}},
            100,
            300,
            100 + PROMPT_ALLOWANCE + MEDIA_ALLOWANCE + 300 + COMPLETION_ALLOWANCE,
        ),
        (
            {"input": [{"text": "t", "image": "https://e.example/a.png", "video": "v.mp4"}]},
            100,
            300,
            100 + PROMPT_ALLOWANCE + 2 * MEDIA_ALLOWANCE + 300 + COMPLETION_ALLOWANCE,
        ),
        (
            {"input": [{"text": "t", "image": None}, {"text": "u"}]},
            100,
            300,
            100 + PROMPT_ALLOWANCE + 300 + COMPLETION_ALLOWANCE,
        ),
        # never past what a record can hold
        ({"max_tokens": 2**60, "n": 2**60}, 100, 2**60, 2**53),
    ],
)
def test_the_bound_each_request_justifies(
    ask: dict[str, Any] | None, body_bytes: int, answer_bytes: int, bound: int
) -> None:
    assert tokens_bound(ask, body_bytes, answer_bytes) == bound


def test_media_parts_are_counted_only_when_the_usage_needs_them() -> None:
    ask = {"max_tokens": 5, "messages": [{"role": "user", "content": [IMAGE]}]}
    plain = 100 + PROMPT_ALLOWANCE + 300 + 5
    assert over_bound(plain, ask, 100, 300) is None
    assert over_bound(plain + MEDIA_ALLOWANCE, ask, 100, 300) is None
    assert over_bound(plain + MEDIA_ALLOWANCE + 1, ask, 100, 300) == plain + MEDIA_ALLOWANCE


def test_media_parts_a_server_in_go_reads_are_counted() -> None:
    # encoding/json matches names in any case and keeps the last copy: to such a server,
    # these are two images the backend may bill MEDIA_ALLOWANCE each.
    hidden = {"type": "text", "text": "a", "Type": "image_url", "image_url": {"url": "u"}}
    message = {"role": "user", "content": "hi", "Content": [IMAGE, hidden]}
    ask = {"max_tokens": 5, "messages": [message]}
    plain = 100 + PROMPT_ALLOWANCE + 300 + 5
    assert over_bound(plain + 2 * MEDIA_ALLOWANCE, ask, 100, 300) is None
    assert over_bound(plain + 2 * MEDIA_ALLOWANCE + 1, ask, 100, 300) == plain + 2 * MEDIA_ALLOWANCE


def test_a_media_part_whose_type_a_repeat_made_null_is_counted() -> None:
    # `{"type": "image_url", "image_url": ..., "type": null}`: orjson keeps the last copy
    # (null), Go's encoding/json leaves its string field as it was for a null: an image.
    body = (
        b'{"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image_url",'
        b' "image_url": {"url": "u"}, "type": null}, {"type": null, "text": "a"}]}]}'
    )
    ask = orjson.loads(body)
    plain = 100 + PROMPT_ALLOWANCE + 300 + 5
    assert over_bound(plain + MEDIA_ALLOWANCE, ask, 100, 300) is None
    assert over_bound(plain + MEDIA_ALLOWANCE + 1, ask, 100, 300) == plain + MEDIA_ALLOWANCE


def _whole(usage: dict[str, int], ask: dict[str, Any], body_bytes: int = 50) -> Trail:
    trail = Trail(Salts.generate(), "", prompt_bytes=body_bytes, ask=ask)
    trail.answered(orjson.dumps({"choices": [], "usage": usage}))
    return trail


def test_an_absurd_usage_is_charged_the_bound_and_still_reported() -> None:
    trail = _whole(HUGE, {"model": "m", "messages": CHAT, "max_tokens": 5})
    assert trail.whole is not None
    bound = 50 + PROMPT_ALLOWANCE + len(trail.whole) + 5
    assert trail.usage() == Usage(2**53, 2**53, 2**53)  # as the backend reported it
    assert trail.usage_bound() == bound
    assert trail.charged_tokens() == bound


def test_an_honest_usage_is_charged_as_reported() -> None:
    usage = {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}
    trail = _whole(usage, {"model": "m", "messages": CHAT, "max_tokens": 5})
    assert trail.usage_bound() is None
    assert trail.charged_tokens() == 14


def test_a_stream_is_bounded_by_the_bytes_it_relayed() -> None:
    trail = Trail(Salts.generate(), "", prompt_bytes=50, ask={"model": "m", "stream": True})
    event = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    trail.relayed(event)
    trail.relayed(b"data: " + orjson.dumps({"choices": [], "usage": HUGE}) + b"\n\n")
    bound = 50 + PROMPT_ALLOWANCE + trail.sent_bytes + COMPLETION_ALLOWANCE
    assert trail.usage_bound() == bound
    assert trail.charged_tokens() == bound


def test_a_usage_held_back_from_the_client_is_bounded_too() -> None:
    trail = Trail(Salts.generate(), "", prompt_bytes=50, ask={"max_tokens": 3})
    trail.relayed(b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n')
    trail.reported(HUGE)
    assert trail.charged_tokens() == 50 + PROMPT_ALLOWANCE + trail.sent_bytes + 3


def test_the_bound_is_computed_once_per_answer_and_again_when_it_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request asks for its bound up to four times (the charge twice, the finish, the
    completion record): the walk over the request runs once while nothing it reads
    changed, and again when the answer, the usage or the request did."""
    import gateway.api.trail as trail_module

    computed: list[int] = []

    def counted(
        reported: int, ask: Any, body_bytes: int, answer_bytes: int, media: int | None
    ) -> int | None:
        computed.append(answer_bytes)
        return over_bound(reported, ask, body_bytes, answer_bytes, media)

    monkeypatch.setattr(trail_module, "over_bound", counted)
    trail = Trail(Salts.generate(), "", prompt_bytes=50, ask={"max_tokens": 3})
    trail.relayed(b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n')
    trail.reported(HUGE)
    first = 50 + PROMPT_ALLOWANCE + trail.sent_bytes + 3
    for _ in range(2):
        assert trail.charged_tokens() == first
        assert trail.usage_bound() == first
    assert computed == [trail.sent_bytes]
    trail.relayed(b"data: more\n\n")  # more answer: a larger bound
    assert trail.usage_bound() == 50 + PROMPT_ALLOWANCE + trail.sent_bytes + 3 > first
    trail.ask = {"max_tokens": 4}  # another request (a copy): computed again
    assert trail.usage_bound() == 50 + PROMPT_ALLOWANCE + trail.sent_bytes + 4
    trail.reported({"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2})
    assert trail.usage_bound() is None  # an honest usage: no bound charged
    assert trail.charged_tokens() == 2
    assert len(computed) == 4


def _completion(**change: Any) -> dict[str, object]:
    arguments: dict[str, Any] = {
        "request_id": "req-1",
        "time": datetime(2026, 1, 31, tzinfo=UTC),
        "dispatch": LogEntry(7, b"\x01" * 32),
        "status": 200,
        "error": None,
        "usage": Usage(2**53, 2**53, 2**53),
        "latency_ms": 3,
        "response_commitment": "ab" * 32,
    }
    return completion_record(**{**arguments, **change})


def test_the_record_keeps_the_reported_usage_and_names_the_bound_charged() -> None:
    record = _completion(usage_bound=4101)
    assert record["usage"] == HUGE
    assert record["usage_bound"] == 4101
    assert problem(record) is None
    assert parse_record(canonical_json(record)).data == record
    assert "usage_bound" not in _completion()  # absent when the usage was within it
    bad = dict(record, usage_bound="4101")
    assert problem(bad) is not None
    with pytest.raises(RecordError, match="usage must be given"):
        _completion(usage=None, usage_bound=4101)
    with pytest.raises(RecordError, match="usage_bound must be an integer"):
        _completion(usage_bound=-1)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"usage": None}, "without a reported usage"),  # a bound on nothing reported
        ({"usage_bound": 10**6}, "not below the reported usage 12"),  # charged above the claim
        ({"usage_bound": 12}, "not below the reported usage 12"),  # at it: nothing was cut
        # the reported usage is the larger of total and prompt + completion
        (
            {
                "usage": {"prompt_tokens": 9, "completion_tokens": 9, "total_tokens": 1},
                "usage_bound": 18,
            },
            "not below the reported usage 18",
        ),
    ],
)
def test_a_usage_bound_the_usage_did_not_exceed_is_refused(
    change: dict[str, object], why: str
) -> None:
    """`usage_bound` is in a record only when the reported usage exceeded it
    (docs/provenance.md): a log (signed by whoever holds the key) whose completion says the
    tenant was charged a bound above what the backend claimed, or a bound on no usage at
    all, contradicts itself, and `audit verify` (parse_record) refuses it. Found by an
    independent verifier written from the docs, which `audit verify` disagreed with."""
    usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    record = dict(_completion(usage=Usage(5, 7, 12)), usage_bound=11)
    assert problem(record) is None  # 12 reported, 11 charged: consistent
    bad = {**record, "usage": usage, **change}
    found = problem(bad)
    assert found is not None and why in found, found
    with pytest.raises(RecordError, match="usage_bound"):
        parse_record(canonical_json(bad))
    if change.get("usage") is None and "usage" in change:
        return  # the builder refuses a bound without usage by its own message (above)
    reported = bad["usage"]
    assert isinstance(reported, dict)
    with pytest.raises(RecordError, match="not below the reported usage"):
        _completion(usage=Usage(**reported), usage_bound=bad["usage_bound"])


@pytest.mark.parametrize(
    ("prompt", "prompts"),
    [(["a"] * 300, 300), ([[1, 2]] * 40, 40), ("a", 1), ([1, 2, 3, 4], 1), ([], 1)],
)
def test_a_batch_of_prompts_is_answered_once_per_prompt(prompt: Any, prompts: int) -> None:
    # /v1/completions with `prompt` an array: each prompt gets its own `n` choices of up
    # to `max_tokens`. An honest backend's usage for 300 prompts of 100 tokens each was
    # charged (and signed) as the bound for one: the client paid a 300th of its tokens.
    ask = {"prompt": prompt, "max_tokens": 100, "n": 2}
    body_bytes, answer_bytes = len(orjson.dumps(ask)), prompts * 2 * 100  # a byte a token
    honest = body_bytes + prompts * 2 * 100
    assert over_bound(honest, ask, body_bytes, answer_bytes) is None
    assert over_bound(2**53, ask, body_bytes, answer_bytes) is not None


def test_a_limit_the_backend_reads_past_still_counts_the_answers_bytes() -> None:
    # llama.cpp reads `n_predict` over `max_tokens`: this asks for one output token and
    # gets an unbounded generation. Bounded by the limit alone, the 10,000 tokens it
    # relayed were charged (and signed) as 1.
    ask = {"prompt": "x", "max_tokens": 1, "n_predict": -1}
    honest = 20 + 10_000
    assert over_bound(honest, ask, 20, 40_000) is None
    # And n_predict -1 is no limit at all: tokens that leave no text are bounded by the
    # allowance, not by the max_tokens llama.cpp did not read.
    assert (
        over_bound(2**53, ask, 20, 40_000) == 20 + PROMPT_ALLOWANCE + 40_000 + COMPLETION_ALLOWANCE
    )


# -- fields other than OpenAI's that the servers read as a limit or a count ------------------

NO_TEXT = 10_000  # tokens a `logit_bias` forced to a control token: they leave no text


@pytest.mark.parametrize(
    ("ask", "limit"),
    [
        # llama.cpp reads n_predict over max_completion_tokens over max_tokens
        ({"max_tokens": 1, "n_predict": 100_000}, 100_000),
        ({"max_tokens": 1, "max_completion_tokens": 3, "n_predict": 2}, 3),
        # -1 is no limit to llama.cpp, and a string or a bool is as if absent
        ({"max_tokens": 1, "n_predict": -1}, COMPLETION_ALLOWANCE),
        ({"max_tokens": 1, "n_predict": "5"}, COMPLETION_ALLOWANCE),
        ({"max_completion_tokens": 5, "max_tokens": -1}, COMPLETION_ALLOWANCE),
        ({"max_tokens": 5, "max_completion_tokens": 2.5}, COMPLETION_ALLOWANCE),
        # vLLM and SGLang read no n_predict: without max_tokens they have no limit
        ({"n_predict": 5}, COMPLETION_ALLOWANCE),
        # null is as if absent to every server
        ({"max_tokens": 5, "n_predict": None}, 5),
        ({"max_completion_tokens": 5}, 5),
        # at least min_tokens are generated
        ({"max_tokens": 1, "min_tokens": 50}, 50),
        ({"max_tokens": 50, "min_tokens": "x"}, 50),
    ],
)
def test_the_limit_is_the_largest_any_server_reads(ask: dict[str, Any], limit: int) -> None:
    # `{"max_tokens": 1, "n_predict": 100000}` to llama.cpp, with a logit_bias forcing a
    # control token (no text): 100,000 tokens, and the bound counted one of them.
    assert tokens_bound(ask, 100, 300) == 100 + PROMPT_ALLOWANCE + 300 + limit
    if limit > NO_TEXT:
        assert over_bound(100 + NO_TEXT, ask, 100, 0) is None


@pytest.mark.parametrize(
    ("ask", "choices"),
    [
        ({"n_cmpl": 4}, 4),  # llama.cpp: completions per prompt, read over `n`
        ({"n": 1, "n_cmpl": 4}, 4),
        ({"n": "3"}, 3),  # pydantic (vLLM, SGLang) reads these as whole numbers
        ({"n": " +3 "}, 3),
        ({"n": 3.0}, 3),
        ({"best_of": "1e1"}, 10),
        ({"n": True}, 1),
        ({"n": "x", "best_of": 2.5}, 1),
        ({"n_cmpl": 2, "prompt": ["a", "b", "c"]}, 6),
    ],
)
def test_choices_count_every_field_as_the_servers_read_it(
    ask: dict[str, Any], choices: int
) -> None:
    limited = {**ask, "max_tokens": 7}
    assert tokens_bound(limited, 100, 300) == 100 + PROMPT_ALLOWANCE + 300 + choices * 7


def test_a_count_of_more_digits_than_int_reads_is_the_cap_not_an_error() -> None:
    # Python's int() refuses 4,300 digits; the bound of any answer must never raise.
    assert tokens_bound({"n": "9" * 5000, "max_tokens": 7}, 100, 300) == 2**53


def test_each_media_item_of_a_llamacpp_prompt_object_is_counted() -> None:
    one = {"prompt_string": "<__media__><__media__>", "multimodal_data": ["AAAA", "BBBB"]}
    ask = {"max_tokens": 1, "prompt": one}
    assert tokens_bound(ask, 100, 0) == 100 + PROMPT_ALLOWANCE + 2 * MEDIA_ALLOWANCE + 1
    batch = {"max_tokens": 1, "prompt": [one, "text", one]}
    assert tokens_bound(batch, 100, 0) == 100 + PROMPT_ALLOWANCE + 4 * MEDIA_ALLOWANCE + 3


class _Walked(list):  # type: ignore[type-arg]
    """A batch that counts the entries a walk of it reached."""

    reached = 0

    def __iter__(self) -> Any:
        for entry in super().__iter__():
            self.reached += 1
            yield entry


def test_the_media_count_stops_walking_a_batch_past_its_bound() -> None:
    # 8 MiB of SGLang input objects is 300,000 of them: the count stops once it found
    # more than `MEDIA_MOST` media (refused at ingress), and visits no entry past them.
    batch = _Walked([{"text": "a", "image": "b"}] * (MEDIA_MOST + 5000))
    assert tokens_bound({"input": batch}, 100, 0) > MEDIA_MOST * MEDIA_ALLOWANCE
    assert batch.reached <= MEDIA_MOST + 1


def _images(count: int, texts: int = 0) -> dict[str, Any]:
    text = {"type": "text", "text": "a"}
    part = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    return {"messages": [{"role": "user", "content": [text] * texts + [part] * count}]}


def _counted(doc: dict[str, Any]) -> int:
    return counted_media(doc, json.dumps(doc).encode())


def test_media_past_the_old_walk_bound_are_counted_exactly() -> None:
    # The walk stopped at the 4,096th part: images past it counted for nothing (then
    # such a body was refused, honest long chats with it).
    assert _counted(_images(10, texts=5000)) == 10
    assert _counted(_images(5000)) == 5000
    batch = {"input": [{"text": "a", "image": "b"}] * 5000}  # SGLang's embeddings batch
    assert _counted(batch) == 5000
    per_media = 10
    ask = _images(7, texts=4100)
    assert over_bound(2**40, ask, 100, 0) == tokens_bound(ask, 100, 0)
    assert (
        tokens_bound(ask, 100, 0)
        == 100 + PROMPT_ALLOWANCE + 7 * MEDIA_ALLOWANCE + COMPLETION_ALLOWANCE
    )
    body = json.dumps(ask).encode()
    reserved = tokens_to_reserve(ask, len(body), per_minute=10**6, per_answer=1, per_media=10)
    assert reserved == -(-len(body) // 4) + 7 * per_media + 1


@pytest.mark.parametrize(
    "doc",
    [
        _images(0, texts=5000),  # one message of 5,000 text parts
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 2}] * 2100},
        {"messages": [{"role": "user", "content": [{"text": "a"}] * 70_000}]},
        {"input": [{"text": "a"}] * 70_000},
    ],
)
def test_text_parts_are_never_refused_however_many(doc: dict[str, Any]) -> None:
    assert _counted(doc) == 0


def test_more_media_than_any_backend_takes_are_refused() -> None:
    assert _counted(_images(MEDIA_MOST, texts=100)) == MEDIA_MOST
    with pytest.raises(GatewayError) as caught:
        _counted(_images(MEDIA_MOST + 1))
    assert (caught.value.status, caught.value.code.value) == (400, "invalid_request")
    assert str(MEDIA_MOST) in caught.value.message
    with pytest.raises(GatewayError):  # an SGLang batch of input objects, the same
        _counted({"input": [{"text": "a", "image": "b"}] * (MEDIA_MOST + 1)})


@pytest.mark.parametrize(
    ("body", "media"),
    [
        (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}', 0),
        (b'{"messages": [{"role":"user","content":[{"type":"text","text":"type"}]}]}', 0),
        (b'{"messages": [{"role": "user", "content": [{"type": "input_text"}]}]}', 1),
        (b'{"messages": [{"content": [{"type": "text", "Type": "audio"}]}]}', 1),
        (b'{"messages": [{"content": [{"type": "text", "\\u0074ype": "x"}]}]}', 1),
        (b'{"messages": [{"content": [{"\\u0074ype": "input_audio"}]}]}', 1),
        (b'{"messages": [{"content": [{"type" : "text"}, {"type":"x"}]}]}', 1),
        (b'{"messages": [{"content": [{"type": null, "url": "a"}]}]}', 1),
        (b'{"messages": [{"content": [{"text": "\\"type\\": \\"x\\""}]}]}', 0),
        (b'{"messages": [{"content": "hi", "image\\u017f": ["a", "b"]}]}', 2),
        ('{"messages": [{"content": "hi", "IMAGE\u017f": ["a"]}]}'.encode(), 1),
        (b'{"input": ["a", "b"], "modality": "image"}', 2),
        (b'{"prompt": {"prompt_string": "a", "multimodal_data": ["x"]}}', 1),
        (b'{"input": [{"text": "a", "video": "v"}]}', 1),
        (b'{"prompt": "x", "mm_payload": {"img": ["a", {"url": "b"}]}}', 2),
        (b'{"prompt": "x", "mm_p\\u0061yload": {"img": ["a"]}}', 1),
    ],
)
def test_the_byte_scan_skips_a_walk_only_when_it_would_find_none(body: bytes, media: int) -> None:
    doc = json.loads(body)
    assert media_parts(doc) == media  # the walk
    assert media_parts(doc, body) == media  # the bytes first


def test_a_count_given_is_not_walked_again() -> None:
    # The count is made once at ingress (`counted_media`); the bound takes it as given.
    batch = _Walked([{"text": "a", "image": "b"}] * 10)
    assert over_bound(2**40, {"input": batch}, 100, 0, media=3) == (
        100 + PROMPT_ALLOWANCE + 3 * MEDIA_ALLOWANCE + COMPLETION_ALLOWANCE
    )
    assert batch.reached == 0


def _payload(count: int) -> dict[str, Any]:
    """A completion with `count` images in vLLM's `mm_payload`, as URLs and inline."""
    items: list[Any] = [{"image_url": "https://example.com/a.png"}, "iVBORw0KGgo="] * count
    return {"model": "m", "prompt": "x", "max_tokens": 1, "mm_payload": {"image": items[:count]}}


def test_media_in_vllms_mm_payload_count_as_image_parts_do() -> None:
    # vLLM loads each image of `mm_payload` as it loads an `image_url` part; before, they
    # counted for nothing: 100 such images were reserved and bounded as text, and past
    # `MEDIA_MOST` of them were not refused.
    ask = _payload(100)
    body = json.dumps(ask).encode()
    assert media_parts(ask) == 100 and media_parts(ask, body) == 100
    assert _counted(ask) == 100
    bound = len(body) + PROMPT_ALLOWANCE + 100 * MEDIA_ALLOWANCE + 1
    assert tokens_bound(ask, len(body), 0) == bound
    reserved = tokens_to_reserve(ask, len(body), per_minute=10**9, per_answer=1, per_media=10)
    assert reserved == -(-len(body) // 4) + 100 * 10 + 1
    with pytest.raises(GatewayError) as caught:
        _counted(_payload(MEDIA_MOST + 1))
    assert (caught.value.status, caught.value.code.value) == (400, "invalid_request")
    # its numbers (precomputed embeddings) are no items: the bytes justify their tokens
    assert _counted({"prompt": "x", "mm_payload": {"image_embeds": [[0.5, 0.25]]}}) == 0
