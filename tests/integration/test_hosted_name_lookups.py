"""The names a hosted call looks up outside LiteLLM's provider connection are held to the
gateway's bounds, and a media URL's host is not looked up again after the gateway's check
(gateway/upstream/hosted_names.py).

botocore fetches a Bedrock call's AWS credentials itself (here the container endpoint,
`AWS_CONTAINER_CREDENTIALS_FULL_URI`), through urllib3, whose `create_connection` looks
the name up with a blocking `getaddrinfo` that no socket timeout reaches: a resolver that
hangs held each of botocore's three attempts for as long as it liked, and the call (with
its signing thread) until the first-byte timeout, however short `limits.connect_timeout_s`
was. Now each lookup is given up at the connect bound, on a thread of its own, and the
call fails at once, while the lookup still hangs. (A resolver that hangs is the lookup
function patched; the provider is on loopback and never reached.)

LiteLLM checks a media URL it downloads for a hosted provider (Bedrock, Gemini:
`url_utils.validate_url`) by looking its host up again, on the event loop's default
executor, after the gateway's own check had looked it up (gateway/upstream/media_urls.py):
a client whose DNS server answered the gateway and then hung held a default-executor
thread per URL for the resolver's timeouts, after its request had ended, and the
gateway's every `asyncio.to_thread` queued behind a few such requests. Now the call's
download goes to the addresses the check found, looked up no more; a redirect's new host
is looked up within the connect bound.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.config.schema import BackendSettings
from gateway.upstream import sockets
from gateway.upstream.hosted import HostedClient, HostedError
from gateway.upstream.hosted_transport import watching
from gateway.upstream.litellm_runtime import load_litellm
from gateway.upstream.media_urls import check_media_urls
from tests.helpers.gateways import LITELLM_WARNINGS
from tests.helpers.raw_backend import RawBackend, json_answer

pytestmark = LITELLM_WARNINGS

CONNECT_S = 0.3  # `limits.connect_timeout_s`
FIRST_BYTE_S = 120.0  # the call's own timeout: far past the test's wait
WAIT_S = 60.0  # bounds a hang only: a call waiting on the lookup fails the test here
_CONVERSE = (
    b'{"output": {"message": {"role": "assistant", "content": [{"text": "FROM-PROVIDER"}]}},'
    b' "stopReason": "end_turn", "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}}'
)


IMAGE_HOST = "images.owngate-test.invalid"  # a client's: its DNS server hangs after the check
REDIRECTED = "redirected.owngate-test.invalid"
PUBLIC = "93.184.216.34"  # what the gateway's check found for IMAGE_HOST (never connected)


class _HungResolver:
    """`getaddrinfo` for `hosts` that hangs until `release` (then fails, as a resolver's
    timeout does), counting the lookups; every other name resolved as usual."""

    def __init__(self, *hosts: str) -> None:
        self._hosts = hosts
        self._real = socket.getaddrinfo
        self.asked = 0
        self.release = threading.Event()

    def __call__(self, host: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in self._hosts:
            return self._real(host, *args, **kwargs)
        self.asked += 1
        self.release.wait(WAIT_S * 2)  # bounded: a failed test's lookups end too
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")


@pytest.fixture
def hung(monkeypatch: pytest.MonkeyPatch) -> Iterator[_HungResolver]:
    resolver = _HungResolver("credentials.owngate-test.invalid", IMAGE_HOST, REDIRECTED)
    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    monkeypatch.setattr(sockets, "_HOSTED_CONNECT_S", [CONNECT_S])  # as `install` sets it
    yield resolver
    resolver.release.set()


def test_an_aws_credential_fetch_whose_lookup_hangs_fails_at_the_connect_bound(
    hung: _HungResolver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # botocore takes a container endpoint named by host only on loopback or a few hosts;
    # its check of the name is patched away: the lookup is what is held to the bound.
    botocore_utils = pytest.importorskip("botocore.utils")
    monkeypatch.setattr(
        botocore_utils.ContainerMetadataFetcher, "_validate_allowed_url", lambda self, url: None
    )
    url = "http://credentials.owngate-test.invalid:8080/credentials"
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", url)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    provider = RawBackend(json_answer(_CONVERSE)).start()
    outcome: list[str] = []

    async def call() -> None:
        backend = BackendSettings.model_validate(
            {
                "id": "h",
                "kind": "hosted",
                "region": "eu-west-1",
                "owner": "o",
                "provider": "aws",
                "base_url": provider.url,
                "models": [
                    {"name": "g", "provider_model": "bedrock/converse/anthropic.claude-3-haiku"}
                ],
            }
        )
        client = HostedClient(backend, environ={}, timeout_s=FIRST_BYTE_S)
        try:
            await client.send("chat", {"messages": [{"role": "user", "content": "hi"}]}, "g")
            outcome.append("answered")
        except HostedError as exc:
            outcome.append(f"error {exc.kind}")
        finally:
            await client.aclose()

    calling = threading.Thread(target=asyncio.run, args=(call(),), daemon=True)
    try:
        calling.start()
        calling.join(WAIT_S)
        assert hung.asked >= 1  # botocore asked for the endpoint's name
        assert not calling.is_alive(), "the call waited on its credential lookup past the bound"
        assert not hung.release.is_set()  # the lookups themselves still hang: given up
        assert len(outcome) == 1 and outcome[0].startswith("error"), outcome
        assert provider.posts == []  # unsigned: never sent
    finally:
        hung.release.set()
        calling.join(WAIT_S)
        provider.stop()


def _in_a_watched_call(work: Any, addresses: dict[str, list[str]]) -> list[Any]:
    """What `work()` returned or raised in a watched hosted call whose media check found
    `addresses`, run on a thread (as LiteLLM's `asyncio.to_thread` does), waited for at
    most `WAIT_S`."""
    done: list[Any] = []

    def run() -> None:
        with watching(1 << 20) as outbound:
            if addresses:
                outbound.addresses = addresses
            try:
                done.append(work())
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                done.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive(), "LiteLLM's URL check waited on a lookup past the bound"
    return done


def test_a_media_host_the_check_looked_up_is_not_looked_up_again(hung: _HungResolver) -> None:
    load_litellm()  # as before a hosted call: the rules installed
    url_utils = importlib.import_module("litellm.litellm_core_utils.url_utils")
    messages = [{"role": "user", "content": [{"type": "text", "text": "see"}, *[
        {"type": "image_url", "image_url": {"url": f"{scheme}://{IMAGE_HOST}/a.png"}}
        for scheme in ("http", "https")
    ]]}]  # fmt: skip

    async def public(host: str, port: int) -> list[str]:
        return [PUBLIC]

    # a host no check looked up (a redirect's): its lookup given up at the connect bound
    done = _in_a_watched_call(lambda: url_utils.validate_url(f"https://{REDIRECTED}/"), {})
    assert len(done) == 1 and isinstance(done[0], url_utils.SSRFError), done
    assert hung.asked == 1 and not hung.release.is_set()  # still hanging: given up
    # the hosts the check looked up: not again, the download sent where the check looked
    checked = asyncio.run(check_media_urls({"messages": messages}, "anthropic", public))
    assert checked == {IMAGE_HOST: [PUBLIC]}
    done = _in_a_watched_call(lambda: url_utils.validate_url(f"http://{IMAGE_HOST}/a.png"), checked)
    assert done == [(f"http://{PUBLIC}/a.png", IMAGE_HOST)]
    assert hung.asked == 1
    # and the connection of an https download (aiohttp's resolver, LiteLLM's transport)
    resolver = importlib.import_module("gateway.upstream.hosted_names").HostedResolver()

    async def resolve() -> list[Any]:
        with watching(1 << 20) as outbound:
            outbound.addresses = checked
            return list(await resolver.resolve(IMAGE_HOST, 443, socket.AF_UNSPEC))

    found = asyncio.run(resolve())
    assert [(r["host"], r["hostname"], r["port"]) for r in found] == [(PUBLIC, IMAGE_HOST, 443)]
    assert hung.asked == 1
