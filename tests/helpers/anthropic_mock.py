"""A small raw-ASGI server that speaks Anthropic's Messages API wire format.

Only what a client of `POST /v1/messages` sees: the `x-api-key` and `anthropic-version`
headers are checked, answers carry `content` blocks, `stop_reason` and
`usage.input_tokens/output_tokens`, and `"stream": true` gets the SSE event sequence
(`message_start`, `content_block_start`, `ping`, `content_block_delta` with `text_delta`,
`content_block_stop`, `message_delta`, `message_stop`). Shapes follow Anthropic's API
reference (docs.anthropic.com: "Messages", "Streaming Messages", "Errors").

Tests read `received` (what arrived, headers lower-cased) and the counters, and set
`error` to make every request fail with an Anthropic error body, e.g.
`mock.error = (529, "overloaded_error")`; `error_message` replaces the standard text (a
real provider sometimes quotes the request back in it). `cut_after = N` ends every
stream's body after its first N text deltas, cleanly framed but without `message_delta`
and `message_stop` (a provider that closed the stream early); `stop_reason = ("pause_turn",)`
sends that `stop_reason` (or null, `(None,)`) in place of the one the answer earned;
`second_stop_reason = ("max_tokens",)` sends a second `message_delta` with that `stop_reason`
(an honest stream sends one: a contradictory stream); `pings_after_stop = N` sends N
`ping` events after the first `message_delta`. Run it with
`gateway.serving.ServerThread`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from gateway.asgi import Receive, Scope, Send, read_body, respond, wait_disconnect
from gateway.errors import GatewayError

__all__ = ["AnthropicMock", "Received"]

# Anthropic names each answer in a `request-id` header too (the gateway records it).
REQUEST_ID: Final = b"req_mock0001"
_SSE_HEADERS: Final = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"request-id", REQUEST_ID),
]
_ERROR_MESSAGES: Final = {
    "invalid_request_error": "There was an issue with the format or content of your request.",
    "authentication_error": "invalid x-api-key",
    "not_found_error": "The requested resource could not be found.",
    "rate_limit_error": "Number of requests has exceeded your rate limit.",
    "api_error": "An unexpected error has occurred internal to Anthropic's systems.",
    "overloaded_error": "Overloaded",
}


@dataclass(frozen=True, slots=True)
class Received:
    """One request as the mock saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass(eq=False)
class AnthropicMock:
    """An Anthropic Messages API endpoint; `reply` is the assistant text, word by word."""

    api_key: str
    reply: str = "Hello from the Anthropic mock ."
    event_delay_s: float = 0.0
    error: tuple[int, str] | None = None
    error_message: str | None = None
    cut_after: int | None = None
    stop_reason: tuple[str | None] | None = None
    second_stop_reason: tuple[str | None] | None = None
    pings_after_stop: int = 0
    received: list[Received] = field(default_factory=list)
    completed: int = 0
    disconnects: int = 0

    def reset(self, reply: str = "Hello from the Anthropic mock .") -> None:
        """Forget what was received and clear the error mode (between tests)."""
        self.reply = reply
        self.event_delay_s = 0.0
        self.error = None
        self.error_message = None
        self.cut_after = None
        self.stop_reason = None
        self.second_stop_reason = None
        self.pings_after_stop = 0
        self.received.clear()
        self.completed = 0
        self.disconnects = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].rsplit(".", 1)[-1]
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        if scope["type"] != "http":
            return
        try:
            raw = await read_body(scope, receive)
        except GatewayError:
            return  # the client left
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            body = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            body = {}
        self.received.append(Received(scope["method"], scope["path"], headers, body))
        problem = self._problem(scope, headers, body)
        if problem is not None:
            status, error_type = problem
            text = self.error_message if problem == self.error else None
            await _send_error(send, status, error_type, text)
        elif body.get("stream") is True:
            await self._stream(body, receive, send)
        else:
            answer = orjson.dumps(self._message(body))
            await respond(send, 200, answer, headers=((b"request-id", REQUEST_ID),))
            self.completed += 1

    def _problem(
        self, scope: Scope, headers: dict[str, str], body: dict[str, Any]
    ) -> tuple[int, str] | None:
        if scope["path"] != "/v1/messages":
            return 404, "not_found_error"
        if scope["method"] != "POST":
            return 405, "invalid_request_error"
        if headers.get("x-api-key") != self.api_key:
            return 401, "authentication_error"
        if not headers.get("anthropic-version"):
            return 400, "invalid_request_error"
        well_formed = isinstance(body.get("messages"), list) and isinstance(
            body.get("max_tokens"), int
        )
        if not well_formed:
            return 400, "invalid_request_error"
        return self.error

    def _words(self, body: dict[str, Any]) -> tuple[list[str], str | None]:
        words = self.reply.split()
        limit = body["max_tokens"]
        if self.stop_reason is not None:
            return words[:limit], self.stop_reason[0]
        return (words[:limit], "max_tokens") if len(words) > limit else (words, "end_turn")

    def _message(self, body: dict[str, Any]) -> dict[str, Any]:
        words, stop_reason = self._words(body)
        return {
            "id": "msg_mock0001",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", ""),
            "content": [{"type": "text", "text": " ".join(words)}],
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": _input_tokens(body), "output_tokens": len(words)},
        }

    async def _stream(self, body: dict[str, Any], receive: Receive, send: Send) -> None:
        writer = asyncio.ensure_future(self._write_events(body, send))
        watcher = asyncio.ensure_future(wait_disconnect(receive))
        done, _ = await asyncio.wait({writer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if writer in done:
            watcher.cancel()
            writer.result()
            self.completed += 1
            return
        writer.cancel()
        self.disconnects += 1

    async def _write_events(self, body: dict[str, Any], send: Send) -> None:
        words, stop_reason = self._words(body)
        start = {**self._message(body), "content": [], "stop_reason": None}
        start["usage"] = {"input_tokens": _input_tokens(body), "output_tokens": 1}
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        await _event(send, "message_start", {"type": "message_start", "message": start})
        block = {"type": "text", "text": ""}
        await _event(
            send,
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": block},
        )
        await _event(send, "ping", {"type": "ping"})
        for i, word in enumerate(words):
            if i == self.cut_after:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            if self.event_delay_s:
                await asyncio.sleep(self.event_delay_s)
            delta = {"type": "text_delta", "text": word if i == 0 else f" {word}"}
            await _event(
                send,
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": delta},
            )
        await _event(send, "content_block_stop", {"type": "content_block_stop", "index": 0})
        for n, reason in enumerate((stop_reason, *(self.second_stop_reason or ()))):
            await _event(
                send,
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": None},
                    "usage": {"output_tokens": len(words)},
                },
            )
            for _ in range(self.pings_after_stop if n == 0 else 0):
                await _event(send, "ping", {"type": "ping"})
        await _event(send, "message_stop", {"type": "message_stop"}, last=True)


def _input_tokens(body: dict[str, Any]) -> int:
    """Words in the system prompt and the messages' text: a stand-in for tokens."""
    texts: list[str] = []
    for part in [body.get("system", "")] + [m.get("content", "") for m in body["messages"]]:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, list):
            texts += [b.get("text", "") for b in part if isinstance(b, dict)]
    return sum(len(t.split()) for t in texts)


async def _event(send: Send, name: str, data: dict[str, Any], *, last: bool = False) -> None:
    chunk = b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
    await send({"type": "http.response.body", "body": chunk, "more_body": not last})


async def _send_error(send: Send, status: int, error_type: str, text: str | None) -> None:
    message = text or _ERROR_MESSAGES.get(error_type, error_type)
    payload = {"type": "error", "error": {"type": error_type, "message": message}}
    await respond(send, status, orjson.dumps(payload))
