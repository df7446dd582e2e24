"""A hosted provider's stream as LiteLLM yields it, encoded as OpenAI SSE events, and
whether the provider finished it (gateway/upstream/hosted.py makes it).

LiteLLM ends every stream the same way, whether the provider finished it or closed the
connection in the middle: when its source runs dry without a finish reason, it makes up
a last chunk with `finish_reason: "stop"` (`CustomStreamWrapper.finish_reason_handler`).
Relayed, that chunk and `data: [DONE]` would tell the client (and the provenance record)
that a cut answer was complete. So a stream is finished only when the provider gave a
finish reason (OpenAI's `finish_reason`, Anthropic's `stop_reason`): the wrapper's
`received_finish_reason` or `intermittent_finish_reason` when it has them, and in any
case a finish reason on a chunk LiteLLM did not make up. A stream that ends without one
raises `HostedError("protocol")` in place of the made-up chunk, before `[DONE]`.

Likewise LiteLLM's end-of-stream usage chunk: when the provider reported no usage, it
counts the tokens itself. That estimate is neither relayed nor kept as the provider's
usage (the completion record's `usage` is what the provider reported, or null).

What LiteLLM keeps of a stream is bounded (`keep_little`). Its wrapper appends every chunk
it returns to `chunks`, about 4 KB each (pydantic objects), to build the whole answer once
the stream ends (for its logging and caching, both off here), and adds the text of each to
`response_uptil_now` (for post-call rules, none here): 100,000 tiny events from a provider
grew the gateway by 570 MB, held until the stream ended, and a client can have that by
asking a hosted model for long answers on several streams. The usage LiteLLM reports at the
end of a stream is read from the provider's usage chunks among `chunks`
(`calculate_usage`: the latest count that is not 0, and how many counts came): those are
kept, all but a hostile number of them (`_RecentChunks`). `install_stream_bound` makes
every wrapper LiteLLM creates do so (gateway/upstream/litellm_runtime.py calls it at load),
and the Responses stream under a bridged chat keep none of its text: it added every delta
to a string (copied whole each time) to estimate the usage when the provider's
`response.completed` stated none, an estimate relayed and recorded as the provider's; it
is not made (`_no_estimate`).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import re
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any, Final, TypeVar

from gateway.upstream import openai_wire
from gateway.upstream.hosted_errors import HostedError, hosted_error
from gateway.upstream.openai_wire import Endpoint

__all__ = [
    "ProviderStream",
    "StreamBoundNotFound",
    "after_init",
    "answer_id",
    "close_stream",
    "encoded",
    "install_stream_bound",
    "keep_little",
    "made_up_end",
    "made_up_usage",
]

T = TypeVar("T")
# The provider's usage chunks kept besides its first (`_RecentChunks`): OpenAI sends one,
# Anthropic two, Gemini one per chunk with the counts so far.
_USAGE_KEPT: Final = 8
# LiteLLM 1.108.7: its chat stream wrapper (module, class), and its Responses stream (module,
# class, the function that estimates usage from the text when the provider stated none).
_WRAPPER: Final = ("litellm.litellm_core_utils.streaming_handler", "CustomStreamWrapper")
# How deep a text-completion stream's generators hold the wrapper (`_wrapper`).
_GENERATORS: Final = 2
_RESPONSES: Final = (
    "litellm.responses.streaming_iterator",
    "BaseResponsesAPIStreamingIterator",
    "_estimate_usage_safely",
)
_KEEPS_LITTLE: Final = "_owngate_keeps_little"
# LiteLLM names an answer itself when the provider's carries no id, or one it does not
# carry over (Anthropic's `msg_...`): `chatcmpl-` and a random UUID (`generate_id` in
# litellm/types/utils.py). Recorded as the provider's, an auditor would look for it in
# the provider's usage export in vain: it is recorded as missing. (A provider that names
# its answers the same way loses its id from the record, never gains a false one.)
_MADE_UP_ID: Final = re.compile(
    r"chatcmpl-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\Z"
)


class ProviderStream:
    """A LiteLLM stream whose first chunk has already arrived."""

    def __init__(
        self,
        source: Any,
        first: Any,
        endpoint: Endpoint,
        with_usage: bool,
        provider: str,
        *,
        secrets: tuple[str, ...] = (),  # never in a failure's message: the key, the base URL
        idle_s: float | None = None,  # longest wait for the next chunk (None: unbounded)
    ) -> None:
        self._source = source
        self._idle_s = idle_s
        self._secrets = secrets
        self._pending: list[Any] = [] if first is None else [first]
        self._endpoint = endpoint
        self._with_usage = with_usage
        self._provider = provider
        self._closed = False
        self._finished = False  # a finish reason came from the provider
        # The `id` and `model` of the first chunk that names the answer with an id of the
        # provider's, when the first chunk names none (Azure opens a stream with its
        # prompt filter's results, no choices and `id: ""`), up to the first chunk with
        # choices: what the record keeps (`HostedResponse.provider_ids`).
        self.named: tuple[str, object] | None = None
        self._unnamed = answer_id(first) is None

    async def events(self) -> AsyncIterator[tuple[bytes | None, dict[str, int] | None]]:
        while not self._closed:
            if self._pending:
                chunk = self._pending.pop()
            else:
                failure: HostedError | None = None
                # Each wait for a chunk bounded: LiteLLM reads and drops SSE comments and
                # blank lines, each restarting its own per-read timeout, so a provider
                # sending only those held the client and its slot for as long as it liked.
                idle = asyncio.timeout(self._idle_s)
                try:
                    async with idle:
                        chunk = await anext(self._source)
                except StopAsyncIteration:
                    break
                except TimeoutError as exc:
                    if self._closed:
                        return
                    if not idle.expired():  # LiteLLM's own, not the idle bound's
                        failure = hosted_error(exc, self._provider, secrets=self._secrets)
                    else:
                        failure = HostedError("timeout", f"{self._provider} sent no event in time")
                except Exception as exc:  # noqa: BLE001 - every failure becomes a HostedError
                    if self._closed:
                        return  # aclose() from another task broke the read: not an error
                    failure = hosted_error(exc, self._provider, secrets=self._secrets)
                if failure is not None:
                    raise failure  # outside `except`: LiteLLM's exception is not its context
                # A turn of the event loop per chunk: LiteLLM and the OpenAI SDK parse every
                # event already read without awaiting anything (about 2 ms each), so a
                # provider sending thousands of tiny events at once held the loop (10,000:
                # 14 s of every other request's time) with nothing in between.
                await asyncio.sleep(0)
            if made_up_end(self._source):
                break  # LiteLLM's own last chunk: the provider closed the stream unfinished
            self._finished = self._finished or _has_finish_reason(chunk)
            if self._unnamed:
                self._name(chunk)
            if made_up_usage(self._source):  # neither sent on nor recorded
                data, _ = encoded(
                    self._provider,
                    partial(openai_wire.encode_chunk, self._endpoint, chunk, with_usage=False),
                )
                yield data, None
                continue
            encode = partial(
                openai_wire.encode_chunk, self._endpoint, chunk, with_usage=self._with_usage
            )
            yield encoded(self._provider, encode)
        if self._closed:
            return
        if not self._finished:
            raise HostedError("protocol", f"{self._provider} closed the stream before it finished")
        yield openai_wire.DONE, None

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await close_stream(self._source)

    def _name(self, chunk: Any) -> None:
        """Look no further than the answer's first chunk with choices: chunks before it
        (a prompt filter's) may name none."""
        named = answer_id(chunk)
        if named is not None:
            self.named = (named, getattr(chunk, "model", None))
        self._unnamed = named is None and not getattr(chunk, "choices", None)


def answer_id(answer: Any) -> str | None:
    """The `id` of a LiteLLM answer or chunk when the provider named it: None when it is
    missing, empty or of the shape LiteLLM makes up (`_MADE_UP_ID`)."""
    value = getattr(answer, "id", None)
    if isinstance(value, str) and value and not _MADE_UP_ID.match(value):
        return value
    return None


def made_up_end(source: Any) -> bool:
    """Whether the chunk LiteLLM's stream `source` just returned is one it made up: its
    source ran dry and the provider never gave a finish reason."""
    wrapper = _wrapper(source)
    return (
        getattr(wrapper, "sent_last_chunk", None) is True
        and getattr(wrapper, "received_finish_reason", None) is None
        and getattr(wrapper, "intermittent_finish_reason", None) is None
    )


def made_up_usage(source: Any) -> bool:
    """Whether the chunk LiteLLM's stream `source` just returned is its end-of-stream
    usage chunk (`sent_stream_usage` is set as it returns it) and the provider reported
    no usage: LiteLLM then counted the tokens itself, an estimate the provider never
    stated. A text stream whose wrapper is not found (a LiteLLM that holds it elsewhere
    than `_wrapper` looks) has none believed: its usage is never told from LiteLLM's."""
    wrapper = _wrapper(source)
    if wrapper is None:
        return True
    if getattr(wrapper, "sent_stream_usage", None) is not True:
        return False
    chunks = getattr(wrapper, "chunks", None)
    return not any(getattr(c, "usage", None) for c in chunks or ())


def install_stream_bound() -> None:
    """Make every stream wrapper LiteLLM creates keep little (`keep_little`) from the
    start: a text completion's is created inside LiteLLM (its `TextCompletionStreamWrapper`
    wraps a generator that makes it), as is the inner one of a chat served through a
    Responses API, where the gateway never sees them. That bridge's Responses stream keeps
    none of its text either, and makes up no usage the provider did not state
    (`_RESPONSES`). Idempotent; LiteLLM loaded. Raises `StreamBoundNotFound` when LiteLLM
    is not shaped as this expects (a silent no-op would keep every chunk again)."""
    module = importlib.import_module(_WRAPPER[0])
    after_init(getattr(module, _WRAPPER[1]), keep_little)
    responses = importlib.import_module(_RESPONSES[0])
    after_init(getattr(responses, _RESPONSES[1]), _keep_no_text)
    estimate = getattr(responses, _RESPONSES[2], None)
    if not callable(estimate):
        raise StreamBoundNotFound(f"{_RESPONSES[0]}.{_RESPONSES[2]} is not a function")
    if not getattr(estimate, _KEEPS_LITTLE, False):
        setattr(responses, _RESPONSES[2], _no_estimate)


def after_init(cls: Any, keep: Callable[[Any], None]) -> None:
    """Make `cls.__init__` call `keep(self)` once it returns; once, however often called."""
    init = cls.__init__
    if getattr(init, _KEEPS_LITTLE, False):
        return

    @functools.wraps(init)
    def bounded_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        keep(self)

    setattr(bounded_init, _KEEPS_LITTLE, True)
    cls.__init__ = bounded_init


def _no_estimate(*_args: Any, **_kwargs: Any) -> None:
    """In place of LiteLLM's estimate of a Responses stream's usage (from its text) when
    the provider's terminal event stated none: no usage, so that none is relayed or
    recorded as the provider's (the outer wrapper's own count is told apart, `made_up_usage`)."""
    return None


setattr(_no_estimate, _KEEPS_LITTLE, True)  # marked as the inits are: installed once


class StreamBoundNotFound(RuntimeError):
    """LiteLLM's stream wrappers are not shaped as `install_stream_bound` expects."""


def keep_little(wrapper: Any) -> None:
    """Make LiteLLM's stream wrapper keep a bounded part of what it returns (see the
    module's notes); before its first chunk is read."""
    _expect(wrapper, ("chunks", list), ("response_uptil_now", str))
    wrapper.chunks = _RecentChunks()
    wrapper.response_uptil_now = _Unkept()


def _keep_no_text(stream: Any) -> None:
    """Make LiteLLM's Responses stream keep none of the text and tool arguments it relays
    (read for its own usage estimate and mid-stream error text, neither used here)."""
    _expect(stream, ("_generated_content", str), ("_generated_tool_arguments", str))
    stream._generated_content = _Unkept()
    stream._generated_tool_arguments = _Unkept()


def _expect(obj: Any, *fields: tuple[str, type]) -> None:
    for name, kind in fields:
        if not isinstance(getattr(obj, name, None), kind):
            raise StreamBoundNotFound(
                f"LiteLLM's {type(obj).__name__} has no {kind.__name__} {name!r} to bound"
            )


class _RecentChunks(list[Any]):
    """The chunks LiteLLM's stream wrapper appends, of which it keeps, in order: the first
    (the builder reads the answer's id and model there), the last two (its check for a
    looping model compares them), the last one naming a `service_tier` (stated on its usage
    chunk), the first of the provider's usage chunks and the last `_USAGE_KEPT` of them.
    Thirteen at most, whatever the length of the stream."""

    def append(self, chunk: Any) -> None:
        super().append(chunk)
        if len(self) <= _USAGE_KEPT + 5:
            return
        usage = [i for i, c in enumerate(self) if getattr(c, "usage", None) is not None]
        tiers = [i for i, c in enumerate(self) if _service_tier(c)]
        kept = {0, len(self) - 2, len(self) - 1, *tiers[-1:], *usage[:1], *usage[-_USAGE_KEPT:]}
        self[:] = [c for i, c in enumerate(self) if i in kept]


def _service_tier(chunk: Any) -> bool:
    getter = getattr(chunk, "get", None)
    return callable(getter) and isinstance(getter("service_tier"), str)


class _Unkept(str):
    """A string that stays empty when added to: `response_uptil_now += text` keeps
    nothing. LiteLLM reads it for post-call rules (none: `litellm.post_call_rules` is
    emptied) and for the text of a mid-stream fallback error (never relayed)."""

    __slots__ = ()

    def __add__(self, other: str) -> _Unkept:
        return self


def _wrapper(source: Any) -> Any:
    """LiteLLM's `CustomStreamWrapper` of `source`, or None. A text-completion stream
    (`TextCompletionStreamWrapper`) holds LiteLLM's generators instead: its
    `completion_stream` is `litellm.main._async_streaming`, iterating its `response`, the
    text handler's `async_streaming`, which made the wrapper (its local `streamwrapper`)
    once its first chunk came. The wrapper is read from their frames: its flags (its
    made-up last chunk, its made-up usage) are nowhere else. Before, the first generator
    was taken for the wrapper and had no flag, so LiteLLM's own count of a text
    completion's tokens was relayed and recorded as the provider's usage."""
    if hasattr(source, "sent_last_chunk"):
        return source
    inner = getattr(source, "completion_stream", None)
    for _ in range(_GENERATORS):
        frame = getattr(inner, "ag_frame", None)  # None once a generator has finished
        if frame is None:
            return None
        local = frame.f_locals
        found = next((v for v in local.values() if hasattr(v, "sent_last_chunk")), None)
        if found is not None:
            return found
        inner = local.get("response")
    return None


def _has_finish_reason(chunk: Any) -> bool:
    choices = chunk.get("choices") if isinstance(chunk, dict) else getattr(chunk, "choices", None)
    for choice in choices or ():
        reason = choice.get("finish_reason") if isinstance(choice, dict) else None
        if reason or getattr(choice, "finish_reason", None):
            return True
    return False


def encoded(provider: str, encode: Callable[[], T]) -> T:
    """Run an `openai_wire` encoder; an answer it cannot encode is a protocol error."""
    try:
        return encode()
    except TypeError:  # not an object, or not JSON-encodable (orjson's error is a TypeError)
        failure = HostedError("protocol", f"{provider} answered in a shape LiteLLM did not map")
    try:
        raise failure
    finally:
        del failure  # not held by this frame, which its traceback holds (a cycle)


async def close_stream(stream: Any) -> None:
    """Close a LiteLLM stream, which closes the provider connection under it.

    Chat streams (`CustomStreamWrapper`) have `aclose()`; a text-completion stream
    (`TextCompletionStreamWrapper`) does not, and wraps a chat stream that does.
    """
    inner = stream if hasattr(stream, "aclose") else getattr(stream, "completion_stream", None)
    if inner is not None:
        await inner.aclose()
