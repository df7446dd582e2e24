"""`owngate audit` copying a log by URL: the lookup of the log server's name is held to
the per-file deadline, as the rest of each GET is (gateway/provenance/audit/remote_socket.py).

urllib's connection looked the name up with a blocking `getaddrinfo` before any socket
existed, so the watchdog that shuts a GET's socket down at its deadline had nothing to
shut: a log URL whose DNS server swallows queries held the copy for the resolver's own
timeouts (for ever, for one that never answers), past `--file-deadline` and
`--copy-deadline`. Here a resolver that hangs (the lookup function patched; no socket is
opened) is given up at the deadline and the copy fails naming it, while the lookup
still hangs.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from gateway.provenance.audit.remote import FetchLimits, mirror_log

DEADLINE_S = 0.3
WAIT_S = 60.0  # bounds a hang only: a copy waiting on the lookup fails the test here


class _HungResolver:
    """`getaddrinfo` for the log's host that hangs until `release` (then fails, as a
    resolver's timeout does); every other name resolved as usual."""

    def __init__(self, host: str) -> None:
        self._host = host
        self._real = socket.getaddrinfo
        self.asked = threading.Event()
        self.release = threading.Event()

    def __call__(self, host: Any, *args: Any, **kwargs: Any) -> Any:
        if host != self._host:
            return self._real(host, *args, **kwargs)
        self.asked.set()
        self.release.wait(WAIT_S * 2)  # bounded: a failed test's lookup ends too
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")


@pytest.fixture
def hung(monkeypatch: pytest.MonkeyPatch) -> Any:
    resolver = _HungResolver("log.owngate-test.invalid")
    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    yield resolver
    resolver.release.set()


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_log_server_name_whose_lookup_hangs_is_given_up_at_the_deadline(
    hung: _HungResolver, tmp_path: Path, scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)  # the lookup is the log server's own
    raised: list[BaseException] = []
    limits = FetchLimits(read_timeout_s=WAIT_S * 2, file_deadline_s=DEADLINE_S)

    def run() -> None:
        try:
            mirror_log(f"{scheme}://log.owngate-test.invalid:8443/log/", tmp_path, limits=limits)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            raised.append(exc)

    copying = threading.Thread(target=run, daemon=True)
    copying.start()
    copying.join(WAIT_S)
    assert hung.asked.is_set()
    assert not copying.is_alive(), "the copy waited on its name lookup past the deadline"
    assert not hung.release.is_set()  # the lookup itself still hangs: it was given up
    assert len(raised) == 1 and isinstance(raised[0], OSError), raised
    assert f"not received whole within {DEADLINE_S:g} s" in str(raised[0])


@pytest.fixture
def unanswered(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The log's name resolving to several addresses whose connects hang: a listener whose
    accept queue is full (one connection queued, never accepted), so the kernel drops
    every further SYN and a connect waits for its timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port))  # the queue's one place
    real = socket.getaddrinfo

    def resolve(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "log.owngate-test.invalid":
            return real(host, *args, **kwargs)
        peer = ("127.0.0.1", port)
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", peer)] * 4

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    yield
    filler.close()
    listener.close()


def test_a_log_server_whose_addresses_never_answer_a_connect_is_given_up_at_the_deadline(
    unanswered: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, each address's connect took the read timeout (here 120 s), unwatched: the
    socket was held only once connected."""
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    raised: list[BaseException] = []
    limits = FetchLimits(read_timeout_s=WAIT_S * 2, file_deadline_s=DEADLINE_S)

    def run() -> None:
        try:
            mirror_log("http://log.owngate-test.invalid/log/", tmp_path, limits=limits)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            raised.append(exc)

    copying = threading.Thread(target=run, daemon=True)
    copying.start()
    copying.join(WAIT_S)
    assert not copying.is_alive(), "the copy waited on a connect past the deadline"
    assert len(raised) == 1 and isinstance(raised[0], OSError), raised
    assert f"not received whole within {DEADLINE_S:g} s" in str(raised[0])
