"""`refuse_control_fields`: every argument LiteLLM reads from a request, other than the
OpenAI API's own fields, is refused, as the installed LiteLLM names them.

A private `kind: openai` backend may be a LiteLLM proxy or SDK server, which turns the
JSON body into `completion()` keyword arguments: a name the gateway lets through moves
the call (`context_window_fallback_dict` calls another model when the prompt is long,
`model_alias_map` any model for a name), sends the prompt to a logging host
(`langfuse_host`) or the call to another endpoint (`deployment_url`), while the log says
the private backend served it. The lists are read from LiteLLM itself (the version the
lock file pins), so an upgrade that adds one fails here until it is listed.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.api import control_fields
from gateway.api.body import parse_body
from gateway.api.control_fields import refuse_control_fields
from gateway.api.labels import excerpt
from gateway.errors import ErrorCode, GatewayError

# OpenAI request fields that LiteLLM also lists as its own: the API's, so they pass (what
# that leaves open is in docs/security.md).
_OPENAI_FIELDS = frozenset({"metadata"})


def _litellm_request_arguments() -> set[str]:
    """The `completion()` parameters LiteLLM owns (`all_litellm_params`) and the names its
    proxy refuses in a request body, top level or in `metadata` (`auth_utils`).

    Read in a child process: importing LiteLLM's proxy changes LiteLLM's module state, and
    a hosted stream test run after it in this process failed in the adapter."""
    script = (
        "import json\n"
        "from gateway.upstream.litellm_runtime import load_litellm\n"
        "load_litellm()\n"
        "from litellm.proxy.auth import auth_utils\n"
        "from litellm.types.utils import all_litellm_params\n"
        "names = [*all_litellm_params, *auth_utils._BANNED_REQUEST_BODY_PARAMS,\n"
        "         *auth_utils._BANNED_METADATA_PARAMS]\n"
        "print(json.dumps(sorted(set(names))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


# Names the installed Router reads from its keyword arguments
# (tests/helpers/litellm_router_arguments.py) that the gateway lets through, each for the
# reason in its group; any other name the Router reads must be refused.
_ROUTER_NAMES_THAT_PASS = frozenset(
    {
        # OpenAI's request fields, of the calls a LiteLLM proxy serves: chat, completions,
        # embeddings, Responses (`previous_response_id` pins the call to the deployment of
        # the model group that served that response: that group's own), speech (`voice`),
        # files and batches (`file`, `purpose`, `endpoint`), the ids of Responses,
        # containers and videos calls, a Realtime client secret's `session` (the Router
        # sets its `model` to the deployment it picked)
        "model",
        "messages",
        "prompt",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "stream",
        "max_tokens",
        "max_completion_tokens",
        "max_output_tokens",
        "reasoning_effort",
        "service_tier",
        "metadata",
        "previous_response_id",
        "voice",
        "file",
        "purpose",
        "endpoint",
        "response_id",
        "container_id",
        "video_id",
        "session",
        # other APIs' request fields: Anthropic's Messages (`thinking`), and the agent of
        # a Gemini Interactions call (read by `Router.ainteractions` only)
        "thinking",
        "agent",
        # parameters of `text_completion`, `aembedding` and `aadapter_completion` that the
        # Router takes and never reads
        "is_async",
        "is_fallback",
        "is_retry",
        # the logging payload of a finished call, which its callbacks and strategies read
        # as `kwargs`: LiteLLM sets these there itself, not from the call's arguments
        "exception",
        "standard_logging_object",
        "completion_start_time",
        "response_status",
        # a callable the Router calls for each attempt: a JSON value is none (the call
        # fails); the guardrail of the proxy's guardrail endpoint (`aguardrail`), made
        # the model there; the model groups of a batch call, which the proxy fills from
        # a comma-separated `model` (a body's own `models` collides with it: TypeError)
        "attempt_function",
        "guardrail_name",
        "models",
    }
)


def _router_arguments() -> dict[str, list[str]]:
    """Each name the installed LiteLLM Router reads from a call's keyword arguments (the
    body a LiteLLM proxy calls it with), with where it is read; in a child process, like
    `_litellm_request_arguments`."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.helpers.litellm_router_arguments"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    found: dict[str, list[str]] = json.loads(done.stdout.splitlines()[-1])
    return found


def _refused(name: str) -> bool:
    """Whether a body with `name` at the top level is refused as `invalid_request`."""
    body = orjson.dumps({"model": "m", name: 1})
    try:
        refuse_control_fields(parse_body(body), body)
    except GatewayError as exc:
        return exc.code is ErrorCode.invalid_request
    return False


def test_every_litellm_argument_but_openais_own_is_refused() -> None:
    names = _litellm_request_arguments()
    assert len(names) > 300  # the lists were found (1.108.7: 408 names)
    passed = sorted(n for n in names - _OPENAI_FIELDS if not _refused(n))
    assert passed == [], f"LiteLLM reads these from a request; the gateway passes them: {passed}"


def test_every_litellm_router_argument_is_refused_or_listed() -> None:
    # A LiteLLM upgrade whose Router reads a new argument (`specific_deployment` picks a
    # deployment across model groups) fails here until CONTROL_FIELDS or a list above has it.
    found = _router_arguments()
    assert {"specific_deployment", "passthrough_on_no_deployment", "fallbacks"} <= set(found)
    assert len(found) > 60  # the Router was read (1.108.7: 91 names)
    listed = _ROUTER_NAMES_THAT_PASS
    passed = {n: where for n, where in found.items() if n not in listed and not _refused(n)}
    assert passed == {}, f"LiteLLM's Router reads these (where); the gateway passes them: {passed}"
    # a listed name LiteLLM no longer reads is dropped from the lists
    assert sorted(listed - set(found)) == []


def test_every_body_key_litellms_proxy_routes_a_call_by_is_refused() -> None:
    """A LiteLLM proxy's `route_request` (litellm/proxy/route_llm_request.py) picks what to
    call by the keys a request's body holds: `user_config` (a Router of the client's),
    `router_settings_override` (fallbacks, a routing strategy, a timeout merged into its
    Router's call). The latter is neither a `completion()` parameter nor a Router argument,
    so the lists read above missed it and a private `kind: openai` backend that is such a
    proxy was sent it: `{"router_settings_override": {"fallbacks": [{"m": ["gpt-4o"]}]}}`
    had it fall back to any model group its key reaches, a hosted one included."""
    spec = importlib.util.find_spec("litellm")  # located, not imported
    assert spec is not None and spec.origin is not None
    source = (Path(spec.origin).parent / "proxy" / "route_llm_request.py").read_text()
    keys = set(re.findall(r'"([A-Za-z_]+)" (?:not )?in data(?=[\s:)])', source))  # top level
    # ... and read without a membership test (`data.get("fastest_response")`, `data.pop(...)`)
    keys |= set(re.findall(r'\bdata(?:\.get\(|\.pop\(|\[)"([A-Za-z_]+)"', source))
    assert {"user_config", "router_settings_override", "fastest_response"} <= keys  # read
    # the OpenAI model and metadata (the API's); Gemini's native request's `config`
    passing = {"model", "metadata", "generationConfig", "config"}
    assert sorted(k for k in keys - passing if not _refused(k)) == []


def test_a_body_timeout_is_refused() -> None:
    # A LiteLLM proxy's Router takes it as each attempt's timeout: a tiny one sends the
    # request through every deployment into the fallbacks (litellm_pre_call_utils.py).
    assert _refused("timeout") and _refused("Timeout")


@pytest.mark.parametrize(
    "name",
    [
        "context_window_fallback_dict",
        "model_alias_map",
        "data_residency",
        "fastest_response",
        "langfuse_host",
        "deployment_url",
        "sagemaker_base_url",
        "_router_weights",
        # its Router's own, read from the keyword arguments a LiteLLM proxy makes of the body
        "specific_deployment",
        "passthrough_on_no_deployment",
        "model_group_retry_policy",
        "standard_callback_dynamic_params",
        # a LiteLLM proxy's per-request Router settings (`route_request`)
        "router_settings_override",
        # logging integrations for the call, read by LiteLLM's `function_setup`
        "callbacks",
        "success_callback",
        "failure_callback",
    ],
)
def test_a_litellm_argument_that_moves_the_call_is_refused_naming_it(name: str) -> None:
    body = orjson.dumps({"model": "m", "messages": [], name: {"m": "elsewhere"}})
    with pytest.raises(GatewayError) as refused:
        refuse_control_fields(parse_body(body), body)
    assert refused.value.code is ErrorCode.invalid_request
    assert refused.value.param == name


@pytest.mark.parametrize(
    "fields",
    [
        {"metadata": {"app": "x"}},
        {"user": "u1"},
        {"cache_salt": "tenant-a"},  # vLLM's prefix-cache isolation: the server's own answer
        {"service_tier": "flex", "prompt_cache_key": "k", "safety_identifier": "h"},
        {"top_k": 3, "min_p": 0.1, "repetition_penalty": 1.1},
    ],
)
def test_openai_and_sampling_fields_pass(fields: dict[str, Any]) -> None:
    body = orjson.dumps({"model": "m", "messages": [], **fields})
    refuse_control_fields(parse_body(body), body)


@pytest.mark.parametrize(
    "spelled",
    [
        "FALLBACKS",
        "Api_Base",
        "api_ba\u017fe",  # long s: Go folds it to `s`
        "LITELLM_PARAMS",
        "\u212aeepalive_seconds",  # Kelvin sign: `k`
    ],
)
def test_a_control_field_in_another_case_is_refused(spelled: str) -> None:
    # A router written in Go (encoding/json) reads `"FALLBACKS"` as `fallbacks`.
    body = orjson.dumps({"model": "m", "messages": [], spelled: ["elsewhere/m"]})
    with pytest.raises(GatewayError) as refused:
        refuse_control_fields(parse_body(body), body)
    assert refused.value.code is ErrorCode.invalid_request
    assert refused.value.param == excerpt(spelled)


def test_the_usual_fields_are_passed_by_one_look_up(monkeypatch: pytest.MonkeyPatch) -> None:
    # Hot path: a request of the usual shape is passed without a case fold or prefix
    # search per name; any other name still gets them, in any case.
    searched: list[str] = []
    real = control_fields._is_control

    def counting(name: str) -> bool:
        searched.append(name)
        return real(name)

    monkeypatch.setattr(control_fields, "_is_control", counting)
    body = orjson.dumps(
        {"model": "m", "messages": [], "max_tokens": 16, "stream": True, "Top_K": 3}
    )
    refuse_control_fields(parse_body(body), body)
    assert searched == ["top_k"]  # folded: not one of the usual names
