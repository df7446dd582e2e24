"""Pass-through of OpenAI requests to OpenAI-compatible private backends.

The body is parsed once (to read `model` and `stream`) and forwarded byte for byte;
only the `model` value is rewritten when the client used an alias. Streams are relayed
as the backend's bytes arrive, never re-encoded. A client that goes away cancels the
upstream request: the connection to the backend is dropped, which frees its slot.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.api.asgi import Receive, Send, send_bytes
from gateway.api.metrics import GatewayMetrics
from gateway.errors import ErrorCode, GatewayError
from gateway.routing.registry import BackendState, Registry, Route, TenantEntry
from gateway.upstream.http import UpstreamError, UpstreamResponse

__all__ = ["Exchange", "Proxy", "rewrite_model", "sanitize_upstream_message"]

_MAX_ATTEMPTS = 3
_MAX_ERROR_BODY = 64 * 1024
_SSE = b"text/event-stream"
_URL = re.compile(r"\b(?:https?|wss?)://[^\s\"'<>]+", re.IGNORECASE)
_HOST_PORT = re.compile(
    r"\[[0-9a-fA-F:.]+\](?::\d+)?"  # [IPv6]:port
    r"|\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b"  # IPv4[:port]
    r"|\b[\w-]+(?:\.[\w-]+)*:\d{1,5}\b"  # name:port
    r"|\blocalhost\b"
)


@dataclass(slots=True)
class Exchange:
    """What the app needs to know about one proxied request once it is over."""

    request_id: bytes
    started_at: float
    endpoint: str
    tenant: str = "-"
    model: str = "-"
    backend: str = "-"
    status: int = 0
    stream: bool = False
    response_started: bool = False
    client_gone: bool = False
    upstream_error: str | None = None


class Proxy:
    def __init__(self, registry: Registry, metrics: GatewayMetrics) -> None:
        self._registry = registry
        self._metrics = metrics
        self._rewrites: dict[tuple[str, str], re.Pattern[bytes]] = {}

    async def forward(
        self,
        exchange: Exchange,
        tenant: TenantEntry,
        body: bytes,
        upstream_path: bytes,
        receive: Receive,
        send: Send,
    ) -> None:
        doc = _parse_body(body)
        model = doc.get("model")
        if not isinstance(model, str) or not model:
            raise GatewayError(
                ErrorCode.missing_model,
                "you must provide a model parameter (a string naming the model)",
                param="model",
            )
        exchange.model = model if len(model) <= 256 else model[:256] + "..."
        exchange.stream = doc.get("stream") is True
        routes = self._registry.candidates(model) if tenant.may_use(model) else None
        if routes is None:
            raise GatewayError(
                ErrorCode.model_not_found,
                f"The model `{exchange.model}` does not exist or you do not have access to it.",
                param="model",
            )
        private = [r for r in routes if r.backend.pool is not None]
        if not private:
            raise GatewayError(
                ErrorCode.permission_denied,
                f"The model `{model}` is served only by hosted providers; owngate sends "
                "requests to a hosted provider only when a trust policy allows it, and "
                "no policy allows one for this tenant.",
                param="model",
            )
        watcher = _watch_disconnect(receive, exchange)
        try:
            await self._dispatch(exchange, private, model, doc, body, upstream_path, send)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            # Ours (the client left) and nobody else's (e.g. shutdown): absorb it.
            if not exchange.client_gone or current is None or current.uncancel() > 0:
                raise
            exchange.status = 499  # client closed the request (nginx's convention)
        finally:
            watcher.cancel()

    async def _dispatch(
        self,
        exchange: Exchange,
        routes: list[Route],
        model: str,
        doc: dict[str, Any],
        body: bytes,
        upstream_path: bytes,
        send: Send,
    ) -> None:
        failures: list[str] = []
        available = [r for r in routes if not self._registry.is_down(r.backend)]
        if not available:
            failures = [_why_down(r.backend) for r in routes]
        for route in available[:_MAX_ATTEMPTS]:
            backend = route.backend
            out = body if route.upstream_model == model else self._rename(doc, body, model, route)
            headers = [
                (b"content-type", b"application/json"),
                (b"x-request-id", exchange.request_id),
            ]
            if backend.auth_header is not None:
                headers.append((b"authorization", backend.auth_header))
            exchange.backend = backend.id
            self._enter(backend)
            try:
                assert backend.pool is not None
                try:
                    response = await backend.pool.request(
                        b"POST", backend.base_path + upstream_path, headers, out
                    )
                except UpstreamError as exc:
                    self._metrics.upstream_error(backend.id, exc.kind)
                    exchange.upstream_error = exc.kind
                    if exc.kind == "timeout":
                        raise GatewayError(
                            ErrorCode.upstream_timeout,
                            "the backend did not answer in time",
                        ) from exc
                    if exc.kind in ("connect", "closed"):
                        self._registry.mark_down(backend)
                    failures.append(f"{backend.id}: {exc.kind}")
                    continue
                try:
                    await self._relay(exchange, backend, response, send)
                except UpstreamError as exc:
                    if exchange.response_started:
                        raise
                    # Broke off before the client saw a byte: another backend may serve it.
                    self._metrics.upstream_error(backend.id, exc.kind)
                    exchange.upstream_error = exc.kind
                    self._registry.mark_down(backend)
                    failures.append(f"{backend.id}: {exc.kind}")
                    continue
                return
            finally:
                self._leave(backend)
        raise GatewayError(
            ErrorCode.backend_unavailable,
            f"no backend could take the request for model `{model}` ({'; '.join(failures)})",
        )

    async def _relay(
        self, exchange: Exchange, backend: BackendState, response: UpstreamResponse, send: Send
    ) -> None:
        try:
            await self._relay_body(exchange, backend, response, send)
        finally:
            response.abort()  # no-op once the exchange completed and the connection is pooled

    async def _relay_body(
        self, exchange: Exchange, backend: BackendState, response: UpstreamResponse, send: Send
    ) -> None:
        status = response.status
        content_type = response.header(b"content-type") or b"application/json"
        if status >= 400:
            data = await _read_bounded(response)
            self._metrics.upstream_error(backend.id, "status")
            exchange.upstream_error = f"status {status}"
            pool = backend.pool
            raise translate_upstream_error(status, data, (pool.host,) if pool else ())
        if not content_type.startswith(_SSE):
            data = await response.read()
            exchange.status = status
            exchange.response_started = True
            await send_bytes(send, status, data, exchange.request_id, content_type)
            return
        exchange.status = status
        exchange.response_started = True
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", content_type),
                    (b"cache-control", b"no-cache"),
                    (b"x-request-id", exchange.request_id),
                ],
            }
        )
        first = True
        try:
            async for data in response.chunks():
                if first:
                    first = False
                    self._metrics.observe_ttft(
                        exchange.endpoint, backend.id, time.perf_counter() - exchange.started_at
                    )
                await send({"type": "http.response.body", "body": data, "more_body": True})
        except UpstreamError as exc:
            if exchange.client_gone:
                raise asyncio.CancelledError from exc
            self._metrics.upstream_error(backend.id, exc.kind)
            exchange.upstream_error = exc.kind
            error = GatewayError(
                ErrorCode.upstream_error if exc.kind != "timeout" else ErrorCode.upstream_timeout,
                "the backend failed in the middle of the stream",
            )
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + error.body() + b"\n\n",
                    "more_body": True,
                }
            )
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _rename(self, doc: dict[str, Any], body: bytes, model: str, route: Route) -> bytes:
        key = (model, route.upstream_model)
        pattern = self._rewrites.get(key)
        if pattern is None:
            pattern = self._rewrites[key] = _model_pattern(model)
        return rewrite_model(body, doc, pattern, route.upstream_model)

    def _enter(self, backend: BackendState) -> None:
        backend.inflight += 1
        self._metrics.set_inflight(backend.id, backend.inflight)

    def _leave(self, backend: BackendState) -> None:
        backend.inflight -= 1
        self._metrics.set_inflight(backend.id, backend.inflight)


def _why_down(backend: BackendState) -> str:
    return f"{backend.id}: {backend.health_error or 'failed moments ago'}"


def _parse_body(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise GatewayError(
            ErrorCode.invalid_json,
            f"We could not parse the JSON body of your request ({exc.args[0]}).",
        ) from exc
    if not isinstance(doc, dict):
        raise GatewayError(ErrorCode.invalid_request, "the request body must be a JSON object")
    if body.count(b'"model"') > 1 and _repeats_model_key(body):
        # The gateway routes on one value; a backend could read the other.
        raise GatewayError(
            ErrorCode.invalid_request, "the request body repeats the `model` key", param="model"
        )
    return doc


def _repeats_model_key(body: bytes) -> bool:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        if sum(1 for key, _ in items if key == "model") > 1:
            raise ValueError("repeated model key")
        return dict(items)

    try:
        json.loads(body, object_pairs_hook=pairs)
    except ValueError:
        return True
    return False


def _model_pattern(model: str) -> re.Pattern[bytes]:
    return re.compile(rb'("model"\s*:\s*)' + re.escape(orjson.dumps(model)))


def rewrite_model(
    body: bytes, doc: dict[str, Any], pattern: re.Pattern[bytes], upstream_model: str
) -> bytes:
    """Replace the top-level `model` value, touching no other byte when that is certain.

    The byte-level splice is used only when the pattern matches exactly once and the
    result, parsed again, has the new name at the top level; otherwise (escaped names,
    the same pair nested elsewhere) the document is re-encoded.
    """
    if len(pattern.findall(body)) == 1:
        out = pattern.sub(lambda m: m.group(1) + orjson.dumps(upstream_model), body, count=1)
        if orjson.loads(out).get("model") == upstream_model:
            return out
    return orjson.dumps({**doc, "model": upstream_model})


def _watch_disconnect(receive: Receive, exchange: Exchange) -> asyncio.Task[None]:
    task = asyncio.current_task()

    async def watch() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                exchange.client_gone = True
                if task is not None:
                    task.cancel()
                return

    return asyncio.create_task(watch())


async def _read_bounded(response: UpstreamResponse) -> bytes:
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in response.chunks():
            parts.append(chunk)
            size += len(chunk)
            if size > _MAX_ERROR_BODY:
                response.abort()
                break
    except UpstreamError:
        pass  # the status code alone still tells the client what happened
    return b"".join(parts)


def sanitize_upstream_message(message: str, hosts: tuple[str, ...] = ()) -> str:
    """Strip URLs, host:port pairs and the backend's own host names from a backend's
    error text; bound its length."""
    cleaned = _HOST_PORT.sub("[backend]", _URL.sub("[backend]", message))
    for host in hosts:
        cleaned = cleaned.replace(host, "[backend]")
    return cleaned[:300]


def translate_upstream_error(status: int, data: bytes, hosts: tuple[str, ...] = ()) -> GatewayError:
    """Turn a backend's error response into the gateway's own OpenAI error."""
    detail = sanitize_upstream_message(_upstream_message(data), hosts)
    suffix = f": {detail}" if detail else ""
    if status in (400, 413, 422):
        return GatewayError(
            ErrorCode.upstream_bad_request, f"the backend rejected the request{suffix}"
        )
    if status in (401, 403):
        return GatewayError(
            ErrorCode.upstream_error,
            "the backend refused the gateway's credentials (check the backend's api_key)",
        )
    if status in (429, 503):
        return GatewayError(
            ErrorCode.backend_unavailable, f"the backend is overloaded or not ready{suffix}"
        )
    if status in (408, 504):
        return GatewayError(ErrorCode.upstream_timeout, "the backend timed out")
    return GatewayError(ErrorCode.upstream_error, f"the backend failed (HTTP {status}){suffix}")


def _upstream_message(data: bytes) -> str:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return ""
    if isinstance(doc, dict):
        error = doc.get("error", doc.get("detail", doc.get("message")))
        if isinstance(error, dict):
            error = error.get("message")
        if isinstance(error, str):
            return error
    return ""
