"""Two-party statements in pieces: the statement format, the gateway's check of a
countersignature, the SSE comment taken out of a stream, the completion record's
`attestation` and `upstream` fields (and that records without them stay valid)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.api.attested import Attester, SseTail
from gateway.api.metrics import GatewayMetrics
from gateway.api.trail import Trail
from gateway.cli.main import main
from gateway.provenance import Receipt, Salts, commit, make_receipt, verify_receipt
from gateway.provenance.errors import MalformedError, RecordError
from gateway.provenance.formats.attestation import (
    Attestation,
    AttestationFailure,
    Statement,
    check_countersignature,
    receipt_countersignature,
    sign_statement,
    statement_of_records,
)
from gateway.provenance.formats.receipts import countersignature_of
from gateway.provenance.formats.records import LogEntry, completion_record, validate_record
from gateway.provenance.formats.upstream_ids import UpstreamIds
from gateway.provenance.testing import CountingRandom, seeded_signer
from gateway.sse_comments import CommentFilter
from gateway.upstream.hosted_response import provider_ids

SIGNER = seeded_signer("gpu-a")
OTHER = seeded_signer("gpu-b")
SALTS = Salts.generate(CountingRandom())
REQUEST = b'{"model":"m","messages":[]}'
RESPONSE = b'{"choices":[{"message":{"content":"hi"}}]}'
NOW = "2026-01-01T00:00:00.000Z"


def _statement(counter: int = 0, request_id: str = "req-1", key: str = str(SIGNER)) -> Statement:
    return Statement(
        request_id,
        NOW,
        counter,
        key,
        commit("request", SALTS.request, REQUEST),
        commit("response", SALTS.response, RESPONSE),
    )


def _envelope_of(payload: bytes) -> bytes:
    return json.dumps(
        {
            "payloadType": "application/vnd.owngate.attestation+json",
            "payload": base64.b64encode(payload).decode(),
            "signatures": [{"keyid": str(SIGNER), "sig": base64.b64encode(bytes(64)).decode()}],
        }
    ).encode()


def _twice(envelope: bytes) -> bytes:
    """`envelope` with its payload's `counter` member written twice."""
    value = json.loads(envelope)
    payload = base64.b64decode(value["payload"])
    value["payload"] = base64.b64encode(b'{"counter":9,' + payload[1:]).decode()
    return json.dumps(value).encode()


def _check(envelope: bytes | None, **changes: str) -> None:
    expected = {
        "request_id": "req-1",
        "request_commitment": commit("request", SALTS.request, REQUEST),
        "response_commitment": commit("response", SALTS.response, RESPONSE),
        **changes,
    }
    check_countersignature(envelope, SIGNER.verifier(), **expected)


def test_a_countersignature_over_the_same_commitments_is_accepted() -> None:
    envelope = sign_statement(_statement(7), SIGNER)
    _check(envelope)
    assert json.loads(base64.b64decode(json.loads(envelope)["payload"]))["counter"] == 7


@pytest.mark.parametrize(
    ("envelope", "changes", "code"),
    [
        (None, {}, "missing"),
        (b"{}", {}, "malformed"),
        (b"x" * 5000, {}, "malformed"),
        (sign_statement(_statement(key=str(OTHER)), OTHER), {}, "wrong_key"),
        (sign_statement(_statement(), SIGNER), {"request_id": "req-2"}, "mismatch"),
        (sign_statement(_statement(), SIGNER), {"response_commitment": "0" * 64}, "mismatch"),
        (sign_statement(_statement(), SIGNER), {"request_commitment": "0" * 64}, "mismatch"),
        # nested past Python's recursion limit, within MAX_ENVELOPE: the envelope, the payload
        (b"[" * 4000, {}, "malformed"),
        (_envelope_of(b"[" * 2900), {}, "malformed"),
        # a member twice: parsers that keep the first and those that keep the last differ
        (_twice(sign_statement(_statement(), SIGNER)), {}, "malformed"),
    ],
)
def test_a_countersignature_that_does_not_fit_is_refused(
    envelope: bytes | None, changes: dict[str, str], code: str
) -> None:
    with pytest.raises(AttestationFailure) as failed:
        _check(envelope, **changes)
    assert failed.value.code == code


def test_a_statement_changed_after_signing_fails_its_signature() -> None:
    envelope = json.loads(sign_statement(_statement(1), SIGNER))
    payload = json.loads(base64.b64decode(envelope["payload"]))
    payload["counter"] = 2
    envelope["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    with pytest.raises(AttestationFailure) as failed:
        _check(json.dumps(envelope).encode())
    assert failed.value.code == "bad_signature"


def _trail(body: bytes = RESPONSE) -> Trail:
    trail = Trail(SALTS, commit("request", SALTS.request, REQUEST))
    trail.answered(body)
    return trail


def test_the_gateway_refuses_a_counter_it_has_seen_from_that_key() -> None:
    attester = Attester("gpu", SIGNER.vkey, GatewayMetrics())
    first, again = _trail(), _trail()
    envelope = base64.b64encode(sign_statement(_statement(3), SIGNER))
    attester.judge(first, "req-1", envelope)
    attester.judge(again, "req-1", envelope)
    assert first.attestation is not None and first.attestation.failure is None
    assert first.countersignature is not None
    assert again.attestation == Attestation(str(SIGNER), failure="replayed")
    assert again.countersignature is None


def test_the_gateway_checks_the_bytes_it_relayed() -> None:
    attester = Attester("gpu", SIGNER.vkey, GatewayMetrics())
    changed = _trail(RESPONSE + b" ")
    attester.judge(changed, "req-1", base64.b64encode(sign_statement(_statement(), SIGNER)))
    assert changed.attestation == Attestation(str(SIGNER), failure="mismatch")
    unreadable = _trail()
    attester.judge(unreadable, "req-1", b"not base64!")
    assert unreadable.attestation == Attestation(str(SIGNER), failure="malformed")


def _dressed(envelope: bytes) -> bytes:
    """`envelope` with what its signature does not cover changed, as anyone on the path
    between gateway and sidecar could: unsigned members (one no canonical encoder takes)
    and its payload's JSON written another way."""
    value = json.loads(envelope)
    payload = json.loads(base64.b64decode(value["payload"]))
    value["payload"] = base64.b64encode(json.dumps(payload, indent=1).encode()).decode()
    value["signatures"][0]["note"] = "unsigned"
    value["extra"] = 2**70
    return json.dumps(value).encode()


def test_the_receipt_carries_only_what_the_backend_signed() -> None:
    attester = Attester("gpu", SIGNER.vkey, GatewayMetrics())
    trail = _trail()
    signed = sign_statement(_statement(5), SIGNER)
    attester.judge(trail, "req-1", base64.b64encode(_dressed(signed)))
    assert trail.attestation is not None and trail.attestation.failure is None
    assert trail.countersignature == signed  # rebuilt from what was verified
    receipt = make_receipt(
        Receipt("req-1", "log", 0, bytes(32), "gpu", "sha256:x", SALTS), seeded_signer("log")
    )
    sealed = asyncio.run(_sealed(trail, receipt))
    assert countersignature_of(sealed) == signed


async def _sealed(trail: Trail, receipt: bytes) -> bytes:
    trail.receipt = asyncio.get_running_loop().create_future()
    trail.receipt.set_result(receipt)
    found = await trail.sealed_receipt()
    assert found is not None
    return found


def test_a_receipt_whose_countersignature_nests_deep_fails_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = seeded_signer("log")
    receipt = make_receipt(Receipt("req-1", "log", 0, bytes(32), "gpu", "sha256:x", SALTS), log)
    value = json.loads(receipt)
    value["attestation"] = json.loads(_envelope_of(b"[" * 2900))
    path = tmp_path / "receipt.json"
    path.write_bytes(json.dumps(value).encode())
    argv = ["audit", "receipt", "verify", str(path), "--key", log.vkey]
    assert main([*argv, "--backend-key", f"gpu={SIGNER.vkey}"]) == 1
    assert "FAILED: countersignature payload is not JSON" in capsys.readouterr().err


STREAM = b'data: {"choices":[]}\n\n: keep-alive\n\ndata: [DONE]\n\n'
COMMENT = b": owngate-attest QUJD\n\n"


@pytest.mark.parametrize("cut", range(len(STREAM + COMMENT) + 1))
def test_the_attest_comment_is_taken_out_wherever_reads_split_it(cut: int) -> None:
    whole = STREAM + COMMENT
    tail = SseTail()
    relayed = tail.feed(whole[:cut]) + tail.feed(whole[cut:]) + tail.flush()
    assert relayed == STREAM
    assert tail.countersignature == b"QUJD"


ENDINGS = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}


@pytest.mark.parametrize("ending", ENDINGS.values(), ids=ENDINGS.keys())
def test_the_attest_comment_follows_any_sse_line_ending(ending: bytes) -> None:
    """The backend's stream may end its lines with LF, CRLF or a bare CR (SSE allows all
    three); the sidecar's comment follows the last one, wherever the reads split."""
    stream = b"data: {}" + ending + ending + b"data: [DONE]" + ending + ending
    whole = stream + COMMENT
    for cut in range(len(whole) + 1):
        for second in (cut, min(cut + 1, len(whole))):
            tail = SseTail()
            relayed = (
                tail.feed(whole[:cut])
                + tail.feed(whole[cut:second])
                + tail.feed(whole[second:])
                + tail.flush()
            )
            assert (relayed, tail.countersignature) == (stream, b"QUJD"), (cut, second)


@pytest.mark.parametrize("ending", ENDINGS.values(), ids=ENDINGS.keys())
def test_an_earlier_attest_comment_after_any_line_ending_is_removed(ending: bytes) -> None:
    """After a bare CR too, a comment that is not the last line is given back to the
    stream (and removed by the filter), and the sidecar's last one is the countersignature."""
    forged = b": owngate-attest Rk9SR0VE" + ending + ending
    stream = b"data: x" + ending + ending
    tail = SseTail()
    relayed = _relayed(tail, stream + forged + stream + COMMENT, [len(stream) + 3])
    assert b"owngate" not in relayed
    assert relayed.endswith(stream)
    assert tail.countersignature == b"QUJD"


def test_a_stream_without_the_comment_passes_whole() -> None:
    tail = SseTail()
    lookalike = b"data: x: owngate-attest no\n\n: owngate-att"
    assert tail.feed(lookalike[:20]) + tail.feed(lookalike[20:]) + tail.flush() == lookalike
    assert tail.countersignature is None


def _relayed(tail: SseTail, stream: bytes, cuts: list[int]) -> bytes:
    """What the private relay sends on: `tail`, then `CommentFilter`, read by read."""
    comments = CommentFilter()
    out, previous = [], 0
    for cut in [*cuts, len(stream)]:
        out.append(comments.feed(tail.feed(stream[previous:cut])))
        previous = cut
    return b"".join(out) + comments.feed(tail.flush()) + comments.flush()


def test_an_overlong_comment_is_not_a_countersignature() -> None:
    tail = SseTail()
    stream = b"data: [DONE]\n\n: owngate-attest " + b"A" * 10_000 + b"\n\n"
    assert _relayed(tail, stream, [5000]) == b"data: [DONE]\n\n\n"
    assert tail.countersignature == b"-"


FORGED = b": owngate-attest Rk9SR0VE\n\n"  # the inference server's, before the sidecar's


@pytest.mark.parametrize("cut", range(len(FORGED + STREAM + COMMENT) + 1))
def test_an_earlier_attest_comment_is_removed_and_the_stream_goes_on(cut: int) -> None:
    """A comment that is not the stream's last line is not the sidecar's: the stream after
    it still reaches the client (it used to be swallowed as the tail), the comment does not,
    and the countersignature is the last one's."""
    tail = SseTail()
    relayed = _relayed(tail, STREAM + FORGED + STREAM + COMMENT, [len(STREAM) + cut])
    assert relayed == STREAM + b"\n" + STREAM
    assert tail.countersignature == b"QUJD"


@pytest.mark.parametrize(
    "forged",
    [FORGED + b"data: x\n\n", b": owngate-attest Rk9S\r\rdata: x\n\n", FORGED + b"data"],
    ids=["followed", "cr", "unended-after"],
)
def test_a_comment_that_does_not_end_the_stream_is_no_countersignature(forged: bytes) -> None:
    tail = SseTail()
    relayed = _relayed(tail, STREAM + forged, [len(STREAM) + 3])
    assert b"owngate" not in relayed
    assert relayed.startswith(STREAM) and b"data" in relayed[len(STREAM) :]
    assert tail.countersignature == b"-"


def _completion(**fields: object) -> dict[str, object]:
    return completion_record(
        request_id="req-1",
        time=datetime(2026, 1, 1, tzinfo=UTC),
        dispatch=LogEntry(0, hashlib.sha256(b"d").digest()),
        status=200,
        error=None,
        usage=None,
        latency_ms=3,
        response_commitment=commit("response", SALTS.response, RESPONSE),
        **fields,  # type: ignore[arg-type]
    )


def test_completion_records_with_and_without_the_new_fields_are_valid() -> None:
    plain = _completion()
    assert "attestation" not in plain and "upstream" not in plain
    validate_record(plain)  # a record written before these fields existed
    counter = check_countersignature(
        sign_statement(_statement(5), SIGNER),
        SIGNER.verifier(),
        request_id="req-1",
        request_commitment=commit("request", SALTS.request, REQUEST),
        response_commitment=commit("response", SALTS.response, RESPONSE),
    )
    ids = UpstreamIds.of("chatcmpl-1", [("X-Request-Id", "req_abc")])
    attested = _completion(attestation=Attestation.accepted(counter), upstream=ids)
    validate_record(attested)
    dispatch = {"request_commitment": commit("request", SALTS.request, REQUEST)}
    rebuilt = statement_of_records(dispatch, attested)
    assert rebuilt is not None and rebuilt[0] == _statement(5)
    failed = _completion(attestation=Attestation(str(SIGNER), failure="missing"))
    validate_record(failed)
    assert statement_of_records(dispatch, failed) is None
    broken = {**failed, "attestation": {**failed["attestation"], "failure": "other"}}  # type: ignore[dict-item]
    with pytest.raises(RecordError, match="attestation"):
        validate_record(broken)
    with pytest.raises(RecordError):
        Attestation(str(SIGNER), counter=1, failure="missing")


def test_only_allow_listed_id_shaped_upstream_ids_are_kept() -> None:
    ids = UpstreamIds.of(
        "msg_01" + "x" * 200,  # too long: dropped
        [
            ("Request-Id", "req_1"),
            ("x-request-id", "has space"),  # not an id: dropped
            ("set-cookie", "secret"),  # not on the list
            ("request-id", "req_2"),  # a repeat: the first kept
        ],
    )
    assert ids == UpstreamIds(None, (("request-id", "req_1"),))
    assert UpstreamIds.of(None, [("server", "x")]) is None


def test_the_sidecar_command_wants_its_backend_key_and_log(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("BACKEND", "KEY", "LOG", "LISTEN"):
        monkeypatch.delenv(f"OWNGATE_ATTEST_{name}", raising=False)
    assert main(["attest", "--backend", "http://127.0.0.1:8000"]) == 2
    assert "--key, --log" in capsys.readouterr().err
    assert (
        main(["attest", "--listen", "nowhere", "--backend", "x", "--key", "k", "--log", "l"]) == 2
    )


_MUTUAL = ["--tls-cert", "c.pem", "--tls-key", "k.pem", "--client-ca", "ca.pem"]


@pytest.mark.parametrize(
    ("tls", "code", "said"),
    [
        (["--tls-cert", "c.pem"], 2, "--tls-cert and --tls-key go together"),
        (["--tls-key", "k.pem"], 2, "--tls-cert and --tls-key go together"),
        (["--client-ca", "ca.pem"], 2, "--client-ca needs them"),
        (["--tls-cert", "missing.pem", "--tls-key", "missing-key.pem"], 1, "TLS files not usable"),
        # a pin without --client-ca would pin nothing; a pin of another shape no key has
        (["--client-pin", "sha256//" + "A" * 43 + "="], 2, "needs --client-ca"),
        (["--client-pin", "sha256//AAAA", *_MUTUAL], 2, "--client-pin is sha256//"),
        (["--client-pin", "AAAA" * 10 + "AAA=", *_MUTUAL], 2, "--client-pin is sha256//"),
        # the digest in hex (either case), unpadded or URL-safe base64, another prefix:
        # each is refused, never a pin that matches no key
        (["--client-pin", "sha256//" + "ab" * 32, *_MUTUAL], 2, "--client-pin is sha256//"),
        (["--client-pin", "sha256//" + "AB" * 32, *_MUTUAL], 2, "--client-pin is sha256//"),
        (["--client-pin", "sha256//" + "A" * 43, *_MUTUAL], 2, "--client-pin is sha256//"),
        (["--client-pin", "sha256//" + "_" * 43 + "=", *_MUTUAL], 2, "--client-pin is sha256//"),
        (["--client-pin", "SHA256//" + "A" * 43 + "=", *_MUTUAL], 2, "--client-pin is sha256//"),
        (["--client-pin", "sha256// " + "A" * 43 + "=", *_MUTUAL], 2, "--client-pin is sha"),
    ],
)
def test_the_sidecar_command_wants_its_tls_files_together_and_usable(
    tls: list[str],
    code: int,
    said: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    for name in ("TLS_CERT", "TLS_KEY", "CLIENT_CA", "CLIENT_PIN"):
        monkeypatch.delenv(f"OWNGATE_ATTEST_{name}", raising=False)
    monkeypatch.chdir(tmp_path)
    base = ["attest", "--backend", "http://127.0.0.1:8000", "--key", "k", "--log", "l"]
    assert main([*base, *tls]) == code  # refused before it opens a key or binds a port
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag",
    [
        ["--flush-ms", "-1"],
        ["--checkpoint-ms", "0"],
        # NaN passes every comparison's `not`: the log's committer would spin on a
        # checkpoint that is never due; infinity overflows the flush timer
        ["--flush-ms", "nan"],
        ["--checkpoint-ms", "nan"],
        ["--flush-ms", "inf"],
        ["--checkpoint-ms", "inf"],
        # the bodies held at once must hold at least one whole body
        ["--max-body-bytes", "4096", "--max-held-body-bytes", "4095"],
        # ... and the whole answers held at once at least one whole answer
        ["--max-body-bytes", "4096", "--max-held-answer-bytes", "4095"],
    ],
)
def test_the_sidecar_command_wants_a_sane_log_cadence(
    flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["attest", "--backend", "http://127.0.0.1:8000", "--key", "k", "--log", "l"]
    assert main([*base, *flag]) == 2  # refused before it opens a key or binds a port
    assert "a bad --listen or number" in capsys.readouterr().err


def test_an_accepted_countersignature_reaches_the_receipt_whatever_else_its_envelope_held() -> None:
    """The signature covers the statement, not the envelope around it: an attested backend
    whose envelope carries an extra member JSON cannot re-encode (an integer past 64 bits,
    a lone surrogate) still has it accepted, and the client's receipt must not then fail
    to be built (it raised in `Trail.sealed_receipt`: a 500 after the answer was relayed)."""
    log = seeded_signer("log")
    receipt = Receipt("req-1", "log", 1, bytes(32), "gpu", "sha256:" + "ab" * 32, SALTS)
    for extra in (10**30, "\ud800"):
        attester = Attester("gpu", SIGNER.vkey, GatewayMetrics())
        envelope = {**json.loads(sign_statement(_statement(5), SIGNER)), "x": extra}
        trail = _trail()
        attester.judge(trail, "req-1", base64.b64encode(json.dumps(envelope).encode()))
        assert trail.attestation is not None and trail.attestation.failure is None

        async def sealed(trail: Trail = trail) -> bytes | None:
            signed: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
            signed.set_result(make_receipt(receipt, log))
            trail.receipt = signed
            return await trail.sealed_receipt()

        carried = asyncio.run(sealed())
        assert carried is not None and verify_receipt(carried, [log.verifier()]) == receipt
        found = receipt_countersignature(carried, receipt, {"gpu": SIGNER.verifier()})
        assert found is not None and found.counter == 5


def test_a_receipts_countersignature_holding_what_its_signature_does_not_cover_is_refused() -> None:
    """The gateway writes a receipt's `attestation` afresh (canonical payload and base64,
    one signature, no other member), so anything else in it was added by whoever held
    the receipt, unsigned: `audit receipt verify --backend-key` refuses it, as it refuses
    a receipt with members or encodings of its own other than the log signed. It
    accepted them, and the auditor's copy then carried text neither party signed."""
    log = seeded_signer("log")
    receipt = Receipt("req-1", "log", 1, bytes(32), "gpu", "sha256:" + "ab" * 32, SALTS)
    genuine = json.loads(sign_statement(_statement(5), SIGNER))
    keys = {"gpu": SIGNER.verifier()}

    def carried(attestation: dict[str, object]) -> bytes:
        value = json.loads(make_receipt(receipt, log))
        return json.dumps({**value, "attestation": attestation}).encode()

    found = receipt_countersignature(carried(genuine), receipt, keys)
    assert found is not None and found.counter == 5  # the genuine one, re-encoded: fine
    payload = base64.b64decode(genuine["payload"])
    sig = genuine["signatures"][0]["sig"]
    loose = base64.b64encode(json.dumps(json.loads(payload), indent=1).encode()).decode()
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    low_bits = sig[:-3] + alphabet[alphabet.index(sig[-3]) ^ 1] + sig[-2:]  # unused bits
    assert base64.b64decode(low_bits) == base64.b64decode(sig) and low_bits != sig
    for forged in (
        {**genuine, "note": "served in eu-west-1"},  # a member nobody signed
        {**genuine, "signatures": [{**genuine["signatures"][0], "note": "x"}]},
        {**genuine, "payload": loose},  # the signed statement, not its JCS bytes
        {**genuine, "signatures": [{**genuine["signatures"][0], "sig": low_bits}]},
    ):
        with pytest.raises(MalformedError, match="not the envelope the gateway writes"):
            receipt_countersignature(carried(forged), receipt, keys)


def test_an_id_litellm_made_up_is_not_recorded_as_the_providers() -> None:
    """LiteLLM names an answer `chatcmpl-<random UUID>` when the provider's has no id, or
    one it does not carry over (Anthropic's `msg_...`): an auditor would look for it in
    the provider's usage export in vain. It is recorded as missing; the provider's own
    ids (OpenAI's `chatcmpl-` and 29 letters, vLLM's UUID without hyphens) are kept."""

    class Answer:
        def __init__(self, id: str | None) -> None:
            self.id = id
            self._hidden_params = {"additional_headers": {"llm_provider-request-id": "req_1"}}

    made_up = Answer("chatcmpl-" + str(uuid.UUID(bytes=bytes(range(16)), version=4)))
    assert UpstreamIds.of(*provider_ids(made_up, made_up)) == UpstreamIds(
        None, (("request-id", "req_1"),)
    )
    for kept in ("chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT", "chatcmpl-" + "0f" * 16, "msg_01XF"):
        answer = Answer(kept)
        assert UpstreamIds.of(*provider_ids(answer, answer)) == UpstreamIds(
            kept, (("request-id", "req_1"),)
        )


def test_the_request_id_litellm_copies_is_not_recorded_as_a_providers_header() -> None:
    """LiteLLM keeps the provider's headers as `llm_provider-<name>` and adds a
    `request-id` of its own, a copy of `x-request-id`: the record said the provider sent
    a `request-id` header it never sent. The headers LiteLLM received are used where it
    keeps them (`_response_headers`); from its copies, a `request-id` equal to the
    `x-request-id` is left out. A provider's own `request-id` (Anthropic's) is kept."""

    class Answer:
        def __init__(self, received: dict[str, str] | None, copies: dict[str, str]) -> None:
            self.id = "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT"
            self._response_headers = received
            self._hidden_params = {"additional_headers": copies}

    copies = {
        "llm_provider-x-request-id": "req_x",
        "llm_provider-request-id": "req_x",
        "request-id": "req_x",
    }
    only_x = UpstreamIds("chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT", (("x-request-id", "req_x"),))
    for answer in (Answer({"x-request-id": "req_x", "server": "s"}, copies), Answer(None, copies)):
        assert UpstreamIds.of(*provider_ids(answer, answer)) == only_x
    anthropic = Answer(None, {"llm_provider-request-id": "req_a", "request-id": "req_a"})
    assert UpstreamIds.of(*provider_ids(anthropic, anthropic)) == UpstreamIds(
        "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT", (("request-id", "req_a"),)
    )
    both = Answer({"x-request-id": "req_x", "request-id": "req_r"}, copies)
    assert UpstreamIds.of(*provider_ids(both, both)) == UpstreamIds(
        "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
        (("request-id", "req_r"), ("x-request-id", "req_x")),
    )


@pytest.mark.parametrize(
    "name", ["MAX_BODY_BYTES", "MAX_HELD_ANSWER_BYTES", "FLUSH_MS", "CHECKPOINT_MS"]
)
def test_a_bad_number_in_the_sidecars_environment_is_a_usage_error(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 naming the flag, not a traceback (also from `owngate --help`, which builds
    every command's parser)."""
    monkeypatch.setenv(f"OWNGATE_ATTEST_{name}", "abc")
    base = ["attest", "--backend", "http://127.0.0.1:8000", "--key", "k", "--log", "l"]
    with pytest.raises(SystemExit) as caught:
        main(base)
    assert caught.value.code == 2
    assert f"--{name.lower().replace('_', '-')}" in capsys.readouterr().err
    monkeypatch.setenv(f"OWNGATE_ATTEST_{name}", "-1")
    assert main(base) == 2  # parsed, then refused as before
