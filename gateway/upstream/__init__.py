"""Talking to backends: a lean HTTP/1.1 pool for OpenAI-compatible servers."""

from gateway.upstream.http import HttpPool, UpstreamError, UpstreamResponse

__all__ = ["HttpPool", "UpstreamError", "UpstreamResponse"]
