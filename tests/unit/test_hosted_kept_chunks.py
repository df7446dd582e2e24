"""What LiteLLM keeps of a stream (gateway/upstream/hosted_stream.py, `keep_little`) is a
dozen chunks, and the usage it builds from them at the end (relayed to the client and
recorded) is the one it built from every chunk: the provider's usage chunks are kept, the
first and the last eight. Checked with LiteLLM's own `stream_chunk_builder` on the usage
shapes providers send: one final chunk (OpenAI), a start and an end (Anthropic, with
cached prompt tokens only at the start), the counts so far on every chunk (Gemini); each
followed by a few chunks without usage (LiteLLM's own end chunks, a provider's trailers),
so that the usage chunks are not among the last two kept anyway.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gateway.upstream.hosted_stream import keep_little
from gateway.upstream.litellm_runtime import load_litellm
from tests.helpers.gateways import LITELLM_WARNINGS

# LiteLLM's TypedDicts warn as pydantic first builds their schema: here, when an earlier
# test loaded LiteLLM (these tests failed after any such test, on `integrate` too).
pytestmark = LITELLM_WARNINGS

CHUNKS = 500
TRAILING = 20  # more than the list holds before it drops any
# the first, the last two, the last with a service tier, the first usage chunk and the last
# eight: 12, and one more before the list drops any
KEPT = 13


def chunk(text: str | None, usage: dict[str, Any] | None = None, finish: str | None = None) -> Any:
    types = load_litellm().types.utils
    delta = types.Delta(content=text, role="assistant")
    choice = types.StreamingChoices(index=0, delta=delta, finish_reason=finish)
    made = types.ModelResponseStream(id="c", created=1, model="m", choices=[choice])
    if usage is not None:
        made.usage = types.Usage(**usage)  # as LiteLLM's wrapper sets it
    return made


def openai() -> list[Any]:
    end = {"prompt_tokens": 5, "completion_tokens": CHUNKS, "total_tokens": CHUNKS + 5}
    return [chunk("x") for _ in range(CHUNKS)] + [chunk(None, end, "stop"), *trailers()]


def anthropic() -> list[Any]:
    start = {
        "prompt_tokens": 9,
        "completion_tokens": 1,
        "total_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    end = {"prompt_tokens": 9, "completion_tokens": CHUNKS, "total_tokens": CHUNKS + 9}
    body = [chunk("x") for _ in range(CHUNKS)]
    return [chunk(""), chunk("", start), *body, chunk(None, end, "stop"), *trailers()]


def gemini() -> list[Any]:
    def so_far(n: int) -> dict[str, int]:
        return {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": n + 7}

    body = [chunk("x", so_far(n + 1)) for n in range(CHUNKS)]
    return [*body, chunk(None, so_far(CHUNKS), "stop"), *trailers()]


def trailers() -> list[Any]:
    return [chunk("") for _ in range(TRAILING)]


@pytest.mark.parametrize("shape", [openai, anthropic, gemini])
def test_the_usage_built_from_the_kept_chunks_is_the_one_built_from_all(shape: Any) -> None:
    builder = load_litellm().stream_chunk_builder
    every = shape()
    wrapper = SimpleNamespace(chunks=[], response_uptil_now="")
    keep_little(wrapper)
    for made in every:
        wrapper.chunks.append(made)
        wrapper.response_uptil_now += "x"
    assert len(wrapper.chunks) <= KEPT
    assert wrapper.chunks[-1] is every[-1] and wrapper.chunks[-2] is every[-2]
    assert wrapper.response_uptil_now == ""
    kept = builder(chunks=list(wrapper.chunks)).usage
    whole = builder(chunks=every).usage
    assert kept.model_dump() == whole.model_dump()


def test_a_litellm_not_shaped_as_expected_fails_loudly_not_silently() -> None:
    # A LiteLLM whose wrapper kept its chunks elsewhere would keep all of them again: the
    # first stream fails, and with it the memory tests, rather than nothing being bounded.
    from gateway.upstream.hosted_stream import StreamBoundNotFound

    for unshaped in (
        SimpleNamespace(response_uptil_now=""),  # no `chunks`
        SimpleNamespace(chunks=(), response_uptil_now=""),  # not a list
        SimpleNamespace(chunks=[]),  # no `response_uptil_now`
    ):
        with pytest.raises(StreamBoundNotFound):
            keep_little(unshaped)


def test_every_wrapper_is_bounded_once_and_the_bridge_makes_up_no_usage() -> None:
    litellm = load_litellm()
    from litellm.litellm_core_utils import streaming_handler
    from litellm.responses import streaming_iterator

    from gateway.upstream.hosted_stream import install_stream_bound

    inits = (
        streaming_handler.CustomStreamWrapper.__init__,
        streaming_iterator.BaseResponsesAPIStreamingIterator.__init__,
    )
    install_stream_bound()  # again: nothing wrapped twice
    assert inits == (
        streaming_handler.CustomStreamWrapper.__init__,
        streaming_iterator.BaseResponsesAPIStreamingIterator.__init__,
    )
    assert all(getattr(init, "_owngate_keeps_little", False) for init in inits)
    estimate = streaming_iterator._estimate_usage_safely
    assert estimate("gpt-4o", "hi", {}, "some text the provider sent") is None
    assert litellm.post_call_rules == [] and litellm.pre_call_rules == []
