"""The data-class header spelled with `_` for `-`, against a real `owngate serve`.

CGI and WSGI (`HTTP_X_DATA_CLASS`), nginx with `underscores_in_headers on` and other
proxies read `x_data_class` and `x-data-class` as one header, so a client (or the proxy
in front of the gateway) that sends `x_data_class: phi` believes the request is PHI. A
gateway that read it as "no label" would let that PHI prompt take the hosted fallback
when the private backend is down: the spelling is refused (400 `unknown_data_class`) on
every proxied path, streaming or not, and nothing reaches the hosted provider.

The rig is the fuzz suite's (`tests/helpers/fuzz_rig.py`): tenant `open` may fall back to
`hosted-open` unless the request is PHI, and model `g`'s private backend is down.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.helpers.fuzz_inputs import complete_request
from tests.helpers.fuzz_rig import POLICIES, Backends, fuzz_gateway, start_backends
from tests.helpers.processes import GatewayProcess
from tests.helpers.raw_http import exchange, openai_error

SPELLINGS = [b"x_data_class", b"X_DATA_CLASS", b"x-data_class", b"x_data-class"]
ASKS: list[tuple[bytes, dict[str, object], bool | None]] = [
    (b"/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, False),
    (b"/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, True),
    (b"/v1/completions", {"prompt": "hi"}, False),
    (b"/v1/completions", {"prompt": "hi"}, True),
    (b"/v1/embeddings", {"input": "hi"}, None),
]


@pytest.fixture(scope="module")
def backends() -> Iterator[Backends]:
    yield from start_backends()


@pytest.fixture(scope="module")
def gateway(
    backends: Backends, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    process = fuzz_gateway(tmp_path_factory.mktemp("spellings"), backends, POLICIES, ("open",))
    try:
        yield process.start()
    finally:
        process.stop()


def ask(
    gateway: GatewayProcess,
    path: bytes,
    fields: dict[str, object],
    stream: bool | None,
    lines: list[bytes],
) -> tuple[int, dict[str, Any] | None]:
    doc: dict[str, object] = {"model": "g", "max_tokens": 2, **fields}
    if stream is not None:
        doc["stream"] = stream
    raw = complete_request("open", orjson.dumps(doc), lines, path=path)
    outcome = exchange(gateway.port, raw, half_close=False, timeout_s=120)
    assert len(outcome.final) == 1, outcome.describe()
    response = outcome.final[0]
    return response.status, openai_error(response)


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_label_header_spelled_with_underscores_is_refused_never_read_as_no_label(
    gateway: GatewayProcess, backends: Backends, spelling: bytes
) -> None:
    for path, fields, stream in ASKS:
        before = backends.hosted.posts
        status, error = ask(gateway, path, fields, stream, [spelling + b": phi"])
        assert backends.hosted.posts == before, (path, stream, "a PHI prompt went hosted")
        assert status == 400 and error is not None, (path, stream, status)
        assert (error["code"], error["param"]) == ("unknown_data_class", "x-data-class")
        # Beside a correct copy too: the two spellings are one header to a proxy.
        status, error = ask(
            gateway, path, fields, stream, [b"x-data-class: phi", spelling + b": phi"]
        )
        assert status == 400 and error is not None and error["code"] == "unknown_data_class"
        assert backends.hosted.posts == before


def test_other_header_names_are_not_labels(gateway: GatewayProcess, backends: Backends) -> None:
    """Only the label header's own look-alike is refused: names that merely contain it, or
    use `_` elsewhere, are other headers (unlabelled `g` takes the hosted fallback)."""
    for name in (b"x_data_classes", b"x_data_class_2", b"data_class", b"x__data_class"):
        before = backends.hosted.posts
        status, _error = ask(gateway, *ASKS[0], [name + b": phi"])
        assert status == 200 and backends.hosted.posts == before + 1, name
