"""An OTLP/HTTP traces receiver on loopback for tests of a real `owngate serve`: it keeps
what it is sent (bounded) and decodes it as `ExportTraceServiceRequest`s. `receiver` is
a fixture-shaped context: started, yielded, shut down."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.helpers.net import free_port

__all__ = ["Receiver", "attributes", "receiving"]

_MAX_BODY = 16 << 20


class Receiver:
    """An OTLP/HTTP traces endpoint on loopback that keeps what it is sent (bounded)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.paths: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # the http.server API names it
                length = int(self.headers.get("content-length") or 0)
                if length > _MAX_BODY or len(receiver.bodies) >= 100:
                    self.send_response(413)
                    self.end_headers()
                    return
                receiver.paths.append(self.path)
                receiver.bodies.append(self.rfile.read(length))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def spans(self) -> tuple[list[Span], list[dict[str, Any]]]:
        """Every span received, and each export's resource attributes."""
        spans: list[Span] = []
        resources: list[dict[str, Any]] = []
        for body in self.bodies:
            for resource_spans in ExportTraceServiceRequest.FromString(body).resource_spans:
                resources.append(attributes(resource_spans.resource.attributes))
                for scope in resource_spans.scope_spans:
                    spans.extend(scope.spans)
        return spans, resources


def attributes(pairs: Any) -> dict[str, Any]:
    def value(kv: KeyValue) -> Any:
        kind = kv.value.WhichOneof("value")
        return getattr(kv.value, kind) if kind else None

    return {kv.key: value(kv) for kv in pairs}


@contextmanager
def receiving() -> Iterator[Receiver]:
    """A started `Receiver`, shut down on exit."""
    receiver = Receiver()
    receiver._thread.start()
    try:
        yield receiver
    finally:
        receiver._server.shutdown()
        receiver._server.server_close()
