"""A hosted provider that floods the gateway with an answer far past its read bound, shared
by the tests of `limits.max_response_bytes` on hosted answers (async and sync clients)."""

from __future__ import annotations

import asyncio

from tests.helpers.raw_backend import Answer, Post

LIMIT = 1024 * 1024
OFFERED = 48 * 1024 * 1024  # what the provider would send if the gateway read it all
PIECE = b"x" * 65536
ANSWER_HEAD = (
    b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"'
)
ANSWER_TAIL = b'"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}'
LINE_HEAD = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"'
)


def flood(content_type: bytes, head: bytes, tail: bytes, written: list[int]) -> Answer:
    """An answer of `head`, OFFERED bytes of `x` and `tail`, chunked, as fast as it is
    read; `written` counts the bytes the gateway took."""

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\n" % content_type)
        writer.write(b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(head), head))
        for _ in range(OFFERED // len(PIECE)):
            writer.write(b"%x\r\n%s\r\n" % (len(PIECE), PIECE))
            await writer.drain()
            written[0] += len(PIECE)
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail))
        await writer.drain()
        return False

    return answer


TOO_LARGE = f"larger than the gateway relays ({LIMIT} bytes, limits.max_response_bytes)"
