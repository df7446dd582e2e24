"""The process environment does not decide where hosted or private traffic goes, or whom it
trusts: proxies (`HTTP_PROXY`, `all_proxy`, ...), `SSL_VERIFY`, `SSL_CERT_FILE` / `SSL_CERT_DIR`.

Each case runs the gateway's own client code in a child process whose real environment
carries the variable (as an operator's shell or a container image would set it), against
servers on loopback: a fake provider, a capturing "proxy" (a server that answers as a
provider would, so a request it got is visible), and a TLS front with a test CA. `NO_PROXY`
and `no_proxy` are empty, so loopback is not exempt from the proxy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.serving import ServerThread
from tests.helpers.anthropic_mock import AnthropicMock
from tests.helpers.gateways import Gateway, admin_status, hosted_backend
from tests.helpers.raw_backend import RawBackend, completion_body, json_answer
from tests.helpers.tls import Pki, TLSFront, server_context

KEY = "sk-egress-key-0123456789"
PROMPT = "PROMPT-egress-5b0c"

# argv: key, prompt, the backends' `proxy` (`-`: none), then pairs of (base_url,
# provider_model); prints one line per call.
_HOSTED_SCRIPT = """
import asyncio, sys
from gateway.config.schema import BackendSettings
from gateway.upstream.hosted import HostedClient, HostedError

async def call(url, model):
    proxy = None if sys.argv[3] == "-" else sys.argv[3]
    backend = BackendSettings.model_validate({"id": "h", "kind": "hosted", "region": "us",
        "owner": "o", "provider": model.split("/")[0], "base_url": url, "api_key_env": "K",
        "models": [{"name": "g", "provider_model": model}],
        "unsafe_unchecked_azure_host": model.startswith("azure/"),
        **({} if proxy is None else {"proxy": proxy})})
    client = HostedClient(backend, environ={"K": sys.argv[1]}, timeout_s=10)
    try:
        answer = await client.send("chat", {"messages": [{"role": "user",
            "content": sys.argv[2]}]}, "g")
        print(model, "answered", answer.body.decode()[:400].replace(chr(10), " "))
    except HostedError as exc:
        print(model, "error", exc.kind)
    finally:
        await client.aclose()

async def main():
    args = sys.argv[4:]
    for url, model in zip(args[::2], args[1::2]):
        await call(url, model)

asyncio.run(main())
"""

# argv: port, then optionally a tls `server_name`; dials 127.0.0.1:port as the private
# path does (gateway/upstream/dial.py) and prints whether the handshake was accepted.
_PRIVATE_SCRIPT = """
import asyncio, sys
from pathlib import Path
from gateway.config.schema import BackendSettings
from gateway.upstream.dial import dial
from gateway.upstream.failures import UpstreamError
from gateway.upstream.tls import backend_tls, system_tls

port = int(sys.argv[1])
if len(sys.argv) > 2:  # a `tls:` block without its own CA
    backend = BackendSettings.model_validate({"id": "p", "kind": "vllm",
        "base_url": "https://127.0.0.1:%d" % port, "models": [{"name": "m"}],
        "region": "eu", "owner": "o", "tls": {"server_name": sys.argv[2]}})
    tls = backend_tls(backend, "127.0.0.1", Path("."))
else:
    tls = system_tls("127.0.0.1")

class Connection(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport

async def main():
    loop = asyncio.get_running_loop()
    try:
        conn = await dial(loop, Connection, "127.0.0.1", port, tls, 10)
    except UpstreamError as exc:
        print("refused", exc.kind)
    else:
        print("accepted")
        conn.transport.close()

asyncio.run(main())
"""


def _child(script: str, *args: str, **env: str) -> str:
    environ = {**os.environ, "NO_PROXY": "", "no_proxy": "", **env}
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture
def provider() -> Iterator[RawBackend]:
    backend = RawBackend(json_answer(completion_body("FROM-PROVIDER"))).start()
    yield backend
    backend.stop()


@pytest.fixture
def proxy() -> Iterator[RawBackend]:
    """A proxy that reads what it is sent and answers for the provider."""
    backend = RawBackend(json_answer(completion_body("FROM-PROXY"))).start()
    yield backend
    backend.stop()


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"])
def test_a_hosted_call_never_goes_through_the_environments_proxy(
    variable: str, provider: RawBackend, proxy: RawBackend
) -> None:
    """LiteLLM's aiohttp transport took the proxy from the environment: for an http
    base_url the proxy read the prompt and the provider key, and answered in the
    provider's place; for https it would learn the host and could refuse or delay."""
    anthropic = AnthropicMock(api_key=KEY)
    with ServerThread(anthropic) as anthropic_server:
        out = _child(
            _HOSTED_SCRIPT,
            KEY,
            PROMPT,
            "-",
            f"{provider.url}/v1",
            "openai/gpt-x",  # the OpenAI SDK's client (over LiteLLM's transport)
            anthropic_server.url,
            "anthropic/claude-x",  # LiteLLM's own HTTP handler
            **{variable: proxy.url},
        )
    lines = out.splitlines()
    assert [line.split(" ", 2)[:2] for line in lines] == [
        ["openai/gpt-x", "answered"],
        ["anthropic/claude-x", "answered"],
    ], out
    assert "FROM-PROVIDER" in lines[0], out
    assert [PROMPT.encode() in post.body for post in provider.posts] == [True]
    assert len(anthropic.received) == 1
    assert proxy.connections == 0, [post.head for post in proxy.posts]


def test_a_hosted_backends_proxy_is_the_one_gateway_yaml_names(
    provider: RawBackend, proxy: RawBackend
) -> None:
    """With `proxy:` on the backend, its calls go through that proxy (on both of
    LiteLLM's paths), and a different one in the environment still gets nothing."""
    decoy = RawBackend(json_answer(completion_body("FROM-DECOY"))).start()
    anthropic = AnthropicMock(api_key=KEY)
    try:
        with ServerThread(anthropic) as anthropic_server:
            out = _child(
                _HOSTED_SCRIPT,
                KEY,
                PROMPT,
                proxy.url,
                f"{provider.url}/v1",
                "openai/gpt-x",
                anthropic_server.url,
                "anthropic/claude-x",
                HTTP_PROXY=decoy.url,
                ALL_PROXY=decoy.url,
            )
    finally:
        decoy.stop()
    lines = out.splitlines()
    assert lines[0].split(" ", 2)[:2] == ["openai/gpt-x", "answered"], out
    assert "FROM-PROXY" in lines[0], out
    heads = [post.head.split(b" ", 2)[:2] for post in proxy.posts]
    assert heads == [
        [b"POST", f"{provider.url}/v1/chat/completions".encode()],
        [b"POST", f"{anthropic_server.url}/v1/messages".encode()],
    ]
    assert all(PROMPT.encode() in post.body for post in proxy.posts)
    assert provider.posts == [] and anthropic.received == []
    assert decoy.connections == 0


# An Azure deployment behind Cloudflare's AI Gateway: LiteLLM gives such a base URL an
# OpenAI SDK client of its own making (httpx's transport, its environment proxies mounted).
_CLOUDFLARE_AZURE = "/gateway.ai.cloudflare.com/v1/acct/gw/azure-openai/resource"


@pytest.mark.parametrize(
    ("base_path", "model"),
    [
        (_CLOUDFLARE_AZURE, "azure/deployment"),  # its own httpx client
        ("/v1", "maritalk/m"),  # LiteLLM's sync handler, run in a worker thread
    ],
    ids=["azure-cloudflare", "sync-handler"],
)
@pytest.mark.parametrize("configured", [False, True], ids=["direct", "proxy"])
def test_a_hosted_call_on_an_httpx_transport_takes_only_its_backends_proxy(
    provider: RawBackend, proxy: RawBackend, base_path: str, model: str, configured: bool
) -> None:
    """Calls LiteLLM sends on httpx's own transport rather than its aiohttp one: the
    Azure client it makes for a Cloudflare AI Gateway URL went through the environment's
    proxy, prompt and key included, with or without the backend's `proxy`; a provider
    LiteLLM serves synchronously (its sync client in a worker thread) went straight to
    the provider although the backend named a `proxy`."""
    decoy = RawBackend(json_answer(completion_body("FROM-DECOY"))).start()
    try:
        out = _child(
            _HOSTED_SCRIPT,
            KEY,
            PROMPT,
            proxy.url if configured else "-",
            f"{provider.url}{base_path}",
            model,
            HTTP_PROXY=decoy.url,
            ALL_PROXY=decoy.url,
            AZURE_API_VERSION="2024-10-21",
        )
    finally:
        decoy.stop()
    assert out.split(" ", 2)[:2] == [model, "answered"], out
    assert decoy.connections == 0, [post.head for post in decoy.posts]
    went = proxy if configured else provider
    assert [PROMPT.encode() in post.body for post in went.posts] == [True]
    assert (provider if configured else proxy).connections == 0
    if configured:  # the absolute URL a proxy is sent
        assert proxy.posts[0].head.split(b" ", 2)[1].startswith(provider.url.encode())


def test_ssl_verify_in_the_environment_does_not_turn_off_a_hosted_calls_checks(
    tmp_path: Path, provider: RawBackend
) -> None:
    """`SSL_VERIFY=False` (LiteLLM reads it on every call) made LiteLLM accept any
    certificate: whoever answered at the provider's address got the prompt and the key."""
    pki = Pki.create(tmp_path / "untrusted")  # a CA nothing trusts
    front = TLSFront(("127.0.0.1", provider.port), server_context(pki, pki.server())).start()
    try:
        out = _child(
            _HOSTED_SCRIPT,
            KEY,
            PROMPT,
            "-",
            f"{front.url}/v1",
            "openai/gpt-x",
            SSL_VERIFY="False",
        )
    finally:
        front.stop()
    assert out.split(" ", 2)[:2] == ["openai/gpt-x", "error"], out
    assert provider.posts == []


def _hashed_directory(pki: Pki, directory: Path) -> Path:
    """`directory` holding the CA under its OpenSSL subject-hash name (`SSL_CERT_DIR`'s
    layout), made with `openssl rehash`."""
    directory.mkdir()
    shutil.copy(pki.directory / "ca.pem", directory / "ca.pem")
    subprocess.run(["openssl", "rehash", str(directory)], check=True, timeout=30)
    return directory


@pytest.mark.parametrize("variable", ["SSL_CERT_FILE", "SSL_CERT_DIR"])
@pytest.mark.parametrize("tls_block", [False, True], ids=["no-tls-block", "tls-server-name"])
def test_a_ca_named_in_the_environment_does_not_vouch_for_a_private_backend(
    tmp_path: Path, provider: RawBackend, variable: str, tls_block: bool
) -> None:
    """OpenSSL takes the default roots from `SSL_CERT_FILE` / `SSL_CERT_DIR`: a CA named
    only there was trusted for every private https backend without `tls.ca_file` (and
    for the witnesses), so its holder could impersonate them."""
    if variable == "SSL_CERT_DIR" and shutil.which("openssl") is None:
        pytest.skip("openssl is needed to lay out a hashed certificate directory")
    pki = Pki.create(tmp_path / "env-ca")
    named = (
        str(pki.directory / "ca.pem")
        if variable == "SSL_CERT_FILE"
        else str(_hashed_directory(pki, tmp_path / "hashed"))
    )
    front = TLSFront(("127.0.0.1", provider.port), server_context(pki, pki.server())).start()
    try:
        args = [str(front.port)] + (["127.0.0.1"] if tls_block else [])
        unset = _child(_PRIVATE_SCRIPT, *args)
        out = _child(_PRIVATE_SCRIPT, *args, **{variable: named})
    finally:
        front.stop()
    assert unset == "refused tls\n"  # the control: this CA is not one of the system's
    assert out == "refused tls\n"


def test_logging_integrations_named_in_the_environment_get_nothing(
    provider: RawBackend, proxy: RawBackend
) -> None:
    """A guard: LiteLLM's integrations (Langfuse, Helicone, LangSmith, its generic
    logger, Sentry) read where to post a call from these variables, but only a callback
    that names them runs one; the gateway empties every callback list when LiteLLM loads
    (gateway/upstream/litellm_runtime.py), so the "collector" here never hears of a call."""
    collector = proxy.url
    out = _child(
        _HOSTED_SCRIPT,
        KEY,
        PROMPT,
        "-",
        f"{provider.url}/v1",
        "openai/gpt-x",
        LANGFUSE_HOST=collector,
        LANGFUSE_PUBLIC_KEY="pk-lf-egress",
        LANGFUSE_SECRET_KEY="sk-lf-egress",
        HELICONE_API_KEY="sk-helicone-egress",
        HELICONE_API_BASE=collector,
        LANGSMITH_API_KEY="ls-egress",
        LANGSMITH_BASE_URL=collector,
        GENERIC_LOGGER_ENDPOINT=collector,
        SENTRY_DSN=f"http://key@127.0.0.1:{proxy.port}/1",
    )
    assert out.split(" ", 2)[:2] == ["openai/gpt-x", "answered"], out
    assert [PROMPT.encode() in post.body for post in provider.posts] == [True]
    assert proxy.connections == 0, [post.head for post in proxy.posts]


def test_the_status_names_each_hosted_backends_proxy(
    start_gateway: Callable[..., Gateway],
) -> None:
    proxied = hosted_backend("proxied", "http://127.0.0.1:9/v1", "gpt-a")
    proxied["proxy"] = "http://127.0.0.1:3128/"
    direct = hosted_backend("direct", "http://127.0.0.1:9/v1", "gpt-b")
    gateway = start_gateway([proxied, direct], environ={"HOSTED_KEY": KEY})
    shown = {b["id"]: b["proxy"] for b in admin_status(gateway.url)["backends"]}
    assert shown == {"proxied": "http://127.0.0.1:3128", "direct": None}


def test_litellms_prompt_caching_switch_in_the_environment_caches_no_prompt() -> None:
    """`LITELLM_ENABLE_ANTHROPIC_PROMPT_CACHING=true` (read when LiteLLM is imported) had
    it mark every Claude request's system prompt and last turn `cache_control`, with
    `LITELLM_ANTHROPIC_PROMPT_CACHING_TTL=1h` for an hour: the provider kept the prompt
    past the retention the policy admitted the backend for, which a client asking the same
    is refused (gateway/upstream/hosted_fields.py)."""
    anthropic = AnthropicMock(api_key=KEY)
    with ServerThread(anthropic) as anthropic_server:
        out = _child(
            _HOSTED_SCRIPT,
            KEY,
            PROMPT,
            "-",
            anthropic_server.url,
            "anthropic/claude-sonnet-4-5",
            LITELLM_ENABLE_ANTHROPIC_PROMPT_CACHING="true",
            LITELLM_ANTHROPIC_PROMPT_CACHING_TTL="1h",
        )
    assert out.split(" ", 2)[:2] == ["anthropic/claude-sonnet-4-5", "answered"], out
    (received,) = anthropic.received
    assert PROMPT in json.dumps(received.body)
    assert "cache_control" not in json.dumps(received.body), received.body


# argv: the backend's `provider_model` (no `base_url`: the provider's own URL, its Region
# pinned); prints the URL LiteLLM's call went to, read at httpx (nothing leaves the process).
_NO_BASE_URL_SCRIPT = """
import asyncio, sys
import httpx
from gateway.config.schema import BackendSettings
from gateway.upstream.hosted import HostedClient, HostedError

class Stop(Exception):
    pass

async def capture(self, request, **kwargs):
    print("sent", request.url)
    raise Stop

async def main():
    backend = BackendSettings.model_validate({"id": "h", "kind": "hosted",
        "region": "eu-central-1", "owner": "aws", "provider": "aws",
        "models": [{"name": "g", "provider_model": sys.argv[1]}]})
    client = HostedClient(backend, environ={}, timeout_s=10)
    doc = {"messages": [{"role": "user", "content": "hi"}]}
    prepared = await client.prepare("chat", doc, "g")  # loads LiteLLM
    httpx.AsyncClient.send = capture
    try:
        await client.send_prepared(prepared)
    except HostedError as exc:
        print("error", exc.kind)

asyncio.run(main())
"""


def test_litellms_proxy_switch_in_the_environment_moves_no_hosted_call() -> None:
    """`USE_LITELLM_PROXY=true` (LiteLLM reads it on every call) made every hosted call a
    call to a LiteLLM proxy at `LITELLM_PROXY_API_BASE`, whatever its provider: a Bedrock
    backend declared, and pinned to, `eu-central-1` sent its prompt there instead. The
    variable names no provider's URL, so the check of those
    (gateway/upstream/provider_environment.py) let it pass; LiteLLM is now loaded without it
    (gateway/upstream/litellm_runtime.py)."""
    out = _child(
        _NO_BASE_URL_SCRIPT,
        "bedrock/anthropic.claude-3-haiku-20240307-v1:0",
        AWS_ACCESS_KEY_ID="AKIDEXAMPLE",
        AWS_SECRET_ACCESS_KEY="s" * 40,
        AWS_CONFIG_FILE="/nonexistent/owngate-test-aws-config",
        USE_LITELLM_PROXY="true",
        LITELLM_PROXY_API_BASE="http://127.0.0.1:9/v1",
        LITELLM_PROXY_API_KEY="sk-proxy",
    )
    sent = [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("sent ")]
    assert sent, out
    bedrock = "https://bedrock-runtime.eu-central-1.amazonaws.com/"
    assert all(url.startswith(bedrock) for url in sent), out
