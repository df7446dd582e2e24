"""Serving chat, completion and embedding requests: faults, the engine, or zero latency.

Each accepted request draws its fate from the app's seeded RNG (ok, error, hang, die).
In timed mode the request becomes an engine `Sequence` and a watcher task listens for
`http.disconnect`: a client that goes away cancels the sequence and frees its slot at
once. In zero-latency mode the whole response is built and written at once, or, for a
stream with `token_interval_s`, one token per write with that pause between writes (the
pause is the only wait: no queue, no prefill).

Dying is done the way an ASGI app can: return without completing the response, so the
server closes the connection (uvicorn logs "ASGI callable returned without completing
response."). Streams die after a few chunks; non-streaming responses after the headers.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import random
import secrets
from collections.abc import Callable, Coroutine
from typing import Any, Final

from gateway.asgi import JSON, Receive, Send, respond, start, wait_disconnect
from gateway.sim.control import SimControl, SimStats
from gateway.sim.engine import Clock, Engine, SeqState, Sequence
from gateway.sim.prefix import prompt_chain
from gateway.sim.responses import ChunkEncoder, completion_body, embedding_body, error_body
from gateway.sim.settings import SimSettings
from gateway.sim.text import TextGenerator
from gateway.sim.wire import Completion, EmbeddingRequest

__all__ = ["Fate", "Inference"]

# Content chunks a dying stream still sends, at most.
_CHUNKS_BEFORE_DYING = 3
_SSE_HEADERS: Final = ((b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"))


class Fate(enum.Enum):
    OK = "ok"
    ERROR = "error"
    HANG = "hang"
    DIE = "die"


class Inference:
    """Runs accepted inference requests for one `SimApp`."""

    def __init__(
        self,
        settings: SimSettings,
        control: SimControl,
        engine: Engine,
        stats: SimStats,
        clock: Clock,
        wall_time: Callable[[], float],
    ) -> None:
        self._settings = settings
        self._control = control
        self._engine = engine
        self._stats = stats
        self._clock = clock
        self._wall_time = wall_time
        self._rng = random.Random(settings.seed)  # noqa: S311 - seeded on purpose: reproducible faults
        self._text = TextGenerator(settings.seed)
        self._ids = itertools.count(1)
        self._id_prefix = secrets.token_hex(6)

    def draw_fate(self) -> Fate:
        """One seeded draw; the fault rates are consecutive slices of it."""
        faults = self._control.faults
        draw = self._rng.random()
        for fate, rate in (
            (Fate.ERROR, faults.error_rate),
            (Fate.HANG, faults.hang_rate),
            (Fate.DIE, faults.die_mid_stream_rate),
        ):
            if draw < rate:
                return fate
            draw -= rate
        return Fate.OK

    async def serve(
        self, request: Completion | EmbeddingRequest, receive: Receive, send: Send
    ) -> None:
        fate = self.draw_fate()
        stats = self._stats
        stats.started += 1
        stats.in_flight += 1
        try:
            if fate is Fate.ERROR:
                stats.errors += 1
                body = error_body(self._settings.kind, 500, "Simulated internal server error")
                await respond(send, 500, body)
            elif fate is Fate.HANG:
                stats.hangs += 1
                await wait_disconnect(receive)
                stats.cancelled += 1
            elif self._control.zero_latency:
                await self._instant(request, fate is Fate.DIE, send, receive)
            else:
                await self._watched(self._timed(request, fate is Fate.DIE, send), receive)
        finally:
            stats.in_flight -= 1

    # -- zero latency -------------------------------------------------------------------

    async def _instant(
        self, request: Completion | EmbeddingRequest, die: bool, send: Send, receive: Receive
    ) -> None:
        if isinstance(request, EmbeddingRequest):
            self._engine.record_instant(request.prompt_tokens, 0)
            await self._finish(send, self._embedding(request), die)
            return
        ids = self._text.token_ids(request.prompt, request.max_tokens)
        self._engine.record_instant(request.prompt_tokens, len(ids) * request.choices)
        if not request.stream:
            await self._finish(send, self._completion(request, ids), die)
            return
        if request.choices > 1:
            await self._instant_choices(request, die, send, receive)
            return
        encoder = ChunkEncoder(request, self._new_id(request), int(self._wall_time()))
        tokens = self._text.json_tokens
        if die:
            ids = ids[: min(_CHUNKS_BEFORE_DYING, len(ids) - 1)]
            self._stats.died += 1
        else:
            self._stats.completed += 1
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        if self._settings.token_interval_s > 0.0:
            steps = [encoder.token(tokens[i]) for i in ids]
            paced = self._paced(encoder.role, steps, None if die else encoder.end(), send)
            await self._watched(paced, receive)  # a client that leaves ends the pacing
            return
        if self._settings.coalesce_chunks:
            body = encoder.role + encoder.tokens([tokens[i] for i in ids])
            if not die:
                body += encoder.end()
            await send({"type": "http.response.body", "body": body, "more_body": die})
            return
        # One message per SSE event, as a real server writes them.
        if encoder.role:
            await send({"type": "http.response.body", "body": encoder.role, "more_body": True})
        token = encoder.token
        for i in ids:
            await send({"type": "http.response.body", "body": token(tokens[i]), "more_body": True})
        if not die:
            await send({"type": "http.response.body", "body": encoder.end()})

    async def _instant_choices(
        self, request: Completion, die: bool, send: Send, receive: Receive
    ) -> None:
        """A zero-latency stream of several choices (`n` > 1 or several prompts), interleaved
        as vLLM sends them: each write (a step) holds one token of every choice, each chunk
        with its choice's index; then every choice's finish chunk, and one usage chunk and
        `[DONE]`."""
        response_id, created = self._new_id(request), int(self._wall_time())
        encoders = [ChunkEncoder(request, response_id, created, i) for i in range(request.choices)]
        tokens = self._text.json_tokens
        per_choice = [self._choice_ids(request, i) for i in range(request.choices)]
        columns = [
            [enc.token(tokens[i]) for i in ids]
            for enc, ids in zip(encoders, per_choice, strict=True)
        ]
        steps = [b"".join(step) for step in zip(*columns, strict=True)]
        end: bytes | None = None
        if die:
            steps = steps[: min(_CHUNKS_BEFORE_DYING, len(steps) - 1)]
            self._stats.died += 1
        else:
            self._stats.completed += 1
            end = b"".join([enc.finish for enc in encoders]) + encoders[0].close()
        head = b"".join([enc.role for enc in encoders])
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        if self._settings.token_interval_s > 0.0:
            await self._watched(self._paced(head, steps, end, send), receive)
            return
        if self._settings.coalesce_chunks:
            body = head + b"".join(steps) + (end or b"")
            await send({"type": "http.response.body", "body": body, "more_body": die})
            return
        for body in [head, *steps] if head else steps:
            await send({"type": "http.response.body", "body": body, "more_body": True})
        if end is not None:
            await send({"type": "http.response.body", "body": end})

    async def _paced(self, head: bytes, steps: list[bytes], end: bytes | None, send: Send) -> None:
        """One write per step, `token_interval_s` apart (`head`, the role chunks, rides with
        the first); `end` after the last, unless the stream dies (None)."""
        interval, sleep = self._settings.token_interval_s, self._clock.sleep
        pending = head
        for index, step in enumerate(steps):
            if index:
                await sleep(interval)
            await send({"type": "http.response.body", "body": pending + step, "more_body": True})
            pending = b""
        if end is not None:
            await send({"type": "http.response.body", "body": end})

    # -- timed (engine) -----------------------------------------------------------------

    async def _watched(self, work: Coroutine[Any, Any, None], receive: Receive) -> None:
        """Run `work` until it ends or the client disconnects; a disconnect cancels it."""
        loop = asyncio.get_running_loop()
        work_task = loop.create_task(work)
        watch_task = loop.create_task(wait_disconnect(receive))
        try:
            await asyncio.wait((work_task, watch_task), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch_task.cancel()
            if not work_task.done():
                work_task.cancel()
                self._stats.cancelled += 1
        # Wait for the cancelled work to unwind (its `finally` frees the slot); a failure
        # of the work itself is re-raised, never swallowed.
        await asyncio.wait((work_task,))
        if not work_task.cancelled() and (failure := work_task.exception()) is not None:
            raise failure

    async def _timed(self, request: Completion | EmbeddingRequest, die: bool, send: Send) -> None:
        if isinstance(request, EmbeddingRequest):
            seq = self._engine.submit(request.prompt_tokens, 0)
            try:
                if await self._until_done(seq):
                    await self._finish(send, self._embedding(request), die)
            finally:
                self._engine.cancel(seq)
            return
        chain = None
        if request.endpoint == "chat" and self._control.prefix_cache_tokens > 0:
            chain = prompt_chain(request.prompt)
        # One sequence per choice, as vLLM schedules the `n` samples of a request: each
        # holds a slot and its KV, and they all count in the queue and token metrics; a
        # choice of a list of prompts prefills its own prompt's tokens.
        submit, source = self._engine.submit, request.source
        seqs = [submit(source(i)[2], request.max_tokens, chain) for i in range(request.choices)]
        try:
            if request.stream:
                await self._stream_timed(request, seqs, die, send)
            elif await self._all_done(seqs):
                ids = self._text.token_ids(request.prompt, request.max_tokens)
                await self._finish(send, self._completion(request, ids), die)
        finally:
            for seq in seqs:
                self._engine.cancel(seq)

    @staticmethod
    async def _until_done(seq: Sequence) -> bool:
        """Wait for the sequence to end; True when it finished (not cancelled)."""
        while not seq.done:
            await seq.progress()
        return seq.state is SeqState.FINISHED

    @classmethod
    async def _all_done(cls, seqs: list[Sequence]) -> bool:
        """Wait for every sequence to end; True when they all finished."""
        for seq in seqs:
            if not await cls._until_done(seq):
                return False
        return True

    async def _stream_timed(
        self, request: Completion, seqs: list[Sequence], die: bool, send: Send
    ) -> None:
        """Each write holds the tokens every choice's sequence generated since the last;
        one sequence per choice (`n`), each chunk with its choice's index."""
        response_id, created = self._new_id(request), int(self._wall_time())
        encoders = [ChunkEncoder(request, response_id, created, i) for i in range(len(seqs))]
        tokens = self._text.json_tokens
        per_choice = [self._choice_ids(request, i) for i in range(len(seqs))]
        cut = min(_CHUNKS_BEFORE_DYING, request.max_tokens - 1) if die else request.max_tokens
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        pending = b"".join(
            [enc.role for enc in encoders]
        )  # sent with the first token, as vLLM does
        sent = [0] * len(seqs)
        while True:
            await next((seq for seq in seqs if not seq.done), seqs[0]).progress()
            if any(seq.state is SeqState.CANCELLED for seq in seqs):
                return  # engine shut down: leave the response incomplete
            ready = [min(seq.generated, cut) for seq in seqs]
            dying = die and all(r == cut for r in ready)
            if ready != sent or dying:
                spans = zip(encoders, per_choice, sent, ready, strict=True)
                body = pending + b"".join(
                    [enc.tokens([tokens[i] for i in ids[a:b]]) for enc, ids, a, b in spans]
                )
                if dying:
                    self._stats.died += 1
                await send({"type": "http.response.body", "body": body, "more_body": True})
                if dying:
                    return  # incomplete response: the server closes the connection
                pending, sent = b"", ready
            if all(seq.state is SeqState.FINISHED for seq in seqs):
                break
        self._stats.completed += 1
        end = b"".join([enc.finish for enc in encoders]) + encoders[0].close()
        await send({"type": "http.response.body", "body": end})

    # -- shared -------------------------------------------------------------------------

    async def _finish(self, send: Send, body: bytes, die: bool) -> None:
        """Write a whole JSON response, or when dying only its headers."""
        if die:
            self._stats.died += 1
            await send(start(200, JSON, len(body)))
            return
        self._stats.completed += 1
        await respond(send, 200, body)

    def _new_id(self, request: Completion) -> str:
        prefix = "chatcmpl-" if request.endpoint == "chat" else "cmpl-"
        return f"{prefix}{self._id_prefix}{next(self._ids):010x}"

    def _completion(self, request: Completion, ids: list[int]) -> bytes:
        """The whole answer: choice 0 of `ids`, the others of their own tokens."""
        text = self._text
        texts = [text.text(ids)]
        for choice in range(1, request.choices):
            texts.append(text.text(self._choice_ids(request, choice)))
        return completion_body(request, self._new_id(request), int(self._wall_time()), texts)

    def _choice_ids(self, request: Completion, index: int) -> list[int]:
        """Choice `index`'s token ids: from its own prompt and its number within it."""
        prompt, choice, _ = request.source(index)
        return self._text.token_ids(prompt, request.max_tokens, choice)

    def _embedding(self, request: EmbeddingRequest) -> bytes:
        dims = request.dims
        return embedding_body(request, [self._text.embedding(i, dims) for i in request.inputs])
