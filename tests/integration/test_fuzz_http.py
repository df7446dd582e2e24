"""Fuzzing `owngate serve` over raw HTTP: hostile input never widens where a request goes.

Hypothesis assembles requests byte by byte (`tests/helpers/fuzz_inputs.py`, sent with
`tests/helpers/raw_http.py`) to a gateway process with simulated backends
(`tests/helpers/fuzz_rig.py`): request lines, header lines (repeated, empty, huge,
non-ASCII, folded), framing (Content-Length against the body, chunked, truncated), JSON
bodies (duplicate and escaped keys, deep nesting, odd types, huge values, invalid UTF-8),
data-class labels and model strings. For every input:

- the gateway answers 2xx or 4xx, and every 4xx is an OpenAI error object with a code
  of `ErrorCode`. A 5xx is allowed only as the honest news that the backends a request
  may use failed (models `f` and `g`, whose private backends fail, when no fallback is
  allowed), with a code that says so. Malformed framing may instead be answered by
  closing the connection, and a request whose head is over `BIG_HEAD` by 431 or a close;
- no hosted provider receives a request labelled `phi` (in any spelling, copy or
  combination), an unlabelled request of a tenant whose policy defaults to `phi`, or any
  request of a `fallback: never` tenant, however its headers look;
- an empty, blank, undeclared or conflicting label is refused with 400, never read as
  "no label"; a body with two `model` keys (escaped or not) is refused with 400;
- a client's label and model strings never reach the gateway's output or its log;
- the connection is answered or closed, never left hanging; the process stays up and
  its resident memory grows less than `RSS_GROWTH_LIMIT`.

Runs are reproducible (`derandomize`, no example database). `OWNGATE_FUZZ_EXAMPLES=N`
runs N examples per property instead of each test's own count, for a long local run.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.errors import ErrorCode
from tests.helpers.fuzz_inputs import (
    DATA_CLASS,
    MAX_BODY,
    SERVED,
    Body,
    Labels,
    RawRequest,
    Shown,
    bodies,
    chat_body,
    complete_request,
    head_size,
    label_lines,
    model_strings,
    raw_requests,
)
from tests.helpers.fuzz_rig import (
    CLINIC_POLICIES,
    POLICIES,
    Backends,
    HostedCounter,
    fuzz_gateway,
    start_backends,
)
from tests.helpers.processes import GatewayProcess
from tests.helpers.raw_http import Outcome, Response, exchange, openai_error

pytestmark = pytest.mark.fuzz

RSS_GROWTH_LIMIT: Final = 150 * 2**20
BIG_HEAD: Final = 8 * 1024  # a request head past this may meet a header-size limit
TIMEOUT_S: Final = 30.0  # the client's patience: no answer and no close by then is a hang
ERROR_CODES: Final = frozenset(code.value for code in ErrorCode)
# What the gateway may honestly say when every backend a request may use failed.
HONEST_5XX: Final = frozenset(
    {"no_compliant_backend", "backend_unavailable", "upstream_error", "upstream_timeout"}
)
FAILING: Final = ("f", "g")  # models whose private backend fails (tests/helpers/fuzz_rig.py)


def fuzz_settings(examples: int) -> settings:
    """Reproducible settings; `OWNGATE_FUZZ_EXAMPLES` overrides the example count."""
    override = int(os.environ.get("OWNGATE_FUZZ_EXAMPLES") or 0)
    return settings(
        max_examples=override or examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )


# -- the gateway under test ----------------------------------------------------------------


class Target:
    """A running gateway, the hosted provider's request counter, and a memory baseline."""

    def __init__(self, gateway: GatewayProcess, hosted: HostedCounter) -> None:
        self.gateway = gateway
        self.hosted = hosted
        self.baseline_rss = 0

    def __repr__(self) -> str:
        return f"Target(port={self.gateway.port})"

    def start(self) -> Target:
        self.gateway.start()
        self.baseline_rss = self.gateway.rss_bytes()
        return self

    def send(
        self, raw: bytes, *, complete: bool, timeout_s: float = TIMEOUT_S
    ) -> tuple[Outcome, int]:
        """Send one raw request; returns the outcome and how many requests the hosted
        provider received meanwhile (exact: requests go one at a time, and a complete one
        is answered only after any hosted attempt). Checks the process and its memory."""
        before = self.hosted.posts
        outcome = exchange(self.gateway.port, raw, half_close=not complete, timeout_s=timeout_s)
        hosted = self.hosted.posts - before
        assert self.gateway.alive(), f"the gateway died: {self.gateway.output()}"
        growth = self.gateway.rss_bytes() - self.baseline_rss
        assert growth < RSS_GROWTH_LIMIT, f"gateway RSS grew {growth >> 20} MiB"
        return outcome, hosted

    def warm_up(self, tenant: str, cases: list[tuple[str, bytes | None, int, int]]) -> None:
        """Requests down each path, as (model, label, status, hosted requests); then the
        memory baseline, so growth is measured from a gateway that has served them all.
        The first hosted call imports LiteLLM (seconds of CPU): it gets more time."""
        for model, label, status, hosted in cases:
            lines = [] if label is None else [DATA_CLASS + b": " + label]
            raw = complete_request(tenant, chat_body(model), lines)
            outcome, sent = self.send(raw, complete=True, timeout_s=120)
            assert [r.status for r in outcome.final] == [status], outcome.describe()
            assert sent == hosted, outcome.describe()
        self.baseline_rss = self.gateway.rss_bytes()


@pytest.fixture(scope="module")
def backends() -> Iterator[Backends]:
    yield from start_backends()


@pytest.fixture(scope="module")
def target(backends: Backends, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    directory = tmp_path_factory.mktemp("fuzz-gateway")
    gateway = fuzz_gateway(directory, backends, POLICIES, ("open", "never"))
    try:
        target = Target(gateway, backends.hosted).start()
        target.warm_up("open", [("m", None, 200, 0), ("f", None, 200, 1), ("g", b"public", 200, 1)])
        yield target
    finally:
        gateway.stop()


# -- what every answer must look like ------------------------------------------------------


def check_answers(
    raw: bytes, outcome: Outcome, *, complete: bool, honest_5xx: bool
) -> Response | None:
    """The properties of every exchange; returns the final response to compare further
    (None when there is none, or a header-size limit answered).

    `complete`: the request was well framed, so it must be answered, unless its head is
    big enough for a header limit to answer or close instead, or its body is over the
    body limit (the 413 may then be lost to a reset: the gateway answers before reading
    the body, and closing a socket with unread bytes resets it). `honest_5xx`: every
    backend it may use can fail, so 502/503/504 with a code saying so is the truth."""
    where = f"request {raw[:400]!r}... ({len(raw)} bytes): {outcome.describe()}"
    assert not outcome.hung, f"no answer and no close within {TIMEOUT_S}s: {where}"
    assert outcome.malformed is None, f"not a valid HTTP response: {where}"
    for response in outcome.final:
        error = openai_error(response)
        if response.status >= 500:
            assert honest_5xx, f"5xx from the gateway itself: {where}"
            assert error is not None and error["code"] in HONEST_5XX, f"not honest: {where}"
        elif response.status >= 400:
            assert error is not None, f"a 4xx that is not an OpenAI error object: {where}"
            assert error["code"] in ERROR_CODES, f"code outside ErrorCode: {where}"
        else:
            assert 200 <= response.status < 300, f"unexpected status: {where}"
    big = head_size(raw) > BIG_HEAD
    oversized = len(raw) - head_size(raw) - 4 > MAX_BODY
    if complete and not big and not (oversized and not outcome.final):
        assert len(outcome.final) == 1, f"a complete request got no (single) answer: {where}"
    if not outcome.final or (big and outcome.final[0].status == 431):
        return None
    return outcome.final[0]


def error_code(response: Response) -> str | None:
    error = openai_error(response)
    return None if error is None else error["code"]


# -- the properties ------------------------------------------------------------------------


@fuzz_settings(250)
@given(
    tenant=st.sampled_from(["open", "never"]),
    model=st.sampled_from(["f", "g", "m"]),
    stream=st.booleans(),
    labels=label_lines,
)
def test_labels_never_widen_where_a_request_goes(
    target: Target, tenant: str, model: str, stream: bool, labels: Labels
) -> None:
    raw = complete_request(
        tenant,
        chat_body(model, stream=stream),
        labels.header_lines(first=False),
        before=labels.header_lines(first=True),
    )
    outcome, hosted = target.send(raw, complete=True)
    may_go_hosted = tenant == "open" and model in FAILING and labels.may_go_hosted()
    assert hosted == 0 or may_go_hosted, (
        f"{hosted} hosted request(s) for tenant {tenant}, {labels!r}: {outcome.describe()}"
    )
    honest = model in FAILING and not may_go_hosted
    response = check_answers(raw, outcome, complete=True, honest_5xx=honest)
    reason = labels.refusal()
    if response is None or reason is None:
        return
    assert response.status == 400, f"{reason} not refused: {response.describe()}"
    if len(labels.copies) == 1:
        assert error_code(response) == "unknown_data_class", response.describe()


@fuzz_settings(250)
@given(
    path=st.sampled_from([b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings"]),
    body=bodies,
)
def test_json_bodies_get_an_answer_or_an_openai_error(
    target: Target, path: bytes, body: Body
) -> None:
    raw = complete_request("open", body.data, path=path)
    outcome, _ = target.send(raw, complete=True)
    # Tenant `open`, unlabelled: `m` is served privately, `f` and `g` by the healthy
    # hosted fallback, so no 5xx is honest here.
    response = check_answers(raw, outcome, complete=True, honest_5xx=False)
    expected = body.statuses
    assert response is None or expected is None or response.status in expected, (
        f"expected {expected}, got {response.describe()}"
    )


@fuzz_settings(150)
@given(model=model_strings, stream=st.booleans())
def test_model_strings_route_or_are_refused(
    target: Target, model: Shown[str], stream: bool
) -> None:
    name = model.value
    body = chat_body(name, stream=stream)
    raw = complete_request("open", body)
    outcome, hosted = target.send(raw, complete=True)
    assert hosted == 0 or name in FAILING, f"hosted request for model {model!r}"
    response = check_answers(raw, outcome, complete=True, honest_5xx=False)
    if response is None:
        return
    if len(body) > MAX_BODY:
        assert response.status == 413, response.describe()
    elif name in SERVED:
        assert response.status == 200, response.describe()
    elif not name:
        assert error_code(response) == "missing_model", response.describe()
    else:
        assert response.status in (400, 404), response.describe()


@fuzz_settings(300)
@given(request=raw_requests("never"))
def test_malformed_http_is_refused_cleanly(target: Target, request: RawRequest) -> None:
    """Tenant `never`: whatever the framing, nothing may reach the hosted provider."""
    outcome, hosted = target.send(request.data, complete=request.complete)
    assert hosted == 0, f"hosted request for tenant never: {outcome.describe()}"
    honest = request.model in FAILING
    check_answers(request.data, outcome, complete=request.complete, honest_5xx=honest)


CANARY: Final = re.compile(rb"fuzzcanary(\d{6})x")
CANARY_SITES: Final = ["model", "label", "label-repeated", "label-huge", "header", "path"]


def test_canaries_never_reach_the_output_or_the_log(backends: Backends, tmp_path: Path) -> None:
    """A canary sent as a model string, a data-class label (alone, after a valid copy,
    padded to 70 KB), another header's value or the path never appears in what the
    gateway prints or in its provenance log directory (read after a clean stop, when
    every record and log line has been written)."""
    gateway = fuzz_gateway(tmp_path / "gateway", backends, POLICIES, ("open", "never"))
    target = Target(gateway, backends.hosted).start()
    sent: dict[int, tuple[str, bytes]] = {}
    try:
        send_canaries(target, sent)
    finally:
        code = gateway.stop()
    found = {int(m.group(1)) for data in gateway.written() for m in CANARY.finditer(data)}
    leaked = sorted({sent[n][0] for n in found if n in sent})
    examples = [sent[n][1][:300] for n in sorted(found) if n in sent][:3]
    assert not found, f"canaries reached the output or the log via {leaked}, e.g. {examples}"
    assert code == 0, f"gateway exit status {code}: {gateway.output()}"


def send_canaries(target: Target, sent: dict[int, tuple[str, bytes]]) -> None:
    @fuzz_settings(100)
    @given(
        site=st.sampled_from(CANARY_SITES),
        prefix=st.lists(st.sampled_from(list(b"abc-_ ./:phi\xe9")), max_size=12).map(bytes),
        suffix=st.lists(st.sampled_from(list(b"xyz-_ ,;public\xe9")), max_size=12).map(bytes),
        tenant=st.sampled_from(["open", "never"]),
    )
    def send(site: str, prefix: bytes, suffix: bytes, tenant: str) -> None:
        number = len(sent)
        canary = prefix.strip() + b"fuzzcanary%06dx" % number + suffix
        model, lines, path = "m", [], b"/v1/chat/completions"
        if site == "model":
            model = canary.decode("latin-1")
        elif site == "label":
            lines = [DATA_CLASS + b": " + canary]
        elif site == "label-repeated":
            lines = [DATA_CLASS + b": phi", DATA_CLASS + b": " + canary]
        elif site == "label-huge":
            lines = [DATA_CLASS + b": " + canary + b"p" * 70_000]
        elif site == "header":
            lines = [b"user-agent: " + canary, b"x-request-id: " + canary]
        else:
            path = b"/v1/" + canary.replace(b" ", b"%20").replace(b"\xe9", b"%C3%A9")
        raw = complete_request(tenant, chat_body(model), lines, path=path)
        sent[number] = (site, raw)
        outcome, hosted = target.send(raw, complete=True)
        assert hosted == 0, f"hosted request for model m: {outcome.describe()}"
        # Only what the log check needs: the other properties judge the answers.
        assert not outcome.hung, f"no answer and no close within {TIMEOUT_S}s: {raw[:300]!r}"

    send()


def test_unlabelled_requests_of_a_phi_default_tenant_stay_private(
    backends: Backends, tmp_path: Path
) -> None:
    """Tenant `clinic` (policy `default_data_class: phi`, issue 12 item 2): only a request
    every copy of whose label says `public` may reach the hosted provider; an unlabelled
    one is PHI, whatever else its headers say."""
    gateway = fuzz_gateway(tmp_path / "gateway", backends, CLINIC_POLICIES, ("clinic",))
    target = Target(gateway, backends.hosted).start()
    try:
        target.warm_up("clinic", [("g", b"public", 200, 1), ("g", None, 503, 0)])
        send_as_clinic(target)
    finally:
        gateway.stop()


def send_as_clinic(target: Target) -> None:
    @fuzz_settings(100)
    @given(labels=label_lines, model=st.sampled_from(FAILING), stream=st.booleans())
    def send(labels: Labels, model: str, stream: bool) -> None:
        raw = complete_request(
            "clinic",
            chat_body(model, stream=stream),
            labels.header_lines(first=False),
            before=labels.header_lines(first=True),
        )
        outcome, hosted = target.send(raw, complete=True)
        may_go_hosted = bool(labels.copies) and labels.may_go_hosted()
        assert hosted == 0 or may_go_hosted, (
            f"{hosted} hosted request(s) for a PHI-by-default tenant, labels {labels!r}"
        )
        check_answers(raw, outcome, complete=True, honest_5xx=not may_go_hosted)

    send()
