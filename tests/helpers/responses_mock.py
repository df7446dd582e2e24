"""A small raw-ASGI server that speaks OpenAI's Responses API (`POST .../responses`).

What LiteLLM's chat-to-Responses bridge sends a model it serves through that API
(`mode: responses` in its model map: `o3-pro`, `gpt-5-pro`, codex models; Azure's
deployments of them): tests read `received` (path, headers lower-cased, JSON body) to
see the fields that reached the provider. Any path ending in `/responses` answers
(OpenAI's `/v1/responses`, Azure's `/openai/responses` and `/openai/v1/responses`), any
other path 404s. An answer is one `message` output item of `output_text` with `reply`;
`"stream": true` gets the event sequence a client of the API sees
(`response.created`, `response.output_item.added`, `response.content_part.added`,
`response.output_text.delta`..., `response.output_text.done`,
`response.content_part.done`, `response.output_item.done`, `response.completed`).
Shapes follow OpenAI's API reference ("Responses", "Streaming events"). Run it with
`gateway.serving.ServerThread`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from gateway.asgi import Receive, Scope, Send, read_body, respond
from gateway.errors import GatewayError

__all__ = ["Received", "ResponsesMock"]

RESPONSE_ID: Final = "resp_mock0001"
MESSAGE_ID: Final = "msg_mock0001"
_SSE_HEADERS: Final = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


@dataclass(frozen=True, slots=True)
class Received:
    """One request as the mock saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass(eq=False)
class ResponsesMock:
    """A Responses API endpoint; `reply` is the assistant text, streamed word by word."""

    reply: str = "Hello from the Responses mock ."
    received: list[Received] = field(default_factory=list)

    def reset(self) -> None:
        """Forget what was received (between tests)."""
        self.received.clear()

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
        if scope["method"] != "POST" or not scope["path"].endswith("/responses"):
            error = {"message": "not found", "type": "invalid_request_error"}
            await respond(send, 404, orjson.dumps({"error": error}))
        elif body.get("stream") is True:
            await self._stream(body, send)
        else:
            await respond(send, 200, orjson.dumps(self._response(body, "completed")))

    def _message(self, text: str, status: str) -> dict[str, Any]:
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        return {
            "type": "message",
            "id": MESSAGE_ID,
            "status": status,
            "role": "assistant",
            "content": [part] if text else [],
        }

    def _response(self, body: dict[str, Any], status: str) -> dict[str, Any]:
        done = status == "completed"
        words = self.reply.split()
        return {
            "id": RESPONSE_ID,
            "object": "response",
            "created_at": 1_700_000_000,
            "status": status,
            "model": body.get("model", ""),
            "output": [self._message(self.reply, "completed")] if done else [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "store": body.get("store", True),  # the API's default: stored
            "usage": {
                "input_tokens": 3,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": len(words),
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 3 + len(words),
            }
            if done
            else None,
        }

    async def _stream(self, body: dict[str, Any], send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        where = {"output_index": 0, "item_id": MESSAGE_ID}
        empty_part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        text_part = {**empty_part, "text": self.reply}
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": self._response(body, "in_progress")},
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": self._message("", "in_progress"),
            },
            {
                "type": "response.content_part.added",
                **where,
                "content_index": 0,
                "part": empty_part,
            },
        ]
        for i, word in enumerate(self.reply.split()):
            delta = word if i == 0 else f" {word}"
            events.append(
                {"type": "response.output_text.delta", **where, "content_index": 0, "delta": delta}
            )
        events += [
            {"type": "response.output_text.done", **where, "content_index": 0, "text": self.reply},
            {"type": "response.content_part.done", **where, "content_index": 0, "part": text_part},
            {
                "type": "response.output_item.done",
                "output_index": 0,
                "item": self._message(self.reply, "completed"),
            },
            {"type": "response.completed", "response": self._response(body, "completed")},
        ]
        for number, event in enumerate(events):
            data = orjson.dumps({**event, "sequence_number": number})
            chunk = b"event: " + event["type"].encode() + b"\ndata: " + data + b"\n\n"
            last = number == len(events) - 1
            await send({"type": "http.response.body", "body": chunk, "more_body": not last})
