"""Response bodies in the exact shapes OpenAI-compatible servers send.

Stream chunks are spliced from precomputed byte pieces (`ChunkEncoder`): the per-choice
head (`data: {"id":...,"choices":[{"index":0,"delta":{`) is built once and each token
adds only its JSON literal and a constant tail. Error bodies follow each server's own
envelope: vLLM/SGLang `{"error": {"message", "type", "param", "code"}}`, llama.cpp
`{"error": {"code", "message", "type"}}`.
"""

from __future__ import annotations

import base64
import struct
from types import MappingProxyType
from typing import Any, Final

import orjson

from gateway.sim.settings import Kind
from gateway.sim.wire import Completion, EmbeddingRequest

__all__ = [
    "DONE",
    "LOADING_BODY",
    "ChunkEncoder",
    "completion_body",
    "embedding_body",
    "error_body",
]

DONE: Final = b"data: [DONE]\n\n"
LOADING_BODY: Final = b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'

_VLLM_TYPES: Final = MappingProxyType(
    {
        400: "BadRequestError",
        401: "UnauthorizedError",
        404: "NotFoundError",
        405: "MethodNotAllowedError",
        413: "RequestEntityTooLargeError",
        500: "InternalServerError",
        503: "ServiceUnavailableError",
    }
)
_LLAMACPP_TYPES: Final = MappingProxyType(
    {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "not_found_error",
        405: "invalid_request_error",
        413: "invalid_request_error",
        500: "server_error",
        503: "unavailable_error",
    }
)


def error_body(
    kind: Kind, status: int, message: str, *, param: str | None = None, err_type: str = ""
) -> bytes:
    """The error JSON `kind` answers with for `status`."""
    if kind == "llamacpp":
        return orjson.dumps(
            {
                "error": {
                    "code": status,
                    "message": message,
                    "type": err_type or _LLAMACPP_TYPES[status],
                }
            }
        )
    return orjson.dumps(
        {
            "error": {
                "message": message,
                "type": err_type or _VLLM_TYPES[status],
                "param": param,
                "code": status,
            }
        }
    )


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_body(request: Completion, response_id: str, created: int, texts: list[str]) -> bytes:
    """A non-streaming `chat.completion` or `text_completion` body: one choice for each
    of `texts` (`request.choices` of them), numbered from 0; `completion_tokens` counts them all,
    as vLLM sums its choices'."""
    choices: list[dict[str, Any]]
    if request.endpoint == "chat":
        obj = "chat.completion"
        choices = [
            {
                "index": index,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": request.finish_reason,
            }
            for index, text in enumerate(texts)
        ]
    else:
        obj = "text_completion"
        choices = [
            {
                "index": index,
                "text": text,
                "logprobs": None,
                "finish_reason": request.finish_reason,
            }
            for index, text in enumerate(texts)
        ]
    return orjson.dumps(
        {
            "id": response_id,
            "object": obj,
            "created": created,
            "model": request.model,
            "choices": choices,
            "usage": _usage(request.prompt_tokens, request.max_tokens * len(texts)),
        }
    )


class ChunkEncoder:
    """SSE events of one choice of a streamed completion, from precomputed byte pieces.

    Chat streams: a role chunk (`delta: {"role": "assistant", "content": ""}`), one chunk
    per token, a finish chunk (`delta: {}` with `finish_reason`), then, when asked for,
    a usage chunk with empty `choices`. Legacy completions have no role chunk. A stream
    of several choices (`n` > 1, or a list of prompts) has one encoder per `index`: each
    choice's chunks carry its index and it gets its own finish chunk (`finish`);
    `close()` (usage and `[DONE]`) is sent once, after them all, its usage counting every
    choice.
    """

    __slots__ = ("_head", "_request", "_tail", "_token_head", "finish", "role")

    def __init__(self, request: Completion, response_id: str, created: int, index: int = 0) -> None:
        self._request = request
        obj = b"chat.completion.chunk" if request.endpoint == "chat" else b"text_completion"
        self._head = b'data: {"id":"%s","object":"%s","created":%d,"model":%s,"choices":' % (
            response_id.encode(),
            obj,
            created,
            orjson.dumps(request.model),
        )
        finish = orjson.dumps(request.finish_reason)
        choice = self._head + b'[{"index":%d,' % index
        if request.endpoint == "chat":
            self._token_head = choice + b'"delta":{"content":'
            self._tail = b'},"logprobs":null,"finish_reason":null}]}\n\n'
            self.role = choice + (
                b'"delta":{"role":"assistant","content":""},'
                b'"logprobs":null,"finish_reason":null}]}\n\n'
            )
            self.finish = choice + (
                b'"delta":{},"logprobs":null,"finish_reason":%s}]}\n\n' % finish
            )
        else:
            self._token_head = choice + b'"text":'
            self._tail = b',"logprobs":null,"finish_reason":null}]}\n\n'
            self.role = b""
            self.finish = choice + b'"text":"","logprobs":null,"finish_reason":%s}]}\n\n' % finish

    def token(self, json_token: bytes) -> bytes:
        """The chunk of one token, given as a JSON string literal."""
        return self._token_head + json_token + self._tail

    def tokens(self, json_tokens: list[bytes]) -> bytes:
        """The chunks of several tokens, joined."""
        head, tail = self._token_head, self._tail
        return b"".join([head + t + tail for t in json_tokens])

    def end(self) -> bytes:
        """This choice's finish chunk, then `close()`: the end of a one-choice stream."""
        return self.finish + self.close()

    def close(self) -> bytes:
        """The usage chunk when requested (every choice's tokens), and `[DONE]`."""
        request = self._request
        if not request.include_usage:
            return DONE
        usage = orjson.dumps(_usage(request.prompt_tokens, request.max_tokens * request.choices))
        return self._head + b'[],"usage":' + usage + b"}\n\n" + DONE


def embedding_body(request: EmbeddingRequest, vectors: list[list[float]]) -> bytes:
    """An OpenAI embeddings list; base64 is little-endian float32, as OpenAI sends it."""
    data: list[dict[str, Any]] = []
    for index, vector in enumerate(vectors):
        embedding: list[float] | str = vector
        if request.base64:
            packed = struct.pack(f"<{len(vector)}f", *vector)
            embedding = base64.b64encode(packed).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    return orjson.dumps(
        {
            "object": "list",
            "data": data,
            "model": request.model,
            "usage": {
                "prompt_tokens": request.prompt_tokens,
                "total_tokens": request.prompt_tokens,
            },
        }
    )
