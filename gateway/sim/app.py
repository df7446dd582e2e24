"""The simulator as a raw ASGI app: routing, auth, slow start, and the info endpoints.

`create_sim_app(settings)` builds a `SimApp`. Tests reach its run-time state directly:

- `app.control`: faults and load parameters, mutable while serving (`SimControl`);
- `app.stats`: request counters (`SimStats`); `app.engine`: running / waiting / KV state;
- `app.requests`: the last received requests, bytes as they arrived (`CapturedRequest`):
  at most `capture_limit` of them, whose bodies hold at most `CAPTURED_BYTES` together
  (the newest is kept whole whatever its size; older ones go first). `owngate demo`
  serves its tenants from simulators: 256 bodies at the gateway's 8 MiB limit held
  2 GiB of prompts after their answers.

Paths: `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/embeddings`,
`GET /v1/models`, `GET /health`, `GET /metrics`; kind llamacpp adds `GET /slots`,
`GET /props` and the aliases `GET /v1/health`, `GET /models`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Final

import orjson

from gateway.asgi import JSON, Receive, Scope, Send, lifespan, read_body, respond, wait_disconnect
from gateway.errors import ErrorCode, GatewayError
from gateway.sim.control import CapturedRequest, SimControl, SimStats
from gateway.sim.engine import Clock, Engine, MonotonicClock
from gateway.sim.inference import Inference
from gateway.sim.metrics import CONTENT_TYPE, render_metrics
from gateway.sim.responses import LOADING_BODY, error_body
from gateway.sim.settings import SimSettings
from gateway.sim.wire import (
    Completion,
    ContextTooLong,
    EmbeddingRequest,
    Endpoint,
    ModelNotFound,
    WireError,
    parse_completion,
    parse_embedding,
)

__all__ = ["CAPTURED_BYTES", "SimApp", "create_sim_app"]

CAPTURED_BYTES = 32 << 20
"""The request bodies a simulator keeps for `captured()`, together, the newest aside."""

_Handler = Callable[[bytes, Receive, Send], Awaitable[None]]

# llama-server answers these without an API key; vLLM guards only /v1/*.
_LLAMACPP_PUBLIC: Final = frozenset({"/health", "/v1/health", "/models", "/v1/models"})


class _Answer(Exception):
    """An error response decided while reading a request."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(status)
        self.status = status
        self.body = body


class SimApp:
    """An OpenAI-compatible server that behaves like vLLM, llama.cpp or SGLang under load."""

    def __init__(
        self,
        settings: SimSettings,
        *,
        clock: Clock | None = None,
        wall_time: Callable[[], float] = time.time,
        capture_limit: int = 256,
    ) -> None:
        self.settings = settings
        self.clock: Clock = clock or MonotonicClock()
        self.control = SimControl.from_settings(settings, self.clock.now())
        self.stats = SimStats()
        self.engine = Engine(self.control, self.clock)
        self.requests: deque[CapturedRequest] = deque(maxlen=capture_limit)
        self._captured_bytes = 0  # the bodies in `requests`, together
        self._wall_time = wall_time
        self._inference = Inference(
            settings, self.control, self.engine, self.stats, self.clock, wall_time
        )
        self._routes = self._build_routes()

    # -- run-time control for tests -----------------------------------------------------

    def start_loading(self, seconds: float) -> None:
        """Answer 503 "Loading model" for the next `seconds`, as if just (re)started."""
        self.control.faults = dataclasses.replace(self.control.faults, slow_start_s=seconds)
        self.control.started_at = self.clock.now()

    def captured(self, path: str | None = None) -> list[CapturedRequest]:
        """The captured requests, oldest first, optionally only those to `path`.

        Safe to call from another thread while the server appends (it copies first).
        """
        return [r for r in self.requests.copy() if path is None or r.path == path]

    # -- ASGI ---------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await lifespan(receive, send, self._started, self._stopped)

    async def _started(self) -> None:
        self.control.started_at = self.clock.now()

    async def _stopped(self) -> None:
        await self.engine.aclose()

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = await read_body(scope, receive, self.settings.max_body_bytes)
        except GatewayError as exc:
            if exc.code is ErrorCode.request_too_large:  # unread past the bound
                await respond(
                    send,
                    413,
                    error_body(self.settings.kind, 413, exc.message),
                    headers=((b"connection", b"close"),),
                )
            return  # otherwise the client left before sending its request
        method: str = scope["method"]
        path: str = scope["path"]
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        self._capture(
            CapturedRequest(method, path, scope.get("query_string", b""), tuple(headers), body)
        )
        route = self._routes.get(path)
        if route is None:
            await self._not_found(send)
        elif method != route[0]:
            await respond(send, 405, orjson.dumps({"detail": "Method Not Allowed"}))
        elif not self._authorized(path, headers):
            await self._unauthorized(send)
        else:
            await route[1](body, receive, send)

    def _capture(self, request: CapturedRequest) -> None:
        """Keep `request`, dropping the oldest past `capture_limit` or `CAPTURED_BYTES`."""
        kept = self.requests
        if kept.maxlen == 0:
            return
        if len(kept) == kept.maxlen:
            self._captured_bytes -= len(kept[0].body)  # the one append pushes out
        kept.append(request)
        self._captured_bytes += len(request.body)
        while len(kept) > 1 and self._captured_bytes > CAPTURED_BYTES:
            self._captured_bytes -= len(kept.popleft().body)

    def _build_routes(self) -> dict[str, tuple[str, _Handler]]:
        routes: dict[str, tuple[str, _Handler]] = {
            "/v1/chat/completions": ("POST", self._chat),
            "/v1/completions": ("POST", self._completions),
            "/v1/embeddings": ("POST", self._embeddings),
            "/v1/models": ("GET", self._models),
            "/health": ("GET", self._health),
            "/metrics": ("GET", self._metrics),
        }
        if self.settings.kind == "llamacpp":
            routes["/slots"] = ("GET", self._slots)
            routes["/props"] = ("GET", self._props)
            routes["/v1/health"] = ("GET", self._health)
            routes["/models"] = ("GET", self._models)
        return routes

    # -- auth and errors ----------------------------------------------------------------

    def _authorized(self, path: str, headers: list[tuple[bytes, bytes]]) -> bool:
        key = self.settings.api_key
        if key is None:
            return True
        if self.settings.kind == "llamacpp":
            if path in _LLAMACPP_PUBLIC:
                return True
        elif not path.startswith("/v1"):
            return True
        expected = b"Bearer " + key.encode()
        given = next((v for k, v in headers if k.lower() == b"authorization"), b"")
        return hmac.compare_digest(given, expected)

    async def _unauthorized(self, send: Send) -> None:
        if self.settings.kind == "llamacpp":
            await respond(send, 401, error_body("llamacpp", 401, "Invalid API Key"))
        else:
            await respond(send, 401, b'{"error":"Unauthorized"}')

    async def _not_found(self, send: Send) -> None:
        if self.settings.kind == "llamacpp":
            await respond(send, 404, error_body("llamacpp", 404, "File Not Found"))
        else:
            await respond(send, 404, b'{"detail":"Not Found"}')

    def _loading(self) -> bool:
        return self.control.loading(self.clock.now())

    # -- inference ----------------------------------------------------------------------

    def _request(self, endpoint: Endpoint | None, body: bytes) -> Completion | EmbeddingRequest:
        """Parse an inference request; raises `_Answer` with the error response to send."""
        kind = self.settings.kind
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            # llama-server answers malformed JSON with 500, vLLM and SGLang with 400.
            status = 500 if kind == "llamacpp" else 400
            raise _Answer(status, error_body(kind, status, f"JSON decode error: {exc}")) from exc
        if not isinstance(payload, dict):
            raise _Answer(400, error_body(kind, 400, "request body must be a JSON object"))
        try:
            if endpoint is None:
                return parse_embedding(payload, self.settings)
            return parse_completion(endpoint, payload, self.settings)
        except ModelNotFound as exc:
            raise _Answer(404, error_body(kind, 404, str(exc), param="model")) from exc
        except ContextTooLong as exc:
            err_type = "exceed_context_size_error" if kind == "llamacpp" else ""
            raise _Answer(400, error_body(kind, 400, str(exc), err_type=err_type)) from exc
        except WireError as exc:
            raise _Answer(400, error_body(kind, 400, str(exc))) from exc

    async def _completion_like(
        self, endpoint: Endpoint | None, body: bytes, receive: Receive, send: Send
    ) -> None:
        if self._loading():
            await respond(send, 503, LOADING_BODY)
            return
        try:
            request = self._request(endpoint, body)
        except _Answer as answer:
            await respond(send, answer.status, answer.body)
            return
        await self._inference.serve(request, receive, send)

    async def _chat(self, body: bytes, receive: Receive, send: Send) -> None:
        await self._completion_like("chat", body, receive, send)

    async def _completions(self, body: bytes, receive: Receive, send: Send) -> None:
        await self._completion_like("text", body, receive, send)

    async def _embeddings(self, body: bytes, receive: Receive, send: Send) -> None:
        await self._completion_like(None, body, receive, send)

    # -- info endpoints -----------------------------------------------------------------

    async def _health(self, body: bytes, receive: Receive, send: Send) -> None:
        delay = self.control.faults.health_delay_s
        if delay > 0 and not await self._outlived(delay, receive):
            return  # the prober gave up first
        if self._loading():
            await respond(send, 503, LOADING_BODY)
        elif self.settings.kind == "llamacpp":
            await respond(send, 200, b'{"status":"ok"}')
        else:
            await respond(send, 200, b"")

    async def _outlived(self, seconds: float, receive: Receive) -> bool:
        """Wait `seconds`; False if the client disconnected first."""
        late = asyncio.ensure_future(self.clock.sleep(seconds))
        gone = asyncio.ensure_future(wait_disconnect(receive))
        try:
            await asyncio.wait((late, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            late.cancel()
            gone.cancel()
        return late.done() and not late.cancelled()

    async def _models(self, body: bytes, receive: Receive, send: Send) -> None:
        settings = self.settings
        if settings.kind == "llamacpp" and self._loading():
            await respond(send, 503, LOADING_BODY)
            return
        created = int(self._wall_time())
        data: list[dict[str, object]] = []
        for name in settings.models if settings.kind != "llamacpp" else settings.models[:1]:
            entry: dict[str, object] = {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": settings.kind,  # "vllm", "llamacpp" or "sglang", as they answer
            }
            if settings.kind == "llamacpp":
                entry["meta"] = {"n_ctx_train": settings.n_ctx}
            else:
                entry.update(root=name, parent=None, max_model_len=settings.n_ctx)
            data.append(entry)
        await respond(send, 200, orjson.dumps({"object": "list", "data": data}))

    async def _metrics(self, body: bytes, receive: Receive, send: Send) -> None:
        text = render_metrics(self.settings.kind, self.settings.model, self.engine)
        await respond(send, 200, text, CONTENT_TYPE)

    async def _slots(self, body: bytes, receive: Receive, send: Send) -> None:
        if self._loading():
            await respond(send, 503, LOADING_BODY)
            return
        n_ctx = self.settings.n_ctx
        slots: list[dict[str, object]] = []
        for slot_id, seq in enumerate(self.engine.slot_table()):
            slots.append(
                {
                    "id": slot_id,
                    "n_ctx": n_ctx,
                    "is_processing": seq is not None,
                    "n_prompt_tokens": 0 if seq is None else seq.prompt_tokens,
                    "next_token": [
                        {
                            "has_next_token": seq is not None,
                            "n_decoded": 0 if seq is None else seq.generated,
                            "n_remain": -1 if seq is None else seq.max_tokens - seq.generated,
                        }
                    ],
                }
            )
        await respond(send, 200, orjson.dumps(slots))

    async def _props(self, body: bytes, receive: Receive, send: Send) -> None:
        if self._loading():
            await respond(send, 503, LOADING_BODY)
            return
        settings = self.settings
        props = {
            "default_generation_settings": {
                "n_ctx": settings.n_ctx,
                "params": {"n_predict": -1},
            },
            "total_slots": self.control.slots,
            "model_path": f"/models/{settings.model}.gguf",
            "modalities": {"vision": False, "audio": False},
            "build_info": "owngate-sim",
        }
        await respond(send, 200, orjson.dumps(props), JSON)


def create_sim_app(
    settings: SimSettings | None = None,
    *,
    clock: Clock | None = None,
    wall_time: Callable[[], float] = time.time,
) -> SimApp:
    """Build a simulator; `clock` drives the engine and slow start, `wall_time` `created`."""
    return SimApp(settings or SimSettings(), clock=clock, wall_time=wall_time)
