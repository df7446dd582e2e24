"""A hostile witness (or whoever answers in its place on the network) against the gateway's
witness client and cosigning: answers framed to be read forever, hundreds of lines to
verify, cosignatures dated far from the request (a replayed answer), redirects, a witness
that drips or says nothing, and the gateway as `owngate serve` beside one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.provenance import MalformedError, ProvenanceLog, SignatureError, write_signing_key
from gateway.provenance.formats import cosignature as cosignature_module
from gateway.provenance.formats import note as note_module
from gateway.provenance.formats.cosignature import CosignatureVerifier, attach_cosignatures
from gateway.provenance.formats.layout import list_cosigned
from gateway.provenance.testing import log_request
from gateway.provenance.witness.client import MAX_RESPONSE, WitnessClient, request_cosignature
from gateway.provenance.witness.witness import WitnessError
from gateway.provenance.writer.cosignature_collector import Cosigning
from tests.helpers.gateways import ADMIN_HEADERS, readiness
from tests.helpers.hostile_witness import HostileWitness
from tests.helpers.loop_turns import with_turns_beside
from tests.helpers.processes import KEY, GatewayProcess
from tests.helpers.waiting import until
from tests.helpers.witness_rig import (  # the fixture is used by name
    COSIGNER,
    LOG_SIGNER,
    NOW,
    ORIGIN,
    RealLog,
    Refusal,
    open_witness,
    real_log,
)

__all__ = ["real_log"]

Send = Callable[[bytes], bool]


def _body(note: bytes) -> str:
    return note.decode().split("\n\n")[0] + "\n"


def _answer_200(line: bytes) -> Callable[[Send], None]:
    def answer(send: Send) -> None:
        send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(line) + line)

    return answer


# --- what frames an answer ---------------------------------------------------------------------


def _header_lines(send: Send) -> None:
    send(b"HTTP/1.1 200 OK\r\n")
    for n in range(99):  # under the 100-header count, 7 KB each: 690 KB were read and kept
        if not send(b"x-%d: " % n + b"v" * 7000 + b"\r\n"):
            return


def _chunk_extensions(send: Send) -> None:
    send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    for _ in range(1000):  # 1-byte chunks, each behind 7 KB of extension: 7 MB of framing
        if not send(b"1;" + b"e" * 7000 + b"\r\na\r\n"):
            return


def _long_header(send: Send) -> None:
    send(b"HTTP/1.1 200 OK\r\nx-long: " + b"v" * 60_000 + b"\r\n")


@pytest.mark.parametrize(
    "answer",
    [_header_lines, _chunk_extensions, _long_header],
    ids=["header-lines", "chunk-extensions", "long-header-line"],
)
def test_what_frames_an_answer_counts_against_its_bound(
    real_log: RealLog, answer: Callable[[Send], None]
) -> None:
    # Only the body was bounded (64 KiB): headers and chunk-size lines of up to 64 KiB each
    # were read, and kept (headers), until the timeout: megabytes over the gateway's event
    # loop for every attempt. Now the whole answer is within MAX_ANSWER, a line MAX_LINE.
    async def scenario() -> str:
        with HostileWitness(answer) as witness, Refusal("unavailable") as caught:
            await request_cosignature(witness.url, 0, [], real_log.notes[1], timeout=4)
        return str(caught.error)

    error = asyncio.run(scenario())
    assert "larger than" in error or "longer than" in error, error


# --- the lines of an answer ----------------------------------------------------------------------


def test_an_answer_of_many_lines_costs_one_signature_check(
    real_log: RealLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every line by the witness was verified: the ~500 a 64 KiB answer holds took 60-90 ms
    # of the gateway's event loop, at every checkpoint. Only the newest is kept, and checked
    # (and an answer now holds at most 100 lines).
    note = real_log.notes[2]
    answer = b"".join(COSIGNER.cosign(_body(note), NOW - n).line().encode() for n in range(100))
    checks = 0
    verify = CosignatureVerifier.verify

    def counted(self: CosignatureVerifier, text: str, cosignature: object) -> None:
        nonlocal checks
        checks += 1
        verify(self, text, cosignature)  # type: ignore[arg-type]

    monkeypatch.setattr(CosignatureVerifier, "verify", counted)
    cosigned = attach_cosignatures(note, answer, COSIGNER.vkey, now=NOW)
    assert cosigned == note + COSIGNER.cosign(_body(note), NOW).line().encode()
    assert checks == 1


def test_an_answer_of_more_lines_than_a_note_holds_is_refused_unparsed(
    real_log: RealLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 4,000 short lines by other keys fit in 64 KiB; parsing each took 50 ms of the event
    # loop in all, at every attempt. A note holds at most 100 signature lines: an answer
    # with more is refused before any is parsed.
    note = real_log.notes[2]
    line = COSIGNER.cosign(_body(note), NOW).line().encode()
    answer = "\u2014 x AAAAAAAA\n".encode() * 4000 + line
    assert len(answer) < MAX_RESPONSE
    parsed = 0
    parse = note_module._parse_signature_line

    def counted(text: str) -> object:
        nonlocal parsed
        parsed += 1
        return parse(text)

    monkeypatch.setattr(cosignature_module, "_parse_signature_line", counted)
    with pytest.raises(MalformedError, match="more than 100 lines"):
        attach_cosignatures(note, answer, COSIGNER.vkey, now=NOW)
    assert parsed == 0
    few = "\u2014 x AAAAAAAA\n".encode() * 99 + line
    assert attach_cosignatures(note, few, COSIGNER.vkey, now=NOW) == note + line


def test_only_the_newest_line_is_kept_and_it_must_verify(real_log: RealLog) -> None:
    note = real_log.notes[2]
    good = COSIGNER.cosign(_body(note), NOW - 10).line().encode()
    bad = COSIGNER.cosign(_body(real_log.notes[1]), NOW).line().encode()  # another checkpoint
    with pytest.raises(SignatureError):  # the newest is another checkpoint's: refused
        attach_cosignatures(note, good + bad, COSIGNER.vkey, now=NOW)
    older_bad = COSIGNER.cosign(_body(real_log.notes[1]), NOW - 20).line().encode()
    assert attach_cosignatures(note, older_bad + good, COSIGNER.vkey, now=NOW) == note + good


# --- the time of a cosignature ---------------------------------------------------------------


def _cosign_once(tmp_path: Path, answer_for: Callable[[bytes], bytes]) -> tuple[bool, str]:
    """One round of the gateway's cosigning, at NOW, against a witness answering
    `answer_for(note)`: whether it cosigned, and the error it shows."""

    async def scenario() -> tuple[bool, str]:
        log = await ProvenanceLog.open(tmp_path / "log", ORIGIN, LOG_SIGNER)
        try:
            for n in range(3):
                await log_request(log, n)
            latest = await log.checkpoint()
            line = answer_for(latest.note)
            with HostileWitness(_answer_200(line)) as witness:
                client = WitnessClient(witness.url, COSIGNER.vkey, timeout=5, clock=lambda: NOW)
                cosigning = Cosigning(log, tmp_path / "log", [client])
                status = cosigning.witnesses[0]
                done = await cosigning.cosign_once(client, status, latest)
        finally:
            await log.close()
        return done, status.last_error or ""

    return asyncio.run(scenario())


def test_a_replayed_answer_is_refused_and_nothing_stored(tmp_path: Path) -> None:
    # The witness really cosigned this checkpoint, an hour ago; a gateway restarted since
    # asks again, and whoever sits in front of the witness replays the old answer. It was
    # taken as the witness's fresh word (`ok`, the witness never reached).
    def replayed(note: bytes) -> bytes:
        with open_witness(tmp_path / "witness.json", NOW - 3600) as witness:
            return witness.add_checkpoint(0, [], note)

    done, error = _cosign_once(tmp_path, replayed)
    assert not done and "dated" in error and "replayed" in error
    assert list_cosigned(tmp_path / "log") == []


@pytest.mark.parametrize(
    ("offset", "accepted"),
    [(-NOW, False), (-3600, False), (-200, True), (30, True), (200, False), (3600, False)],
    ids=["epoch", "hour-before", "skew-before", "skew-after", "minutes-ahead", "hour-ahead"],
)
def test_a_cosignature_is_dated_near_its_request(
    tmp_path: Path, offset: int, accepted: bool
) -> None:
    # Up to 300 s ahead was stored: an auditor whose clock is a little behind the gateway's
    # then failed `audit verify` on that file (its future skew is 300 s too). Ahead, the
    # gateway now allows 60 s; before the request, 300 s.
    done, error = _cosign_once(
        tmp_path, lambda note: COSIGNER.cosign(_body(note), NOW + offset).line().encode()
    )
    assert done is accepted, error
    assert len(list_cosigned(tmp_path / "log")) == int(accepted)


# --- redirects, drips and silence ------------------------------------------------------------


def test_a_redirect_is_not_followed(real_log: RealLog) -> None:
    line = COSIGNER.cosign(_body(real_log.notes[1]), NOW).line().encode()

    async def scenario() -> tuple[str, str, int]:
        with HostileWitness(_answer_200(line)) as elsewhere:
            location = f"{elsewhere.url}/add-checkpoint".encode()

            def redirect(send: Send) -> None:
                send(b"HTTP/1.1 307 Temporary Redirect\r\nlocation: " + location)
                send(b"\r\ncontent-length: 0\r\n\r\n")

            with HostileWitness(redirect) as witness, Refusal("unavailable") as caught:
                await request_cosignature(witness.url, 0, [], real_log.notes[1], timeout=4)
            return str(caught.error), location.decode(), elsewhere.connections

    error, location, connections = asyncio.run(scenario())
    assert connections == 0 and "307" in error and location not in error


def _drip(send: Send) -> None:
    # 141 bytes 0.1 s apart: 14 s for a client whose timeout is per read, far past the
    # bound below, which leaves a busy machine 9 s of slack over the 1 s timeout.
    for byte in b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b"x" * 100:
        if not send(bytes([byte])):
            return
        time.sleep(0.1)


@pytest.mark.parametrize("answer", [_drip, lambda send: None], ids=["drip", "silent"])
def test_a_slow_or_silent_witness_costs_its_timeout_not_the_loop(
    real_log: RealLog, answer: Callable[[Send], None]
) -> None:
    # Bounded by the client's timeout, and the event loop keeps turning meanwhile.
    async def ask(url: str) -> WitnessError | None:
        try:
            await request_cosignature(url, 0, [], real_log.notes[1], timeout=1)
        except WitnessError as error:
            return error
        return None

    async def scenario() -> tuple[WitnessError | None, int, float]:
        with HostileWitness(answer) as witness:
            started = time.monotonic()
            error, turns = await with_turns_beside(ask(witness.url))
            return error, turns, time.monotonic() - started

    error, turns, elapsed = asyncio.run(scenario())
    assert error is not None and error.code == "unavailable" and "within 1s" in str(error)
    assert 0.9 < elapsed < 10 and turns > 100


# --- the gateway beside a hostile witness ---------------------------------------------------


def test_the_gateway_serves_beside_a_flooding_witness_and_says_why(
    process: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    origin = "test.owngate/hostile-witness"
    write_signing_key(tmp_path / "log.key", origin)
    with HostileWitness(_chunk_extensions) as witness:
        gateway = process(
            provenance={
                "dir": "log",
                "origin": origin,
                "signing_key_file": "log.key",
                "checkpoint_interval_ms": 100,
                "witnesses": [{"url": witness.url, "vkey": COSIGNER.vkey, "timeout_s": 3}],
                "witness_retry_max_s": 0.5,
            }
        ).start()
        body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
        with httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {KEY}"}) as c:
            for _ in range(5):
                assert c.post("/v1/chat/completions", json=body, timeout=10).status_code == 200

        def detail() -> dict[str, object]:
            (shown,) = readiness(gateway.url)["witnesses"]["witnesses"].values()
            assert isinstance(shown, dict)
            return shown

        until(lambda: bool(detail()["failures"]), "a failed cosigning", timeout=20)
        shown = detail()
        error = str(shown["last_error"])
        assert shown["state"] == "degraded" and shown["cosigned_size"] is None
        assert ("larger than" in error or "longer than" in error) and error.isprintable()
        assert shown["last_failure"] == "bad_answer"
        metrics = httpx.get(f"{gateway.url}/metrics", headers=ADMIN_HEADERS).text
        assert 'owngate_witness_failures_total{reason="bad_answer",witness="' in metrics
        gateway.stop()
    assert list_cosigned(tmp_path / "log") == []
