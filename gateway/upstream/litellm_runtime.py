"""Load LiteLLM before its first use, offline and silent; close the HTTP clients it caches.

Nothing here runs at import. `preload_litellm()` imports LiteLLM at startup, before the
gateway is ready, at a config reload, before the new config is installed, and at a
reload of the policy files (gateway/policy_set.py), before the new set is installed,
when the policy set may send a request to a hosted backend (`PolicySet.falls_back`);
else the first hosted call imports it (`aload_litellm()`). A gateway whose policies never fall back
never imports it (a test checks that). The import takes seconds of CPU, so it runs in a
worker thread; but beside traffic that thread starved the event loop of the GIL: with
private requests every 10 ms, a fresh gateway's first hosted call held them for up to
0.8 s each, several times, while it imported LiteLLM (the same import in another process
held none above 40 ms). Loaded before the gateway is ready, with the modules LiteLLM's
first call imported (`_FIRST_CALL_MODULES`), none beside that call took over 40 ms.

What is switched off, and why (LiteLLM 1.108.7, read from its source):

- Environment read *at import*: `LITELLM_LOCAL_MODEL_COST_MAP=True` (else the model cost
  map is fetched from raw.githubusercontent.com, retried in a background thread);
  `LITELLM_MODE=PRODUCTION` (else `dotenv.load_dotenv()` walks up from LiteLLM's install
  directory and loads any `.env` it finds into `os.environ`); `LITELLM_LOG=ERROR` (level of
  LiteLLM's own stderr handler; its default is DEBUG).
- Environment read *per call*: `LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS=True` (else the
  Anthropic beta-header table is fetched from GitHub); `LITELLM_RUST=false` (every route
  stays on LiteLLM's Python implementation, the one tested here);
  `LITELLM_PRINT_STANDARD_LOGGING_PAYLOAD` removed (when set, every call's payload, prompt
  included, is printed to stdout); `USE_LITELLM_PROXY` removed (`true` sent every hosted
  call without a `base_url`, whatever its provider or pinned Region, to
  `LITELLM_PROXY_API_BASE` with the backend's key; `use_litellm_proxy` is forced off);
  `SSL_VERIFY` removed (`False` turned certificate checks off for every hosted call;
  `ssl_verify` is forced on), `SSL_SECURITY_LEVEL` (an OpenSSL level of 0 allows any
  cipher) and `SSLKEYLOGFILE` (every hosted call's TLS
  secrets were written to the file it names).
- Proxies: only a hosted backend's `proxy` (gateway.yaml), none from the environment.
  Its aiohttp transport read `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` (any case) on every
  request, and the httpx clients it makes without a transport mount them: the proxy read
  an http call's prompt and key and answered for the provider. The transport now asks
  the hosted call a request belongs to (`call_proxy`, gateway/upstream/hosted_transport.py),
  `disable_aiohttp_trust_env` is on (`AIOHTTP_TRUST_ENV` removed), and every httpx client
  it creates loses the routes httpx mounted from the environment (`_direct`); within a
  hosted call, any httpx client (one LiteLLM made elsewhere, a sync one in a worker
  thread) sends on its own transport, through the backend's `proxy` if it names one
  (`install_call_routes`).
  `SSL_CERT_FILE` still replaces certifi's bundle for hosted calls (an operator's
  bundle, docs/security.md); `SSL_CERT_DIR` never vouches (`install_hosted_roots`).
  A `requests` call within a hosted call (a token fetch) takes no proxy, CA or `.netrc`
  from the environment and is bounded, and so does botocore fetching AWS credentials (no
  proxy or CA of the environment's or a profile's; gateway/upstream/hosted_libraries.py).
- Module settings after import: no callbacks of any kind (they are how LiteLLM ships
  requests to logging/observability services), no pre- or post-call rules (a stream's
  post-call rules read all its text so far); `suppress_debug_info` (no "Give Feedback"
  banners on stdout); `set_verbose=False`; `turn_off_message_logging` and
  `redact_messages_in_exceptions` (no prompt text in its logging payloads or exception
  messages); `disable_hf_tokenizer_download` (token counting would otherwise download
  tokenizers from the Hugging Face Hub); `modify_params=False`,
  `route_all_chat_openai_to_responses=False` (no environment-driven rewriting);
  `DEFAULT_MAX_RETRIES=0` (its OpenAI embedding handler took the gateway's `max_retries=0`
  for "unset" and had the SDK send a failed embedding three times, the input sent and
  billed three times, three connect timeouts and back-offs to a provider address that
  never finished a handshake before the gateway could fail over);
  `user_url_validation=True`, `user_url_allowed_hosts=[]` (LiteLLM's own refusal of
  content-part URLs on non-public addresses stays on, behind gateway/upstream/media_urls.py);
  `disable_anthropic_gemini_context_caching_transform=True` (a `cache_control` marker
  never becomes a Gemini or Vertex context cache, a stored `cachedContents` resource whose
  lifetime the request names; gateway/upstream/hosted_fields.py refuses such markers
  before LiteLLM sees them, this is behind it); `enable_anthropic_prompt_caching=False`
  and no `anthropic_prompt_caching_ttl` (`LITELLM_ENABLE_ANTHROPIC_PROMPT_CACHING=true`,
  read at import, had it mark every Claude request `cache_control`, the prompt kept by
  the provider past the backend's declared retention).
- Warnings: pydantic's serializer warnings are ignored. LiteLLM dumps a provider's answer
  through its pydantic models; one of an unexpected shape makes pydantic warn with the
  offending value (`input_value='...'`, the answer's text, cut in the middle) on stderr,
  outside the gateway's redacting log pipeline.
- Logging: the `LiteLLM`, `LiteLLM Router` and `LiteLLM Proxy` loggers lose their handler,
  stop propagating, sit above CRITICAL and drop every record through a filter, so neither
  LiteLLM's debug output (which holds full request bodies) nor its error lines reach the
  gateway's logs even if something later lowers their level.

These values are forced, not defaulted: an operator's `LITELLM_LOG=DEBUG` would log prompts.

Redirects are never followed. LiteLLM's HTTP handlers and the OpenAI SDK clients it makes
follow them by default, so a provider (or whoever answers at its URL) that answered 307
had the prompt sent on to any host it named, internal ones included, and that host's
answer relayed as the provider's: where a prompt may go is the policy's to say (the
backend's `base_url`). `load_litellm` makes every client LiteLLM creates for a call
(`AsyncHTTPHandler`, `HTTPHandler`, the OpenAI-family clients' httpx client) stop at a
3xx, which LiteLLM then raises as the provider's status: a failed call (502). The OpenAI
client `gateway.upstream.hosted` makes itself is given one that does not follow either
(`no_redirect_http_client`).

Hosted calls stay on LiteLLM's aiohttp transport under httpx (`disable_aiohttp_transport`
and `http2` off, `DISABLE_AIOHTTP_TRANSPORT` and `LITELLM_HTTP2` removed: httpx's own pool
would not be counted), whose connectors count their connections, idle ones included, in
the process's share of descriptors (gateway/upstream/hosted_sockets.py).

Every HTTP request LiteLLM begins marks the hosted call it belongs to
(gateway/upstream/hosted_transport.py), so that an adapter's failure before anything was
sent reads as the client's request, not as the provider failing.

Every stream wrapper LiteLLM creates keeps 13 of its chunks at most, not every one, and none
of its text (`install_stream_bound`, gateway/upstream/hosted_stream.py): it kept them all
until the stream ended, about 4 KB a chunk. Its parser of an Anthropic stream keeps two
deltas a content block and none of the thinking text (`install_delta_bound`,
gateway/upstream/anthropic_deltas.py): it kept every one, about 1 KB each. It gives a
turn Anthropic paused (`pause_turn`), or ended for a reason unknown or null, no finish
reason, where it gave `"stop"` (`install_stop_reasons`, gateway/upstream/anthropic_stops.py).

A chat or text completion LiteLLM serves through a Responses API (its bridge) asks the
provider to store nothing: `"store": false`, which that API does not default to
(gateway/upstream/responses_bridge.py).

A stream's chunk gets the finish reason its provider gave, on OpenAI's wire, Gemini's and
Bedrock Converse's, none where that ends nothing (`abort`, `MALFORMED_FUNCTION_CALL`, a
reason unknown or missing), where LiteLLM gave `"stop"`, and none from `data: [DONE]`
(`install_stream_stops`, gateway/upstream/stream_stops.py).

Where a hosted backend has no `base_url`, LiteLLM reads the provider's URL from the
environment: `check_base_url_environment` (gateway/upstream/provider_environment.py,
re-exported here) refuses a backend such a variable would redirect.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import logging
import os
import warnings
from types import ModuleType
from typing import Any, Final

from gateway.logs import get_logger
from gateway.upstream.anthropic_deltas import install_delta_bound
from gateway.upstream.anthropic_stops import install_stop_reasons
from gateway.upstream.hosted_handoff import install_handoff_guard
from gateway.upstream.hosted_libraries import (
    install_botocore_rules,
    install_hosted_roots,
    install_requests_rules,
    install_verified_clients,
)
from gateway.upstream.hosted_stream import install_stream_bound
from gateway.upstream.hosted_transport import (
    call_proxy,
    install_call_routes,
    install_transport_marks,
)
from gateway.upstream.litellm_clients import refuse_redirects
from gateway.upstream.provider_environment import check_base_url_environment
from gateway.upstream.responses_bridge import install_unstored_bridge
from gateway.upstream.stream_stops import install_stream_stops
from gateway.upstream.text_client import install_text_client_default

__all__ = [
    "FORCED_ENVIRONMENT",
    "aclose_litellm_clients",
    "aload_litellm",
    "check_base_url_environment",
    "load_litellm",
    "preload_litellm",
]

FORCED_ENVIRONMENT: Final[dict[str, str]] = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "LITELLM_MODE": "PRODUCTION",
    "LITELLM_LOG": "ERROR",
    "LITELLM_RUST": "false",
}
_REMOVED_ENVIRONMENT: Final = (
    "LITELLM_PRINT_STANDARD_LOGGING_PAYLOAD",
    "AIOHTTP_TRUST_ENV",  # its aiohttp sessions: proxies (and .netrc) from the environment
    "SSL_VERIFY",  # `false` turned certificate checks off for every hosted call
    "SSL_SECURITY_LEVEL",  # an OpenSSL security level (`0`: any cipher, any key size)
    # Python's `create_default_context` and urllib3's contexts wrote each hosted call's TLS
    # secrets to the file it names (the gateway's own contexts never read it)
    "SSLKEYLOGFILE",
    "DISABLE_AIOHTTP_TRANSPORT",  # httpx's pool: hosted connections the share would not count
    "LITELLM_HTTP2",  # the same (aiohttp has no HTTP/2)
    "USE_LITELLM_PROXY",  # `true` sent hosted calls to `LITELLM_PROXY_API_BASE` (see above)
)
_LOGGERS: Final = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy")
# What LiteLLM 1.108.7's first chat call imported (its `completion` on a worker thread):
# 0.2-0.3 s holding the GIL beside the first hosted call's traffic.
_FIRST_CALL_MODULES: Final = (
    "litellm._service_logger",
    "litellm.llms.litellm_proxy.chat",
    "litellm.llms.openai_like.dynamic_config",
    "litellm.proxy._types",
)
_CALLBACK_LISTS: Final = (
    "callbacks",
    "input_callback",
    "success_callback",
    "failure_callback",
    "service_callback",
    "audit_log_callbacks",
    "_async_input_callback",
    "_async_success_callback",
    "_async_failure_callback",
    # Callables run on the request and on the answer so far: a stream would keep its text.
    "pre_call_rules",
    "post_call_rules",
)
_SETTINGS: Final[dict[str, Any]] = {
    "suppress_debug_info": True,
    "set_verbose": False,
    "turn_off_message_logging": True,
    "redact_messages_in_exceptions": True,
    "disable_hf_tokenizer_download": True,
    "modify_params": False,
    "drop_params": False,  # asked for per call, where the gateway means it
    "route_all_chat_openai_to_responses": False,
    "use_litellm_proxy": False,  # every call to a LiteLLM proxy (`USE_LITELLM_PROXY`'s switch)
    # Its guard on URLs an adapter downloads (image_url, ...): no private addresses, no
    # host let through (gateway/upstream/media_urls.py checks them before LiteLLM does).
    "user_url_validation": True,
    "user_url_allowed_hosts": [],
    # No context cache created from a request's `cache_control` (Gemini, Vertex).
    "disable_anthropic_gemini_context_caching_transform": True,
    # No prompt cache LiteLLM adds on its own (`LITELLM_ENABLE_ANTHROPIC_PROMPT_CACHING`,
    # read at import: every Claude request's system prompt and last turn, kept by the
    # provider for `LITELLM_ANTHROPIC_PROMPT_CACHING_TTL`, an hour at most).
    "enable_anthropic_prompt_caching": False,
    "anthropic_prompt_caching_ttl": None,
    # Its aiohttp transport, whose connectors are counted (gateway/upstream/hosted_sockets.py).
    "disable_aiohttp_transport": False,
    "http2": False,
    # No proxy from the environment (`HTTP_PROXY`, `all_proxy`, ...): a hosted call goes
    # straight to its provider (`_direct` for the httpx clients LiteLLM makes).
    "aiohttp_trust_env": False,
    "disable_aiohttp_trust_env": True,
    "ssl_verify": True,
    # Retries are the gateway's: its OpenAI embedding handler reads the call's
    # `max_retries=0` as `max_retries or DEFAULT_MAX_RETRIES` (2), so the SDK sent a
    # failed embedding three times, three connect timeouts to a stalled address.
    "DEFAULT_MAX_RETRIES": 0,
}


def _drop_record(record: logging.LogRecord) -> bool:
    return False


@functools.cache
def load_litellm() -> ModuleType:
    """Import and configure LiteLLM once per process; later calls return the module."""
    os.environ.update(FORCED_ENVIRONMENT)
    for name in _REMOVED_ENVIRONMENT:
        os.environ.pop(name, None)
    # Process-wide: this process's own serializer warnings would quote values as well.
    warnings.filterwarnings(
        "ignore", message="Pydantic serializer warnings", category=UserWarning, module="pydantic"
    )
    litellm = importlib.import_module("litellm")
    for name, value in _SETTINGS.items():
        setattr(litellm, name, value)
    for name in _CALLBACK_LISTS:
        setattr(litellm, name, [])
    refuse_redirects()
    _count_hosted_connections()
    _proxy_per_call()  # a backend's `proxy`, not the environment's
    install_call_routes()  # every httpx client of a hosted call: the same, no env mounts
    install_transport_marks()  # a refusal before sending told from a provider's failure
    install_requests_rules()  # a token fetch over `requests`: no env proxy or CA, bounded
    install_hosted_roots()  # an httpx client's roots: certifi's or SSL_CERT_FILE, no SSL_CERT_DIR
    install_botocore_rules()  # an AWS credential fetch: no env proxy or CA, bounded
    # names a hosted call looks up: off the loop's threads, bounded, media hosts as checked
    importlib.import_module("gateway.upstream.hosted_names").install_name_rules()
    install_verified_clients()  # an adapter's `ssl_verify=False` (GigaChat's) verifies all the same
    install_unstored_bridge()  # a chat call LiteLLM sends to a Responses API: `store: false`
    install_stream_stops()  # a stream's finish reason: the provider's, none for a failure
    install_stream_bound()  # a stream's wrapper keeps 13 chunks at most
    install_text_client_default()  # a bridged text completion: the gateway's client, closed
    install_handoff_guard()  # its request built for a call that ended meanwhile: closed
    install_delta_bound()  # an Anthropic stream's parser: two deltas a block, no thinking
    install_stop_reasons()  # ... and no finish reason for a paused (or unknown) stop
    for module in _FIRST_CALL_MODULES:  # here, not beside the first call's traffic
        with contextlib.suppress(ImportError):  # another LiteLLM: its first call imports it
            importlib.import_module(module)
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.setLevel(logging.CRITICAL + 1)
        logger.propagate = False
        logger.addFilter(_drop_record)
    return litellm


def _proxy_per_call() -> None:
    """Make LiteLLM's aiohttp transport send a request through the proxy of the hosted
    call it belongs to (the backend's `proxy`, `call_proxy`), never the environment's."""
    transport = importlib.import_module("litellm.llms.custom_httpx.aiohttp_transport")
    transport.LiteLLMAiohttpTransport._get_proxy_settings = call_proxy


def _count_hosted_connections() -> None:
    """Make the aiohttp transports LiteLLM creates use `CountedConnector`s: its session
    factory names `TCPConnector` from its module's globals when it makes a session."""
    counted = importlib.import_module("gateway.upstream.hosted_sockets").CountedConnector
    handlers = importlib.import_module("litellm.llms.custom_httpx.http_handler")
    setattr(handlers, "TCPConnector", counted)  # noqa: B010 - a module global it reads


async def aload_litellm() -> ModuleType:
    """`load_litellm()` without blocking the event loop for the seconds the import takes."""
    if load_litellm.cache_info().currsize:
        return load_litellm()
    return await asyncio.to_thread(load_litellm)


async def preload_litellm() -> None:
    """`aload_litellm()` before traffic needs it (see the module's notes). A failure is
    logged, by its type alone, and the first hosted call tries again: its error is then
    the call's (`HostedUnavailable`)."""
    try:
        await aload_litellm()
    except Exception as exc:  # noqa: BLE001 - whatever the import raised
        get_logger("owngate.hosted").warning("litellm not loaded", error=type(exc).__name__)


async def aclose_litellm_clients() -> None:
    """Close the HTTP clients LiteLLM cached, and forget them (shutdown, end of a test).

    LiteLLM keeps one client per provider, settings and event loop in a process-wide
    cache; closing without forgetting would hand a closed client to the next call.
    Anthropic streams use another client, `litellm.module_level_aclient`, outside that
    cache: its aiohttp session is closed too (the transport opens a new one on next use).
    """
    if load_litellm.cache_info().currsize == 0:
        return  # never loaded: nothing to close, and no reason to import it now
    litellm = load_litellm()
    await litellm.close_litellm_async_clients()
    litellm.in_memory_llm_clients_cache.flush_cache()
    module_client = vars(litellm).get("module_level_aclient")  # lazy: None until first used
    transport = getattr(getattr(module_client, "client", None), "_transport", None)
    if transport is not None and hasattr(transport, "get_valid_client_session"):  # aiohttp
        await transport.aclose()
    # aiohttp closes sockets in transport callbacks on the next loop turns; a loop that
    # stops before they ran leaves the sockets open (aiohttp's "graceful shutdown" advice).
    for _ in range(2):
        await asyncio.sleep(0)
