"""Randomized fault injection: the signed log says exactly what each client saw.

Two scripted private backends answer each request as a seeded RNG says (whole or
streamed, split at arbitrary bytes, framed by length, chunks or the close, lying about
their length, cut or reset at a random byte, an error status), and clients behave as it
says too (read all, leave after K bytes, stop reading a while, `Expect: 100-continue`).
Per request: the last record's status is what the client got (499 for one that left),
its response commitment opens against the client's exact bytes (docs/provenance.md,
"The body a client commits to"), the backend it names is the one whose bytes the client
got, no attempt that failed claims bytes, nothing is answered 500 or hangs; at the end
every dispatch has its completion and `owngate audit verify` passes.

`attested`: each backend behind its own `owngate attest` sidecar (a process), so the faults
happen between backend and sidecar. Also: an accepted countersignature is in the sidecar's
log with the record's response commitment (which opens on the client's bytes), is never on
an answer the client got cut or as an error, and `owngate audit verify --backend-key
--attest-log` passes exactly when every answer below 400 has an accepted one. `hosted`: one
hosted provider instead (the scripted server behind LiteLLM, as OpenAI-compatible), with a
finish reason or none and a chunk that is not JSON too.

CI runs a fixed seed and a bounded number of cases. For a longer search set
`OWNGATE_TRUTH_FUZZ_CASES` (cases per seed) and `OWNGATE_TRUTH_FUZZ_SEEDS` (comma-separated).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gateway.api.recorder import Recorder
from gateway.api.trail import Trail
from gateway.provenance import commit, load_signer
from gateway.provenance.formats.stream_body import committed_bodies
from tests.helpers.attest import Sidecar, start_sidecar
from tests.helpers.gateways import (
    HOSTED_ONLY_POLICY,
    LITELLM_WARNINGS,
    Gateway,
    backend,
    hosted_backend,
    logged_gateway,
)
from tests.helpers.log_truth import ORIGIN
from tests.helpers.provenance import records, run_audit
from tests.helpers.raw_backend import Answer, Post, RawBackend
from tests.helpers.truth_fuzz import (
    BackendPlan,
    Got,
    answer_body,
    backend_plan,
    client_plan,
    hosted_plan,
    play,
    request_case,
    serve,
)
from tests.helpers.waiting import until

pytestmark = LITELLM_WARNINGS  # the hosted kind streams through LiteLLM
# Cases per seed; CI's: 40 plain, 20 attested or hosted (their sidecars and LiteLLM cost).
_CASES = {
    k: int(os.environ.get("OWNGATE_TRUTH_FUZZ_CASES", "40" if k == "plain" else "20"))
    for k in ("plain", "attested", "hosted")
}
_SEEDS = [int(s) for s in os.environ.get("OWNGATE_TRUTH_FUZZ_SEEDS", "20261203").split(",")]
# Clients at once: 1 in CI (each case's outcome then depends on its seed alone).
_CONCURRENCY = int(os.environ.get("OWNGATE_TRUTH_FUZZ_CONCURRENCY", "1"))
_MARK = re.compile(rb"case-(\d+)-([a-z]+)-")
_ERROR_EVENT = re.compile(rb'data: \{"error":\{[^\r\n]*\}\}\n\n')
_ERROR_STATUS = {"upstream_error": 502, "upstream_timeout": 504, "not_ready": 503}
_REFUSAL_STATUS = {
    "policy_denied": 403,
    "no_compliant_backend": 503,
    "unknown_data_class": 400,
    "model_not_found": 404,  # a model the tenant's `/v1/models` does not list
}
# Every client read is bounded by this; the gateway's own timeouts are well within it.
_CLIENT_LIMIT_S = 30.0
# The gateway's: two attempts, each within connect + first byte + the reads between.
_LIMITS = {
    "connect_timeout_s": 1,
    "first_byte_timeout_s": 0.5,
    "read_timeout_s": 0.5,
    "response_timeout_s": 5,
    "stream_timeout_s": 5,
    "drain_timeout_s": 0.3,
}
_LONGEST_S = 2 * (1 + 5) + 2  # both attempts at their longest, and the receipt's signing


@dataclasses.dataclass(frozen=True)
class _Request:
    case: int
    trail: Trail  # its salts once the request ended: the last dispatch's (a failover's
    # dispatch gets a response salt of its own)


@pytest.fixture
def sidecars() -> Iterator[list[Sidecar]]:
    """Sidecars a test started: killed at the end if it did not stop them."""
    started: list[Sidecar] = []
    yield started
    for sidecar in started:
        sidecar.process.kill()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("drain", "kind"),
    [(False, "plain"), (True, "plain"), (False, "attested"), (True, "attested"), (False, "hosted")],
    ids=["faults", "faults-then-drain", "attested", "attested-then-drain", "hosted"],
)
@pytest.mark.parametrize("seed", _SEEDS)
def test_randomized_faults_leave_a_log_that_says_what_each_client_saw(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    sidecars: list[Sidecar],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    seed: int,
    drain: bool,
    kind: str,
) -> None:
    """`drain`: the gateway begins to drain while a backend answers a case the seed
    picks (what still runs past `drain_timeout_s` is cut: 503), and later requests get
    503 not_ready. `kind`: private backends, each behind its own sidecar (attested), or one
    hosted provider through LiteLLM."""
    rng = random.Random(seed)
    names, plan = (("hosted",), hosted_plan) if kind == "hosted" else (("a", "b"), backend_plan)
    plans = {case: {n: plan(rng) for n in names} for case in range(_CASES[kind])}
    clients = {case: client_plan(rng) for case in range(_CASES[kind])}
    requests: dict[str, _Request] = {}  # request commitment -> its case, and its trail
    start = Recorder.start

    def keeping(recorder: Recorder, body: bytes) -> Trail:
        trail = start(recorder, body)
        requests[trail.request_commitment] = _Request(request_case(body), trail)
        return trail

    monkeypatch.setattr(Recorder, "start", keeping)
    drain_at = rng.randrange(_CASES[kind]) if drain else None
    started: list[Gateway] = []

    def answering(name: str) -> Answer:
        async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
            if request_case(post.body) == drain_at:
                for task in list(started[0].app.serving)[:1]:  # its loop is the gateway's
                    task.get_loop().call_soon_threadsafe(started[0].app.begin_drain)
            return await serve(plans, name, writer, post)

        return answer

    raws = {n: start_raw(answering(n)) for n in names}
    hosted: dict[str, Any] = {}
    if kind == "attested":
        sidecars += [start_sidecar(tmp_path / "attest", n, raw.url) for n, raw in raws.items()]
        backends = [backend(s.key_file.stem, s.url, "m", attest={"key": s.vkey}) for s in sidecars]
    elif kind == "hosted":
        backends = [hosted_backend("hosted", f"{raws['hosted'].url}/v1", "m")]
        (tmp_path / "policies").mkdir()
        (tmp_path / "policies" / "hosted.yaml").write_text(HOSTED_ONLY_POLICY)
        hosted = {
            "environ": {"HOSTED_KEY": "sk-test"},
            "policy": {"paths": [str(tmp_path / "policies")]},
        }
    else:
        backends = [backend(n, raw.url, "m") for n, raw in raws.items()]
    gateway = logged_gateway(
        start_gateway,
        tmp_path,
        backends,
        ORIGIN,
        limits=_LIMITS,
        routing={"breaker": {"failure_threshold": 1000}},
        **hosted,
    )
    started.append(gateway)
    host, port = gateway.server.host, gateway.server.port

    def one(case: int) -> Got:
        return play(host, port, gateway.key, case, clients[case], _CLIENT_LIMIT_S)

    with ThreadPoolExecutor(_CONCURRENCY) as pool:
        got = dict(zip(range(_CASES[kind]), pool.map(one, range(_CASES[kind])), strict=True))
    until(lambda: not gateway.app.serving, "every request ended", timeout=_LONGEST_S)
    gateway.server.stop()  # the final checkpoint
    log = records(tmp_path / "log")
    problems = _every_dispatch_completed(log)
    for case in range(_CASES[kind]):
        ids = {r["request_id"] for r in log if _case_of(r, requests) == case}
        mine = [r for r in log if r["request_id"] in ids]
        where = f"case {case} ({plans[case]}, {clients[case]}, got {got[case].describe()})"
        problems += [
            f"{where}: {p}" for p in _check(case, got[case], mine, log, requests, plans[case])
        ]
    key = load_signer(tmp_path / "log.key").vkey
    if run_audit(["verify", str(tmp_path / "log"), "--key", key]) != 0:
        problems.append("owngate audit verify failed")
    if kind == "attested":
        problems += _attested_problems(log, got, requests, sidecars, key, tmp_path / "log")
    assert not problems, f"seed {seed}:\n" + "\n".join(problems)


def _case_of(record: dict[str, Any], requests: dict[str, _Request]) -> int | None:
    found = requests.get(record.get("request_commitment") or "")
    return None if found is None else found.case


def _every_dispatch_completed(log: list[dict[str, Any]]) -> list[str]:
    completed = {r["dispatch"]["index"] for r in log if r["type"] == "completion"}
    return [
        f"{r['request_id']}: dispatch {i} has no completion"
        for i, r in enumerate(log)
        if r["type"] == "dispatch" and i not in completed
    ]


def _check(
    case: int,
    got: Got,
    mine: list[dict[str, Any]],
    log: list[dict[str, Any]],
    requests: dict[str, _Request],
    plans: dict[str, BackendPlan],
) -> list[str]:
    """What is wrong with the records `mine` of `case`, whose client got `got`."""
    if got.note and not got.left:
        return [got.note]
    if got.seconds > _LONGEST_S:
        return [f"took {got.seconds:.1f}s, past the gateway's timeouts"]
    if got.status == 500:
        return ["the gateway answered 500"]
    if len({r["request_id"] for r in mine}) > 1:
        return [f"one request, several ids: {mine}"]
    if not mine:
        draining = got.status == 503 and b'"not_ready"' in got.body  # refused before a record
        return [] if draining or (got.left and got.status is None) else ["no record"]
    request_id = got.headers.get(b"x-request-id", mine[0]["request_id"].encode()).decode()
    if request_id != mine[0]["request_id"]:
        return [f"the client's request id {request_id} is not its records'"]
    last = mine[-1]
    if last["type"] == "refusal":
        wanted = _REFUSAL_STATUS.get(last["reason"])
        return [] if got.left or wanted == got.status else [f"refusal {last['reason']}"]
    if last["type"] != "completion":
        return [f"its last record is a {last['type']}"]
    problems = []
    completions = [r for r in mine if r["type"] == "completion"]
    for earlier in completions[:-1]:
        if earlier["response_commitment"] is not None or earlier["status"] in (200, 499):
            problems.append(f"a failed attempt claims an answer: {earlier}")
    if any(r["status"] == 500 for r in completions):
        problems.append("a record says 500")
    dispatch = log[last["dispatch"]["index"]]
    served = dispatch["backend"]["id"]
    marks = set(_MARK.findall(got.body))
    if marks - {(str(case).encode(), served.encode())}:
        problems.append(f"the client got bytes of {marks}, the record names {served}")
    salt = requests[dispatch["request_commitment"]].trail.salts.response
    commitment = last["response_commitment"]
    if got.left and not got.complete:
        if last["status"] != 499:
            return problems  # all of it went out before the gateway saw the client leave
        tails = _more_that_went_out(got.body, plans[served], case, served)
        if served == "hosted":
            return problems  # LiteLLM's rendering, not the provider's bytes: no tails known
        if commitment is not None and not any(
            commitment == commit("response", salt, got.body + tail) for tail in tails
        ):
            problems.append("the 499 record commits to bytes the client did not get")
        return problems
    stream = got.headers.get(b"content-type", b"").startswith(b"text/event-stream")
    status = got.status
    error = _ERROR_EVENT.search(got.body) if stream else None
    if error is not None:
        code = json.loads(error[0][len(b"data: ") :])["error"]["code"]
        status = _ERROR_STATUS.get(code, -1)
    if last["status"] != status:
        problems.append(f"the record says {last['status']}, the client got {status}")
    bodies = committed_bodies(got.body) if stream else (got.body,)
    if commitment is None and got.body and status == 200:
        problems.append("the record commits to nothing, the client got bytes")
    elif commitment is not None and commitment not in {commit("response", salt, b) for b in bodies}:
        problems.append("the commitment does not open on the client's bytes")
    return problems


def _more_that_went_out(seen: bytes, plan: BackendPlan, case: int, name: str) -> list[bytes]:
    """Tails the gateway may have sent after what a leaving client read: any part of the
    backend's answer after it (as sent, or less its usage event, which the gateway holds
    back from a client that did not ask for it)."""
    tails = [b""]
    for full in (answer_body(plan, case, name), answer_body(plan, case, name, with_usage=False)):
        if full.startswith(seen):
            tails += [full[len(seen) : n] for n in range(len(seen) + 1, len(full) + 1)]
    return tails


def _attested_problems(
    log: list[dict[str, Any]],
    got: dict[int, Got],
    requests: dict[str, _Request],
    sidecars: list[Sidecar],
    key: str,
    directory: Path,
) -> list[str]:
    """What is wrong with the countersignatures in `log` (see the module's docstring)."""
    problems = [f"sidecar {s.key_file.stem} exited {code}" for s in sidecars if (code := s.stop())]
    statements = {
        (r["key"], r["counter"]): r
        for s in sidecars
        for r in records(s.log)
        if r["type"] == "attestation"
    }
    unsigned = 0
    for record in log:
        attestation = record.get("attestation") if record["type"] == "completion" else None
        if attestation is None:
            continue
        if attestation["failure"] is not None:
            unsigned += record["status"] < 400
            continue
        case = _case_of(log[record["dispatch"]["index"]], requests)
        where = f"case {case} ({got[case].describe() if case is not None else '?'})"
        statement = statements.get((attestation["key"], attestation["counter"]))
        if statement is None:
            problems.append(f"{where}: an accepted countersignature not in its sidecar's log")
        elif statement["response_commitment"] != record["response_commitment"]:
            problems.append(f"{where}: the statement commits to another response")
        client = got[case] if case is not None else None
        cut = client is not None and not client.left and not client.complete
        error = client is not None and _ERROR_EVENT.search(client.body) is not None
        if record["status"] >= 400 or cut or error:
            problems.append(f"{where}: a cut or error answer ({record['status']}) countersigned")
    audit = ["verify", str(directory), "--key", key]
    for sidecar in sidecars:
        name = sidecar.key_file.stem
        audit += [
            "--backend-key",
            f"{name}={sidecar.vkey}",
            "--attest-log",
            f"{name}={sidecar.log}",
        ]
    passed = run_audit(audit) == 0
    if passed != (unsigned == 0):
        problems.append(f"audit verify --backend-key passed: {passed}, {unsigned} unsigned answers")
    return problems
