"""What a hosted call sends through libraries other than LiteLLM's HTTP handlers, and whom
the httpx clients it makes trust: held to the same rules as the rest of the call.

LiteLLM 1.108.7 fetches some credentials with `requests` inside a hosted call: Databricks'
OAuth token (`DatabricksBase.get_oauth_m2m_token_and_lifetime`, whenever
`DATABRICKS_CLIENT_ID` and `DATABRICKS_CLIENT_SECRET` are set, even with the backend's key),
and GDC's google-auth refresh. `requests` took `HTTPS_PROXY` and the like from the
environment (the proxy learned the workspace host, and over http read the client secret
and the token), trusted `REQUESTS_CA_BUNDLE` / `CURL_CA_BUNDLE` (their CA's holder could
answer for the token endpoint), sent `~/.netrc` credentials, followed redirects, and read
the whole answer into memory, however large (a hostile endpoint's 200 MB token answer was
200 MB and more of the gateway's memory). `install_requests_rules` makes every
`requests` call made within a watched hosted call (gateway/upstream/hosted_transport.py
`watching`) go straight to its URL, or through the backend's `proxy`, verify against
certifi's bundle or `SSL_CERT_FILE` (as LiteLLM's own clients do), ask for `identity`
and refuse another coding unread, stop at a redirect (its body read to the same bound:
`requests` read a redirect's body whole, decoded, to make the request it did not send),
and read its answer to `limits.max_response_bytes` at most (`AnswerTooLarge`, the
call's `cut`, as for an httpx answer). Outside a watched call `requests` is left as it is.

httpx (and httpx2) build a client's TLS context from `SSL_CERT_FILE`, else from the
directory `SSL_CERT_DIR` names, else their default (certifi's, the OS's): an OpenAI SDK
client LiteLLM makes without its own context (the Azure client for a Cloudflare AI
Gateway `base_url`) trusted any CA in `SSL_CERT_DIR`. `install_hosted_roots` makes a
client created with `verify=True` trust certifi's bundle, or `SSL_CERT_FILE` when it is
set: the design docs/security.md states for hosted calls.

Nor may an adapter switch certificate checks off: LiteLLM's GigaChat handlers ask its client
factory for `ssl_verify: False` (the OAuth token fetch, with the credentials; the upload of
a message's images to the backend's `base_url`, and their download), and got a client
that accepted any certificate, whatever `litellm.ssl_verify` said.
`install_verified_clients` makes LiteLLM's `get_ssl_configuration` read `False` as unset:
the forced `ssl_verify` (on), certifi's bundle or `SSL_CERT_FILE`.

botocore fetches a Bedrock call's AWS credentials itself (STS, SSO, the container or
instance metadata endpoint) when the backend has no key. It took its proxy from the
environment (`HTTP_PROXY`, `HTTPS_PROXY`: the proxy got the instance metadata request and
answered the role's credentials) and trusted `AWS_CA_BUNDLE`, a profile's `ca_bundle` and
`REQUESTS_CA_BUNDLE` (that CA's holder answered for STS), none of which owngate's config
names. `install_botocore_rules` makes botocore, within a watched hosted call, send an https
request through the backend's `proxy` or straight, a plain http one (the host's own
metadata endpoints, whose answer is the credentials themselves) straight, verify against
certifi's bundle or `SSL_CERT_FILE` (even where it was told not to verify), and read an
answer to `limits.max_response_bytes` at most.

A prompt LiteLLM sends through botocore is still refused unsent: such a route
(`BOTO3_ROUTES`: SageMaker embeddings, `invoke_endpoint`) is 400 `invalid_request` with
`param: model` (gateway/upstream/hosted.py `prepare`): botocore retried the request (the
prompt) up to three times, outside the gateway's attempts.
"""

from __future__ import annotations

import functools
import importlib
import os
import ssl
from typing import Any, Final

from gateway.upstream.hosted_bound import ABANDONED, NOT_IDENTITY, AnswerTooLarge
from gateway.upstream.hosted_transport import watched

__all__ = [
    "BOTO3_ROUTES",
    "hosted_ca_file",
    "install_botocore_rules",
    "install_hosted_roots",
    "install_requests_rules",
    "install_verified_clients",
]

# (endpoint, LiteLLM route) whose prompt LiteLLM 1.108.7 sends through boto3, and why not:
# botocore's proxy, trust and answer bound are forced now (`install_botocore_rules`), its
# retries (the prompt in each) are not.
BOTO3_ROUTES: Final = {
    ("embeddings", "sagemaker"): "on another route: LiteLLM sends sagemaker/ embeddings "
    "through boto3, which sends the request again on its own retries, outside the "
    "gateway's attempts",
}
_MARK: Final = "_owngate_hosted_rules"
_READ: Final = 65536


def hosted_ca_file() -> str:
    """The bundle a hosted call verifies against: `SSL_CERT_FILE` when it names a file
    (LiteLLM's `get_ssl_configuration` does the same), else certifi's."""
    named = os.environ.get("SSL_CERT_FILE")
    if named and os.path.exists(named):
        return named
    import certifi  # LiteLLM's dependency, loaded with it

    return str(certifi.where())


def install_requests_rules() -> None:
    """Wrap `requests.Session` so that a request made within a watched hosted call follows
    the call's rules (see the module's notes); idempotent; nothing when `requests` is not
    installed."""
    try:
        sessions = importlib.import_module("requests.sessions")
    except ImportError:
        return
    session = sessions.Session
    if getattr(session.send, _MARK, False):
        return
    merge, send, netrc = session.merge_environment_settings, session.send, sessions.get_netrc_auth
    redirects = session.resolve_redirects

    @functools.wraps(merge)
    def merge_environment_settings(self: Any, url: Any, proxies: Any, *args: Any) -> Any:
        if watched() is None:
            return merge(self, url, proxies, *args)
        _stream, verify, cert = args  # read whole, bounded, by `bounded_send` anyway
        verify = self.verify if verify is None else verify
        if verify is True or verify is None:
            verify = hosted_ca_file()  # never REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE
        cert = self.cert if cert is None else cert
        return {"proxies": {}, "stream": True, "verify": verify, "cert": cert}

    @functools.wraps(send)
    def bounded_send(self: Any, request: Any, **kwargs: Any) -> Any:
        outbound = watched()
        if outbound is None:
            return send(self, request, **kwargs)
        proxy = outbound.proxy
        kwargs["proxies"] = {} if proxy is None else {"http": proxy, "https": proxy}
        kwargs["allow_redirects"] = False
        kwargs["stream"] = True
        if kwargs.get("verify") in (None, True):
            kwargs["verify"] = hosted_ca_file()
        request.headers["Accept-Encoding"] = "identity"
        response = send(self, request, **kwargs)
        try:
            _read_bounded(response, outbound)
        except BaseException:
            response.close()
            raise
        return response

    @functools.wraps(redirects)
    def resolve_redirects(self: Any, response: Any, *args: Any, **kwargs: Any) -> Any:
        # `Session.send` asks, a redirect not followed, for the request it would make next
        # (`Response.next`), and this generator reads the answer's body whole for it,
        # decoded, before `bounded_send` reads it: a 302 of any size (or a gzip bomb) was
        # read into memory. Within a hosted call no redirect is followed: nothing to make.
        if watched() is not None:
            return iter(())
        return redirects(self, response, *args, **kwargs)

    def get_netrc_auth(*args: Any, **kwargs: Any) -> Any:
        return None if watched() is not None else netrc(*args, **kwargs)

    wrappers = (merge_environment_settings, bounded_send, resolve_redirects, get_netrc_auth)
    for wrapper in wrappers:
        setattr(wrapper, _MARK, True)
    session.merge_environment_settings = merge_environment_settings
    session.send = bounded_send
    session.resolve_redirects = resolve_redirects
    setattr(sessions, "get_netrc_auth", get_netrc_auth)  # noqa: B010 - `prepare_request` reads it


def install_botocore_rules() -> None:
    """Wrap botocore's HTTP session so that, within a watched hosted call, it takes no
    proxy or CA from the environment (see the module's notes) and an answer it would read
    whole (a credential fetch: STS, the container or instance metadata endpoint) is read
    to `outbound.max_bytes` at most; idempotent."""
    try:
        httpsession = importlib.import_module("botocore.httpsession")
    except ImportError:
        return
    session = httpsession.URLLib3Session
    send = session.send
    if getattr(send, _MARK, False):
        return
    proxy_url_for = httpsession.ProxyConfiguration.proxy_url_for
    setup_ssl_cert = session._setup_ssl_cert

    @functools.wraps(proxy_url_for)
    def call_proxy_url(self: Any, url: str) -> str | None:
        outbound = watched()
        if outbound is None:  # else never the environment's (`get_environ_proxies`)
            return proxy_url_for(self, url)  # type: ignore[no-any-return]
        https = url.lower().startswith("https:")
        return outbound.proxy if https else None  # http: the host's metadata endpoints

    @functools.wraps(setup_ssl_cert)
    def hosted_ssl_cert(self: Any, conn: Any, url: str, verify: Any) -> None:
        if watched() is not None:  # never AWS_CA_BUNDLE, `ca_bundle`, REQUESTS_CA_BUNDLE
            verify = hosted_ca_file()
        setup_ssl_cert(self, conn, url, verify)

    @functools.wraps(send)
    def bounded_send(self: Any, request: Any) -> Any:
        outbound = watched()
        if outbound is None or request.stream_output:  # a streamed body: no route uses one
            return send(self, request)
        request.stream_output = True  # botocore reads it whole otherwise, unbounded
        response = send(self, request)
        try:
            response._content = _bounded_body(response.raw, outbound)  # what `.content` reads
        except BaseException:
            response.raw.close()  # its connection dropped, not pooled half read
            raise
        finally:
            request.stream_output = False
        return response

    setattr(bounded_send, _MARK, True)
    httpsession.ProxyConfiguration.proxy_url_for = call_proxy_url
    session._setup_ssl_cert = hosted_ssl_cert
    session.send = bounded_send


def _read_bounded(response: Any, outbound: Any) -> None:
    """Read `response` (requests') whole into it (`content`), to `outbound.max_bytes`."""
    coding = response.headers.get("content-encoding", "identity").strip().lower()
    if coding not in ("", "identity"):
        outbound.cut = NOT_IDENTITY
        raise AnswerTooLarge(outbound.cut)
    response._content = _bounded_body(response.raw, outbound)  # `.content`, `.text`, `.json()`
    response._content_consumed = True
    response.close()


def _bounded_body(raw: Any, outbound: Any) -> bytes:
    """A urllib3 response's body as sent (not decoded), `AnswerTooLarge` past the call's
    `max_bytes`, or once the call has ended (its thread reads on, nothing waits)."""
    limit = outbound.max_bytes
    body = bytearray()
    for chunk in raw.stream(_READ, decode_content=False):
        if outbound.ended:  # its call ended (timed out) while this thread still read
            raise AnswerTooLarge(ABANDONED)
        body += chunk
        if limit is not None and len(body) > limit:
            outbound.cut = (
                f"sent an answer larger than {limit} bytes "
                "(limits.max_response_bytes; read no further)"
            )
            raise AnswerTooLarge(outbound.cut)
    return bytes(body)


def install_hosted_roots() -> None:
    """Make an httpx (or httpx2) client created with `verify=True` trust certifi's bundle
    or `SSL_CERT_FILE` only, never `SSL_CERT_DIR`; idempotent."""
    for name in ("httpx._transports.default", "httpx2._transports.default"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        create = module.create_ssl_context
        if getattr(create, _MARK, False):
            continue

        @functools.wraps(create)
        def create_ssl_context(
            verify: Any = True, cert: Any = None, trust_env: bool = True, _create: Any = create
        ) -> Any:
            if verify is True:
                cafile = hosted_ca_file() if trust_env else _certifi()
                verify = ssl.create_default_context(cafile=cafile)
            return _create(verify=verify, cert=cert, trust_env=trust_env)

        setattr(create_ssl_context, _MARK, True)
        setattr(module, "create_ssl_context", create_ssl_context)  # noqa: B010 - the name its transports call


def install_verified_clients() -> None:
    """Make LiteLLM's `get_ssl_configuration` (which its HTTP handlers call, by the name
    their modules imported) verify where an adapter asked for `ssl_verify=False`;
    idempotent."""
    for name in ("http_handler", "aiohttp_handler"):
        module = importlib.import_module(f"litellm.llms.custom_httpx.{name}")
        configure = module.get_ssl_configuration
        if getattr(configure, _MARK, False):
            continue

        @functools.wraps(configure)
        def get_ssl_configuration(ssl_verify: Any = None, _configure: Any = configure) -> Any:
            return _configure(None if ssl_verify is False else ssl_verify)

        setattr(get_ssl_configuration, _MARK, True)
        setattr(module, "get_ssl_configuration", get_ssl_configuration)  # noqa: B010 - a global


def _certifi() -> str:
    import certifi

    return str(certifi.where())
