"""Every answer of the admin listener carries security headers, not only the console's
assets (gateway/admin/headers.py): `nosniff`, a Content-Security-Policy that sandboxes
the answer and lets it run no script, no caching unless the route chose otherwise, no
framing. The audit report's HTML, an attachment that a browser could still be made to
show, and which an auditor opens from disk, also carries its own policy as a meta tag."""

from __future__ import annotations

import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest

from gateway.admin.limits import MAX_BODY_BYTES
from gateway.provenance.audit.report_html import render_html
from tests.helpers.admin import Served, bearer, serve_admin


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve_admin(tmp_path_factory.mktemp("admin-headers")) as gateway:
        yield gateway


def _directives(policy: str) -> dict[str, str]:
    found = {}
    for part in policy.split(";"):
        name, _, value = part.strip().partition(" ")
        if name:
            found[name] = value.strip()
    return found


def _runs_nothing(policy: str) -> None:
    """A policy under which no script runs and nothing is fetched."""
    rules = _directives(policy)
    assert rules.get("default-src") == "'none'", policy
    assert "script-src" not in rules, policy  # default-src 'none' applies
    assert "connect-src" not in rules, policy
    assert rules.get("base-uri") == "'none'", policy
    assert rules.get("form-action") == "'none'", policy


def _api_headers(answer: httpx.Response) -> None:
    what = f"{answer.request.method} {answer.request.url.path} -> {answer.status_code}"
    assert answer.headers.get("x-content-type-options") == "nosniff", what
    policy = answer.headers.get("content-security-policy")
    assert policy is not None, what
    _runs_nothing(policy)
    rules = _directives(policy)
    assert "sandbox" in rules and rules["sandbox"] == "", what  # an opaque origin: no token
    assert rules.get("frame-ancestors") == "'none'", what
    assert answer.headers.get("x-frame-options") == "DENY", what


def test_every_api_answer_carries_the_headers(served: Served) -> None:
    admin = served.admin
    answers = [
        served.get("/admin/v1/whoami", "auditor"),
        served.get("/admin/v1/whoami"),  # 401
        served.get("/admin/v1/status", "auditor"),  # 403
        served.get("/admin/v1/nowhere", "auditor"),  # 404
        served.get("/openapi.json"),
        served.get("/log/checkpoint", "auditor"),
        served.post("/admin/v1/policies/explain", "security", {"tenant": 1}),  # 400
        httpx.post(  # refused by the body bound before any endpoint
            f"{admin}/admin/v1/policies/explain",
            headers=bearer("security"),
            content=b"x" * (MAX_BODY_BYTES + 1),
            timeout=10,
        ),
    ]
    assert [a.status_code for a in answers] == [200, 401, 403, 404, 200, 200, 400, 413]
    for answer in answers:
        _api_headers(answer)
        assert answer.headers.get("cache-control") == "no-cache" or (
            answer.headers.get("cache-control") == "no-store"
        )
    assert answers[0].headers["cache-control"] == "no-store"  # set by no route


def test_a_new_tenant_key_is_never_stored_by_a_cache(served: Served) -> None:
    created = served.post("/admin/v1/keys", "security", {"tenant": "acme"})
    assert created.status_code == 201, created.text
    assert created.json()["key"]
    assert created.headers.get("cache-control") == "no-store"
    _api_headers(created)


def test_the_html_report_is_sandboxed_and_runs_nothing(served: Served, tmp_path: Path) -> None:
    served.wait_for_size(1)
    answer = httpx.get(
        f"{served.admin}/admin/v1/log/report?format=html", headers=bearer("auditor"), timeout=60
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/html")
    _api_headers(answer)
    _runs_nothing(_meta_policy(answer.text))


def test_the_report_file_holds_its_own_policy() -> None:
    """What `owngate audit report --html` writes: opened from disk, no header applies."""
    failed = {
        "verification": {"ok": False, "error": "<script>x()</script>", "command": "c"},
        "log": "l",
        "generated_at": "2026-01-01T00:00:00Z",
        "format": "f",
        "totals": None,
    }
    page = render_html(failed)
    _runs_nothing(_meta_policy(page))
    assert "<script>" not in page


class _Metas(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.policies: list[str] = []
        self.in_head = True

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "body":
            self.in_head = False
        values = dict(attrs)
        if tag == "meta" and (values.get("http-equiv") or "").lower() == (
            "content-security-policy"
        ):
            assert self.in_head, "a CSP meta tag applies only in <head>"
            self.policies.append(values.get("content") or "")


def _meta_policy(page: str) -> str:
    parser = _Metas()
    parser.feed(page)
    assert len(parser.policies) == 1, re.findall(r"<meta[^>]*>", page)
    return parser.policies[0]
