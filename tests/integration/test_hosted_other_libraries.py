"""A hosted call's requests outside LiteLLM's HTTP handlers follow the same rules: the
process environment neither moves them nor vouches for their peer, and what is read of
their answers is bounded (gateway/upstream/hosted_libraries.py).

- SageMaker embeddings: LiteLLM sends the prompt through boto3, which took `HTTPS_PROXY`
  (and `AWS_CA_BUNDLE`) from the environment and read the answer whole: refused unsent.
- Databricks' OAuth token (`DATABRICKS_CLIENT_ID` / `_SECRET` set): fetched with
  `requests`, which took the environment's proxy and `REQUESTS_CA_BUNDLE`, and read the
  token answer whole, however large.
- AWS credentials botocore fetches itself (the container endpoint here; STS, instance
  metadata): read whole, however large; through the environment's proxy (instance
  metadata, STS), past the backend's `proxy`, trusting `AWS_CA_BUNDLE` (STS).
- GigaChat's handlers ask LiteLLM's client factory for `ssl_verify: False`: a message's
  images were uploaded to the `base_url` over TLS that accepted any certificate.
- The Azure client LiteLLM makes for a Cloudflare AI Gateway `base_url` (httpx's own
  TLS context) trusted a CA in `SSL_CERT_DIR`.

Each case runs the gateway's client code in a child process whose real environment
carries the variables, against servers on loopback, as
tests/integration/test_environment_egress.py does.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from tests.helpers.http_thread import serving
from tests.helpers.raw_backend import Post, RawBackend, completion_body, json_answer
from tests.helpers.tls import Pki, TLSFront, server_context

KEY = "sk-libraries-key-0123456789"
PROMPT = "PROMPT-libraries-7d21"
LIMIT = 1 << 20  # the call's max_answer_bytes

# argv: endpoint, provider, base_url (`-`: none), provider_model; prints one line:
# `answered <body>` or `error <kind> <status> <param>`.
_SCRIPT = """
import asyncio, base64, sys
from gateway.config.schema import BackendSettings
from gateway.upstream.hosted import HostedClient, HostedError

endpoint, provider, url, model = sys.argv[1:5]
content = sys.argv[5]
if endpoint == "chat+image":  # the prompt as a data URL image too
    image = "data:image/png;base64," + base64.b64encode(content.encode()).decode()
    endpoint, content = "chat", [{"type": "text", "text": content},
        {"type": "image_url", "image_url": {"url": image}}]
doc = ({"input": content} if endpoint == "embeddings"
       else {"messages": [{"role": "user", "content": content}]})

async def main():
    backend = BackendSettings.model_validate({"id": "h", "kind": "hosted",
        "region": "eu-west-1" if provider == "aws" else "us", "owner": "o",
        "provider": provider, "api_key_env": None if provider == "aws" else "K",
        **({} if url == "-" else {"base_url": url}),
        **({"proxy": sys.argv[8]} if len(sys.argv) > 8 else {}),
        "unsafe_unchecked_azure_host": provider == "azure",
        "models": [{"name": "g", "provider_model": model}]})
    client = HostedClient(backend, environ={"K": sys.argv[6]}, timeout_s=10,
        max_answer_bytes=int(sys.argv[7]))
    try:
        answer = await client.send(endpoint, doc, "g")
        print("answered", answer.body.decode()[:200].replace(chr(10), " "))
    except HostedError as exc:
        print("error", exc.kind, exc.status, exc.param)
    finally:
        await client.aclose()

asyncio.run(main())
"""


# What a machine's environment may name as trusted (this one's CI sets several): only what
# a test gives is set in the child.
_TRUST = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "AWS_CA_BUNDLE")


def _call(
    endpoint: str, provider: str, url: str, model: str, *, via: str | None = None, **env: str
) -> str:
    """The child's one line for a call of `endpoint` to `model`, with `env` set; `via`,
    the backend's `proxy`."""
    inherited = {k: v for k, v in os.environ.items() if k not in _TRUST}
    environ = {**inherited, "NO_PROXY": "", "no_proxy": "", **env}
    args = [endpoint, provider, url, model, PROMPT, KEY, str(LIMIT), *([via] if via else [])]
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


@pytest.fixture
def proxy() -> Iterator[RawBackend]:
    """A proxy that reads what it is sent (a CONNECT's head too) and answers itself."""
    backend = RawBackend(json_answer(completion_body("FROM-PROXY"))).start()
    yield backend
    backend.stop()


def test_sagemaker_embeddings_are_refused_unsent(proxy: RawBackend) -> None:
    """LiteLLM sends SageMaker embeddings through boto3 (`invoke_endpoint`): botocore took
    the environment's `HTTPS_PROXY` (the proxy was asked to CONNECT to
    runtime.sagemaker.eu-west-1.amazonaws.com, three times: botocore retried) and
    `AWS_CA_BUNDLE`, and read the answer whole. Refused before anything is sent, naming
    the field (`model`): those are forced now (`install_botocore_rules`), but botocore
    still sends the prompt again on retries of its own, outside the gateway's attempts."""
    out = _call(
        "embeddings",
        "aws",
        "-",
        "sagemaker/my-endpoint",
        HTTPS_PROXY=proxy.url,
        AWS_ACCESS_KEY_ID="AKIAEXAMPLEEXAMPLE00",
        AWS_SECRET_ACCESS_KEY="not-a-real-secret",
        AWS_MAX_ATTEMPTS="1",
    )
    assert proxy.connections == 0, [post.head for post in proxy.posts]
    assert out == "error status 400 model", out


def _databricks(token_pad: int) -> RawBackend:
    """A Databricks workspace: its OAuth token endpoint (the token answer padded with
    `token_pad` bytes) and a serving endpoint that answers a chat completion."""
    token = b'{"access_token": "tok-1", "token_type": "Bearer", "expires_in": 3600'

    async def answer(writer: object, post: Post) -> bool:
        if b" /oidc/v1/token " in post.head.split(b"\r\n", 1)[0]:
            body = token + b', "pad": "' + b"x" * token_pad + b'"}'
        else:
            body = completion_body("FROM-PROVIDER")
        return await json_answer(body)(writer, post)  # type: ignore[arg-type]

    return RawBackend(answer).start()


def _lines(backend: RawBackend) -> list[bytes]:
    return [post.head.split(b"\r\n", 1)[0] for post in backend.posts]


_OAUTH = {"DATABRICKS_CLIENT_ID": "client-1", "DATABRICKS_CLIENT_SECRET": "secret-1"}


def test_a_databricks_token_fetch_takes_no_proxy_from_the_environment(proxy: RawBackend) -> None:
    """LiteLLM fetches Databricks' OAuth token with `requests`, which took `HTTP_PROXY`:
    the proxy got the client secret (basic auth) and answered the token request."""
    workspace = _databricks(0)
    try:
        out = _call(
            "chat",
            "databricks",
            f"{workspace.url}/serving-endpoints",
            "databricks/m",
            HTTP_PROXY=proxy.url,
            **_OAUTH,
        )
    finally:
        workspace.stop()
    assert proxy.connections == 0, [post.head for post in proxy.posts]
    assert out.startswith("answered") and "FROM-PROVIDER" in out, out
    assert _lines(workspace) == [
        b"POST /oidc/v1/token HTTP/1.1",
        b"POST /serving-endpoints/chat/completions HTTP/1.1",
    ]
    assert PROMPT.encode() in workspace.posts[1].body


def test_a_databricks_token_answer_is_read_no_further_than_the_bound() -> None:
    """The token answer was read whole into memory (`requests`' `.json()`), however large:
    one of 8 MiB was taken, and the chat sent. Now it is cut past max_answer_bytes, the
    call fails as a too-large answer, and the prompt is not sent."""
    workspace = _databricks(8 * LIMIT)
    try:
        out = _call(
            "chat", "databricks", f"{workspace.url}/serving-endpoints", "databricks/m", **_OAUTH
        )
    finally:
        workspace.stop()
    assert out.split(" ")[:2] == ["error", "too_large"], out
    assert _lines(workspace) == [b"POST /oidc/v1/token HTTP/1.1"]


def test_a_ca_named_in_requests_variables_does_not_vouch_for_a_token_endpoint(
    tmp_path: Path,
) -> None:
    """`REQUESTS_CA_BUNDLE` made `requests` trust its CA for the token endpoint: its
    holder got the client secret. Now the token fetch verifies against certifi's bundle
    (or `SSL_CERT_FILE`), as the rest of the call does: nothing reaches the front."""
    pki = Pki.create(tmp_path / "env-ca")
    workspace = _databricks(0)
    front = TLSFront(("127.0.0.1", workspace.port), server_context(pki, pki.server())).start()
    try:
        out = _call(
            "chat",
            "databricks",
            f"{front.url}/serving-endpoints",
            "databricks/m",
            REQUESTS_CA_BUNDLE=str(pki.directory / "ca.pem"),
            **_OAUTH,
        )
    finally:
        front.stop()
        workspace.stop()
    assert out.startswith("error"), out
    assert workspace.posts == []


@pytest.fixture
def redirecting_workspace() -> Iterator[tuple[str, list[int]]]:
    """A Databricks workspace whose token endpoint answers `302 Found` with a body of 64
    MiB, and the bytes it got written of each such answer before the reader hung up."""
    written: list[int] = []
    body_size, piece = 64 * LIMIT, b"x" * 65536

    class Workspace(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self.send_response(302)
            self.send_header("location", "/oidc/v1/elsewhere")
            self.send_header("content-type", "text/plain")
            self.send_header("content-length", str(body_size))
            self.end_headers()
            sent = 0
            with contextlib.suppress(OSError):  # the gateway stopped reading: as wanted
                while sent < body_size:
                    self.wfile.write(piece)
                    sent += len(piece)
            written.append(sent)
            self.close_connection = True

        def log_message(self, *_args: object) -> None:
            pass

    with serving(Workspace) as url:
        yield url, written


def test_a_redirect_from_the_token_endpoint_is_read_no_further_than_the_bound(
    redirecting_workspace: tuple[str, list[int]],
) -> None:
    """`requests` not following a redirect still read the redirect's body whole (its
    `Session.send` asks `resolve_redirects` for the next request, which consumes the
    answer, decoded, before the bound's read): a token endpoint answering 302 with 64 MiB
    had all of it read into memory (a gzip-coded one, inflated). Now the answer is read to
    max_answer_bytes and the call fails as a too-large answer, the prompt unsent."""
    url, written = redirecting_workspace
    out = _call("chat", "databricks", f"{url}/serving-endpoints", "databricks/m", **_OAUTH)
    assert len(written) == 1 and written[0] < 32 * LIMIT, written
    assert out.split(" ")[:2] == ["error", "too_large"], out


def test_sslkeylogfile_gets_no_hosted_calls_tls_secrets(tmp_path: Path) -> None:
    """`SSLKEYLOGFILE` in the environment had every hosted call's TLS secrets written to
    the file it names: Python's `ssl.create_default_context` (LiteLLM's contexts, the
    hosted roots') and urllib3's (`requests`: the Databricks token fetch) read it, so
    whoever read the file and the traffic read the prompt, the key and the token. The
    gateway's own contexts never wrote one; a hosted call's write none either now."""
    pki = Pki.create(tmp_path / "ca")
    workspace = _databricks(0)
    front = TLSFront(("127.0.0.1", workspace.port), server_context(pki, pki.server())).start()
    keylog = tmp_path / "keys.log"
    try:
        out = _call(
            "chat",
            "databricks",
            f"{front.url}/serving-endpoints",
            "databricks/m",
            SSL_CERT_FILE=str(pki.directory / "ca.pem"),
            SSLKEYLOGFILE=str(keylog),
            **_OAUTH,
        )
    finally:
        front.stop()
        workspace.stop()
    assert out.startswith("answered") and "FROM-PROVIDER" in out, out  # both went over TLS
    assert len(workspace.posts) == 2
    assert not keylog.exists() or keylog.read_bytes() == b"", keylog.read_bytes()[:200]


@pytest.fixture
def credentials_endpoint() -> Iterator[tuple[str, list[str]]]:
    """A container credentials endpoint (`AWS_CONTAINER_CREDENTIALS_FULL_URI`) whose
    answer is padded with 8 MiB, and the paths it was asked for."""
    asked: list[str] = []
    body = {"AccessKeyId": "AKIAEXAMPLEEXAMPLE00", "SecretAccessKey": "s", "Token": "t"}
    answer = json.dumps({**body, "Expiration": "2099-01-01T00:00:00Z", "pad": "x" * 8 * LIMIT})

    class Credentials(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            with contextlib.suppress(OSError):  # the gateway stopped reading: as wanted
                self.wfile.write(answer.encode())

        def log_message(self, *_args: object) -> None:
            pass

    with serving(Credentials) as url:
        yield f"{url}/credentials", asked


# A Bedrock Converse answer.
_CONVERSE = (
    b'{"output": {"message": {"role": "assistant", "content": [{"text": "FROM-PROVIDER"}]}},'
    b' "stopReason": "end_turn", "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}}'
)


def test_an_aws_credential_answer_is_read_no_further_than_the_bound(
    credentials_endpoint: tuple[str, list[str]],
) -> None:
    """Without a key, LiteLLM has botocore resolve the AWS credentials of a Bedrock call
    (container endpoint, STS, instance metadata), and botocore read each answer whole
    however large: the 8 MiB one was taken and the prompt sent. Now it is cut past
    max_answer_bytes and the call fails as a too-large answer, unsent."""
    url, asked = credentials_endpoint
    provider = RawBackend(json_answer(_CONVERSE)).start()
    try:
        out = _call(
            "chat",
            "aws",
            provider.url,
            "bedrock/converse/anthropic.claude-3-haiku-20240307-v1:0",
            AWS_CONTAINER_CREDENTIALS_FULL_URI=url,
            AWS_SHARED_CREDENTIALS_FILE=os.devnull,
            AWS_CONFIG_FILE=os.devnull,
        )
    finally:
        provider.stop()
    assert asked == ["/credentials"]
    assert out.split(" ")[:2] == ["error", "too_large"], out
    assert provider.posts == []


# A Bedrock model whose calls LiteLLM signs with credentials botocore resolves.
_BEDROCK = "bedrock/converse/anthropic.claude-3-haiku-20240307-v1:0"
# No credentials of this machine's: only the files and endpoints a test names.
_NO_AWS_FILES = {"AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_CONFIG_FILE": os.devnull}


@pytest.fixture
def instance_metadata() -> Iterator[tuple[str, list[str]]]:
    """An EC2 instance metadata service (IMDSv2) that hands out a role's credentials,
    and the paths it was asked for."""
    asked: list[str] = []
    role = "/latest/meta-data/iam/security-credentials/"
    credentials = {"Code": "Success", "AccessKeyId": "AKIAEXAMPLEEXAMPLE00"}
    credentials |= {"SecretAccessKey": "s", "Token": "t", "Expiration": "2099-01-01T00:00:00Z"}

    class Metadata(BaseHTTPRequestHandler):
        def _answer(self, body: str) -> None:
            asked.append(self.path)
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def do_PUT(self) -> None:
            self._answer("imds-token")

        def do_GET(self) -> None:
            self._answer("r" if self.path == role else json.dumps(credentials))

        def log_message(self, *_args: object) -> None:
            pass

    with serving(Metadata) as url:
        yield url, asked


def test_aws_credential_fetches_take_no_proxy_from_the_environment(
    proxy: RawBackend, instance_metadata: tuple[str, list[str]]
) -> None:
    """botocore fetched a Bedrock call's credentials through the environment's
    `HTTP_PROXY` (instance metadata, STS: `get_environ_proxies`): the proxy got the
    request for the role's credentials and answered it. A hosted call's requests go
    straight to their URL or through the backend's `proxy`: the credentials come from
    the metadata service itself, and the prompt goes to the provider."""
    url, asked = instance_metadata
    provider = RawBackend(json_answer(_CONVERSE)).start()
    try:
        out = _call(
            "chat",
            "aws",
            provider.url,
            _BEDROCK,
            HTTP_PROXY=proxy.url,
            AWS_EC2_METADATA_SERVICE_ENDPOINT=url,
            **_NO_AWS_FILES,
        )
    finally:
        provider.stop()
    assert proxy.connections == 0, [post.head for post in proxy.posts]
    assert "/latest/meta-data/iam/security-credentials/r" in asked, asked
    assert out.startswith("answered"), out
    assert len(provider.posts) == 1 and PROMPT.encode() in provider.posts[0].body


def _assume_role_config(directory: Path) -> Path:
    """An AWS config file whose default profile assumes a role with a static key's (STS
    in the backend's Region)."""
    path = directory / "aws-config"
    path.write_text(
        "[default]\nregion = eu-west-1\nrole_arn = arn:aws:iam::123456789012:role/r\n"
        "source_profile = base\n"
        "[profile base]\naws_access_key_id = AKIAEXAMPLEEXAMPLE00\n"
        "aws_secret_access_key = not-a-real-secret\n"
    )
    return path


def test_a_ca_named_in_aws_variables_does_not_vouch_for_sts(tmp_path: Path) -> None:
    """`AWS_CA_BUNDLE` made botocore trust its CA for STS: whoever held that CA answered
    the role's credentials (which then signed the prompt's request). A hosted call's
    requests verify against certifi's bundle or `SSL_CERT_FILE`: nothing reaches it."""
    pki = Pki.create(tmp_path / "env-ca")
    sts = RawBackend(json_answer(b"{}")).start()
    front = TLSFront(("127.0.0.1", sts.port), server_context(pki, pki.server())).start()
    provider = RawBackend(json_answer(_CONVERSE)).start()
    try:
        out = _call(
            "chat",
            "aws",
            provider.url,
            _BEDROCK,
            AWS_CA_BUNDLE=str(pki.directory / "ca.pem"),
            AWS_ENDPOINT_URL_STS=front.url,
            AWS_CONFIG_FILE=str(_assume_role_config(tmp_path)),
            AWS_SHARED_CREDENTIALS_FILE=os.devnull,
            AWS_MAX_ATTEMPTS="1",
        )
    finally:
        front.stop()
        sts.stop()
        provider.stop()
    assert sts.posts == [], [post.head for post in sts.posts]
    assert out.split(" ")[:1] == ["error"], out
    assert provider.posts == []


def test_an_aws_credential_fetch_goes_through_the_backends_proxy(
    proxy: RawBackend, tmp_path: Path
) -> None:
    """botocore went past the backend's `proxy` (it reads only the environment's): an
    STS request of a Bedrock backend with a `proxy` went straight to the network. It goes
    through that proxy, as every https request of the call does."""
    provider = RawBackend(json_answer(_CONVERSE)).start()
    try:
        out = _call(
            "chat",
            "aws",
            provider.url,
            _BEDROCK,
            via=proxy.url,
            AWS_ENDPOINT_URL_STS="https://sts.invalid",
            AWS_CONFIG_FILE=str(_assume_role_config(tmp_path)),
            AWS_SHARED_CREDENTIALS_FILE=os.devnull,
            AWS_MAX_ATTEMPTS="1",
        )
    finally:
        provider.stop()
    heads = [post.head.split(b"\r\n", 1)[0] for post in proxy.posts]
    assert heads and heads[0].startswith(b"CONNECT sts.invalid:443 "), (heads, out)
    assert provider.posts == [], out


def _hashed_directory(pki: Pki, directory: Path) -> Path:
    """`directory` holding the CA under its OpenSSL subject-hash name (`SSL_CERT_DIR`'s
    layout), made with `openssl rehash`."""
    directory.mkdir()
    shutil.copy(pki.directory / "ca.pem", directory / "ca.pem")
    subprocess.run(["openssl", "rehash", str(directory)], check=True, timeout=30)
    return directory


_CLOUDFLARE_AZURE = "/gateway.ai.cloudflare.com/v1/acct/gw/azure-openai/resource"


def test_ssl_cert_dir_does_not_vouch_for_the_cloudflare_azure_client(tmp_path: Path) -> None:
    """The Azure SDK client LiteLLM builds for a Cloudflare AI Gateway `base_url` took
    httpx's default TLS context, which loads `SSL_CERT_DIR` when `SSL_CERT_FILE` is unset:
    a CA named only there got the prompt and the key. Hosted calls trust certifi's bundle
    or `SSL_CERT_FILE` (the control: still accepted)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to lay out a hashed certificate directory")
    pki = Pki.create(tmp_path / "env-ca")
    provider = RawBackend(json_answer(completion_body("FROM-PROVIDER"))).start()
    front = TLSFront(("127.0.0.1", provider.port), server_context(pki, pki.server())).start()
    url = f"{front.url}{_CLOUDFLARE_AZURE}"
    env = {"AZURE_API_VERSION": "2024-10-21"}
    try:
        by_dir = _call(
            "chat",
            "azure",
            url,
            "azure/deployment",
            SSL_CERT_DIR=str(_hashed_directory(pki, tmp_path / "hashed")),
            **env,
        )
        reached = len(provider.posts)
        by_file = _call(
            "chat",
            "azure",
            url,
            "azure/deployment",
            SSL_CERT_FILE=str(pki.directory / "ca.pem"),
            **env,
        )
    finally:
        front.stop()
        provider.stop()
    assert by_dir.split(" ")[:1] == ["error"], by_dir
    assert reached == 0
    assert by_file.startswith("answered") and "FROM-PROVIDER" in by_file, by_file


def test_gigachat_uploads_a_messages_image_only_to_a_verified_peer(tmp_path: Path) -> None:
    """LiteLLM's GigaChat adapter uploads each image of a message to `<base_url>/files`
    on a client it asks for with `ssl_verify: False` (its OAuth token fetch too): a peer
    with a certificate of a CA nothing trusts got the image, the prompt's content, and
    the access token. Now that client verifies as every hosted one does: nothing reaches
    the untrusted front."""
    pki = Pki.create(tmp_path / "untrusted")  # a CA nothing trusts
    provider = RawBackend(json_answer(completion_body("FROM-PROVIDER"))).start()
    front = TLSFront(("127.0.0.1", provider.port), server_context(pki, pki.server())).start()
    try:
        out = _call(
            "chat+image",
            "gigachat",
            f"{front.url}/api/v1",
            "gigachat/GigaChat",
            GIGACHAT_ACCESS_TOKEN="token-of-the-gateway",
        )
    finally:
        front.stop()
        provider.stop()
    assert _lines(provider) == [], out
    assert out.split(" ")[:1] == ["error"], out
