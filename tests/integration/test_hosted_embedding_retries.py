"""A hosted embeddings call is sent once: retries and fallbacks are the gateway's.

LiteLLM 1.108.7's OpenAI embedding handler reads the call's `max_retries` as
`max_retries or litellm.DEFAULT_MAX_RETRIES`, so the gateway's `max_retries=0` became 2:
the OpenAI SDK sent an embedding request three times to a provider that answered 500
(the input sent, and billed, three times), and to one whose address accepted and never
finished the TLS handshake it opened three connections, each waiting the connect
timeout, with its back-off between them, before the gateway could fail over
(gateway/upstream/litellm_runtime.py sets `DEFAULT_MAX_RETRIES` to 0).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx

from tests.helpers.gateways import HOSTED_ONLY_POLICY, LITELLM_WARNINGS, Gateway, hosted_backend
from tests.helpers.raw_backend import ERROR_BODY, RawBackend, json_answer

pytestmark = LITELLM_WARNINGS


def test_an_embedding_the_provider_fails_is_sent_once(
    start_raw: Callable[..., RawBackend], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    raw = start_raw(json_answer(ERROR_BODY, b"500 Internal Server Error"))
    (tmp_path / "policy.yaml").write_text(HOSTED_ONLY_POLICY)
    gateway = start_gateway(
        [hosted_backend("hosted", f"{raw.url}/v1", "m")],
        policy={"paths": [str(tmp_path)]},
        environ={"HOSTED_KEY": "test-key"},
    )
    response = httpx.post(
        f"{gateway.url}/v1/embeddings",
        json={"model": "m", "input": "once-only"},
        headers=gateway.headers,
        timeout=60,
    )
    assert response.status_code in (502, 503), response.text
    assert response.json()["error"]["type"], response.text
    # The SDK's retries came before the gateway's answer: all of them are in by now.
    assert [b"once-only" in post.body for post in raw.posts] == [True]
