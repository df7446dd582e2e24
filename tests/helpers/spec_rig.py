"""What the from-the-spec verifier's tests send a real gateway (tests/helpers/admin.py's
`serve_admin`): a chat request as exact bytes, the receipt as a client reads it, and the
served checkpoint once it reaches a size, the served log's tree."""

from __future__ import annotations

import httpx

from tests.helpers import spec_receipts as receipts
from tests.helpers import spec_tiles as tiles
from tests.helpers import spec_verifier as spec
from tests.helpers.admin import ORIGIN, TOKENS, Served
from tests.helpers.processes import KEY
from tests.helpers.waiting import until

__all__ = ["chat", "client_receipt", "served_tree", "settle"]


def chat(served: Served, stream: bool, n: int) -> tuple[bytes, httpx.Response]:
    sent = b'{"model":"m","messages":[{"role":"user","content":"spec %d"}],"stream":%s}' % (
        n,
        b"true" if stream else b"false",
    )
    answer = httpx.post(
        f"{served.process.url}/v1/chat/completions",
        headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"},
        content=sent,
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    return sent, answer


def client_receipt(answer: httpx.Response) -> tuple[bytes, bytes]:
    """(the body the client commits to, the receipt), as the docs tell a client."""
    if answer.headers["content-type"].startswith("text/event-stream"):
        return receipts.stream_receipt(answer.content)
    return answer.content, spec.b64(answer.headers["x-owngate-receipt"])


def settle(served: Served, size: int) -> bytes:
    """The served checkpoint once it is at `size` (nothing else is being logged)."""
    fetch = tiles.from_url(f"{served.admin}/log/", TOKENS["auditor"])
    until(
        lambda: fetch("checkpoint").body.split(b"\n")[1] == b"%d" % size,
        f"the served checkpoint at {size} entries",
        timeout=20,
    )
    return fetch("checkpoint").body


def served_tree(served: Served, origin: str = ORIGIN) -> tiles.Tree:
    """The served log's tree as the auditor reads it over the admin API (`origin`, the
    served key's), every tile checked and the root recomputed."""
    fetch = tiles.from_url(f"{served.admin}/log/", TOKENS["auditor"])
    return tiles.read_tree(fetch, [spec.parse_key(served.vkey)], origin)
