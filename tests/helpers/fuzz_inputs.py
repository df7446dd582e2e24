"""What the fuzz suite sends, and what a gateway must make of it.

Hypothesis strategies for the parts of a request a client controls, each paired with the
oracle that says what the answer must be:

- `label_lines` / `Labels`: copies of the data-class header (and near-miss names), with
  values from the declared classes to blanks, comma lists, non-ASCII and 80 KB;
  `Labels.may_go_hosted` and `Labels.refusal` are the policy's meaning of them;
- `bodies` / `Body`: JSON documents of odd shapes and hand-made bytes (duplicate and
  escaped `model` keys, deep nesting, huge numbers and strings, invalid UTF-8,
  truncation), with the answer each must get where that is certain;
- `model_strings`: names near the served ones, arbitrary text, and very long strings;
- `raw_requests` / `RawRequest`: request lines, header lines and framing, well formed or
  not, marked `complete` only when the request is well formed and fully sent.

Every generated value prints short (runs are collapsed: `b'a' * 70000`), so a failing
example reads as the request that caused it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

import orjson
from hypothesis import strategies as st

from tests.helpers.fuzz_rig import KEYS
from tests.helpers.raw_http import build_request

__all__ = [
    "DATA_CLASS",
    "MAX_BODY",
    "SERVED",
    "Body",
    "Labels",
    "RawRequest",
    "Shown",
    "bodies",
    "chat_body",
    "complete_request",
    "head_size",
    "label_lines",
    "model_strings",
    "raw_requests",
]

T = TypeVar("T", str, bytes)

DATA_CLASS: Final = b"x-data-class"
DECLARED: Final = ("phi", "public")
MAX_BODY: Final = 256 * 1024  # limits.max_body_bytes in the rig's gateway.yaml
SERVED: Final = ("m", "m-alias", "f", "g")  # the public model names of the rig
_BYTE_RUN: Final = re.compile(rb"(.{1,8}?)\1{15,}", re.DOTALL)
_TEXT_RUN: Final = re.compile(r"(.{1,8}?)\1{15,}", re.DOTALL)


def short_repr(value: str | bytes, limit: int = 600) -> str:
    """`repr` with long runs collapsed (`b'a' * 70000`) and the rest cut at `limit`."""
    pattern: Any = _TEXT_RUN if isinstance(value, str) else _BYTE_RUN
    parts, position = [], 0
    for match in pattern.finditer(value):
        unit = match.group(1)
        if match.start() > position:
            parts.append(repr(value[position : match.start()]))
        parts.append(f"{unit!r} * {len(match.group(0)) // len(unit)}")
        position = match.end()
    if position < len(value) or not parts:
        parts.append(repr(value[position:]))
    text = " + ".join(parts)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(value)} long)"


class _Printed:
    """Hypothesis prints a failing example's arguments with this repr, not field by field."""

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


class Shown(_Printed, Generic[T]):
    """A generated string that prints short."""

    def __init__(self, value: T) -> None:
        self.value: T = value

    def __repr__(self) -> str:
        return short_repr(self.value)


# -- requests ------------------------------------------------------------------------------


def auth(tenant: str) -> bytes:
    return b"authorization: Bearer " + KEYS[tenant].encode()


def chat_body(model: Any = "m", *, stream: bool = False) -> bytes:
    doc = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    return orjson.dumps({**doc, "stream": stream})


def complete_request(
    tenant: str,
    body: bytes,
    extra: Sequence[bytes] = (),
    path: bytes = b"/v1/chat/completions",
    before: Sequence[bytes] = (),
) -> bytes:
    """A well-framed POST asking for `connection: close`, with `before` header lines
    ahead of the usual ones and `extra` after them."""
    lines = [
        *before,
        b"host: 127.0.0.1",
        auth(tenant),
        b"content-type: application/json",
        b"content-length: " + str(len(body)).encode(),
        b"connection: close",
        *extra,
    ]
    return build_request(b"POST", path, lines, body)


def head_size(raw: bytes) -> int:
    """Bytes before the blank line that ends the head (all of them if there is none)."""
    end = raw.find(b"\r\n\r\n")
    return len(raw) if end < 0 else end


# -- data-class labels ---------------------------------------------------------------------

# Bytes a header value may hold on the wire: HTAB, visible ASCII and space, obs-text.
VALUE_BYTES: Final = [9, *range(0x20, 0x7F), *range(0x80, 0x100)]
LABEL_NAMES: Final = [b"x-data-class", b"X-Data-Class", b"X-DATA-CLASS", b"x-dAtA-cLaSs"]
NEAR_NAMES: Final = [b"x-data-classes", b"x_data_class", b"data-class", b"x-data-class-2"]
SPECIAL_LABELS: Final = [
    *(b"", b" ", b"\t", b" \t  "),
    *(b"phi", b"PHI", b"Phi", b"phi \t", b"public", b"PUBLIC", b"Public "),
    *(b"phi,public", b"public, phi", b"phi, phi", b"public,public", b"public,", b","),
    *(b"none", b"null", b"unknown", b"*", b"phi;q=1", b'"phi"'),
    *(b"\xa0phi", b"phi\xa0", b"public\xa0", b"p\xe9hi", b"ph\xc4\xb1", b"PH\xc4\xb0"),
]


def _huge_label(core: bytes, fill: bytes, size: int, core_first: bool) -> bytes:
    return core + fill * size if core_first else fill * size + core


label_values: st.SearchStrategy[bytes] = st.one_of(
    st.sampled_from([b"phi", b"public"]),
    st.sampled_from(SPECIAL_LABELS),
    st.lists(st.sampled_from(VALUE_BYTES[:96]), max_size=24).map(bytes),  # ASCII only
    st.lists(st.sampled_from(VALUE_BYTES), max_size=24).map(bytes),
    st.builds(
        _huge_label,
        st.sampled_from([b"phi", b"public", b"", b"x"]),
        st.sampled_from([b"a", b" ", b"\xe9", b"phi"]),
        st.integers(1_000, 80_000),
        st.booleans(),
    ),
)


@dataclass(frozen=True, repr=False)
class Labels(_Printed):
    """The data-class header lines of one request, and what a policy makes of them."""

    lines: tuple[tuple[bytes, bytes, bool], ...]  # (name, value, sent before the others)

    def __repr__(self) -> str:
        shown = [
            f"{name.decode()}: {short_repr(value, 120)}{' (first)' if first else ''}"
            for name, value, first in self.lines
        ]
        return f"Labels({shown})"

    @property
    def copies(self) -> list[bytes]:
        """Values of every copy of the data-class header, in the order they are sent."""
        ordered = sorted(self.lines, key=lambda line: not line[2])  # stable: `first` ahead
        return [value for name, value, _ in ordered if name.lower() == DATA_CLASS]

    def header_lines(self, *, first: bool) -> list[bytes]:
        return [name + b": " + value for name, value, early in self.lines if early == first]

    def may_go_hosted(self) -> bool:
        """Unlabelled, or every copy (and every comma-separated item) says `public`, however
        spaced or cased: the only requests a hosted fallback may ever see."""
        items = {
            item.strip().lower()
            for copy in self.copies
            for item in copy.decode("latin-1").split(",")
        }
        return not self.copies or items == {"public"}

    def refusal(self) -> str | None:
        """Why the request must be refused (400), where that is certain whatever a
        gateway's handling of non-ASCII space or comma lists."""
        copies = self.copies
        if not copies:
            return None
        stripped = [copy.strip(b" \t").lower() for copy in copies]
        if b"" in stripped:
            return "an empty or blank label"
        if any(max(copy) >= 0x80 or b"," in copy for copy in copies):
            return None
        if len(set(stripped)) > 1:
            return "copies that name different classes"
        if stripped[0].decode() not in DECLARED:
            return "an undeclared class"
        return None


label_lines: st.SearchStrategy[Labels] = st.lists(
    st.tuples(st.sampled_from(LABEL_NAMES + NEAR_NAMES), label_values, st.booleans()),
    max_size=4,
).map(lambda lines: Labels(tuple(lines)))


# -- JSON bodies ---------------------------------------------------------------------------


@dataclass(frozen=True, repr=False)
class Body(_Printed):
    """A request body and the answer it must get (`expect`; None: anything but a 5xx)."""

    data: bytes
    expect: str | None = None  # "duplicate_model", "invalid_json", "not_object", "too_large"

    def __repr__(self) -> str:
        return f"Body({short_repr(self.data)}, expect={self.expect})"

    @property
    def statuses(self) -> tuple[int, ...] | None:
        """The statuses that may answer it (None: any 2xx or 4xx)."""
        return {
            "duplicate_model": (400,),
            "invalid_json": (400, 413),
            "not_object": (400,),
            "too_large": (413,),
            None: None,
        }[self.expect]


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=16),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_fields = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.sampled_from([*SERVED, "", "M"]), json_values),
        "stream": st.one_of(st.booleans(), json_values),
        "messages": st.one_of(
            st.just([{"role": "user", "content": "hi"}]),
            st.lists(
                st.dictionaries(st.sampled_from(["role", "content", "name"]), json_values),
                max_size=3,
            ),
            json_values,
        ),
        "prompt": json_values,
        "input": json_values,
        "max_tokens": st.one_of(st.integers(-3, 8), json_values),
        "stream_options": st.one_of(st.just({"include_usage": True}), json_values),
    },
)
json_docs = st.builds(
    lambda more, fields: {**more, **fields},
    st.dictionaries(st.text(max_size=8), json_values, max_size=3),
    _fields,
)


def _encoded(doc: dict[str, Any], ascii_only: bool) -> Body:
    return Body(json.dumps(doc, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))


ESCAPED_MODEL_KEYS: Final = [b'"mod\\u0065l"', b'"\\u006dodel"', b'"\\u006d\\u006f\\u0064el"']
MODEL_VALUES: Final = [b'"m"', b'"f"', b'"g"', b'"m-alias"', b'"nope"', b"1", b"null"]
HI: Final = b'"messages":[{"role":"user","content":"hi"}]'


def _duplicate_model(escaped: list[bytes], values: list[bytes], depth: int, first: bool) -> Body:
    """A plain `model` key and one or two more that decode to `model` (`escaped`, or plain
    again), and optionally an array nested `depth` deep before or after them."""
    keys = [b'"model"', *(escaped or [b'"model"'])]
    members = [k + b":" + v for k, v in zip(keys, values, strict=False)]
    if depth:
        deep = b'"deep":' + b"[" * depth + b"]" * depth
        members = [deep, *members] if first else [*members, deep]
    return Body(b"{" + b",".join([*members, HI]) + b"}", "duplicate_model")


def _nested(depth: int) -> Body:
    deep = b'"deep":' + b'{"a":' * depth + b"1" + b"}" * depth
    return Body(b'{"model":"m","max_tokens":2,' + HI + b"," + deep + b"}")


def _number(text: bytes) -> Body:
    return Body(b'{"model":"m","max_tokens":' + text + b',"messages":[]}')


def _bad_utf8(in_model: bool, junk: bytes) -> Body:
    model, content = (b"m" + junk, b"hi") if in_model else (b"m", b"h" + junk + b"i")
    data = b'{"model":"' + model + b'","messages":[{"role":"user","content":"' + content + b'"}]}'
    return Body(data, "invalid_json")


def _huge_string(size: int, fill: bytes) -> Body:
    data = chat_body("m")[:-1] + b',"user":"' + fill * size + b'"}'
    return Body(data, "too_large" if len(data) > MAX_BODY else None)


def _truncated(cut: int) -> Body:
    whole = chat_body("m")
    return Body(whole[: cut % len(whole)], "invalid_json")


# One branch per family, so that each gets its share of the examples.
bodies: st.SearchStrategy[Body] = st.one_of(
    st.builds(_encoded, json_docs, st.booleans()),
    st.builds(
        _duplicate_model,
        st.lists(st.sampled_from(ESCAPED_MODEL_KEYS), max_size=2),
        st.lists(st.sampled_from(MODEL_VALUES), min_size=3, max_size=3),
        st.sampled_from([0, 1000, 1023, 10, 1100]),
        st.booleans(),
    ),
    st.builds(_nested, st.sampled_from([10, 1000, 1023, 1100, 5000])),
    st.builds(
        _number,
        st.sampled_from(
            [b"1" + b"0" * 30, b"-1e999", b"1e400", b"NaN", b"Infinity", b"-0", b"1" * 5000]
        ),
    ),
    st.builds(
        _bad_utf8,
        st.booleans(),
        st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf"]),
    ),
    st.builds(
        _huge_string, st.integers(1, 400_000), st.sampled_from([b"a", b"\\u00e9", b"\xc3\xa9"])
    ),
    st.builds(_truncated, st.integers(0, 1000)),
    st.sampled_from(
        [
            Body(b"", "invalid_json"),
            Body(b" \r\n\t", "invalid_json"),
            Body(b"[]", "not_object"),
            Body(b"null", "not_object"),
            Body(b'"m"', "not_object"),
            Body(b"\xef\xbb\xbf" + chat_body("m")),
            Body(chat_body("m") + b"x", "invalid_json"),
            Body(chat_body("m") + b"{}", "invalid_json"),
        ]
    ),
)


# -- model strings -------------------------------------------------------------------------

model_strings: st.SearchStrategy[Shown[str]] = st.one_of(
    st.sampled_from(
        [
            *SERVED,
            *("", "M", " m", "m ", "m\x00", "m\n", "m-alias\t", "f/../m", "openai/f"),
            *("hosted-open", "gpu-ok", "*", "m*", "%6d", "\u202em", "\ufeffm"),
        ]
    ),
    st.text(max_size=40),
    st.builds(
        lambda unit, count: unit * count,
        st.sampled_from(["m", "\u00e9", "\U0001f600", "\u202e"]),
        st.integers(200, 300_000),
    ),
).map(Shown)


# -- request line, header lines, framing ---------------------------------------------------

TOKEN: Final = list(
    b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)
FRAMING_NAMES: Final = frozenset(
    {
        *(b"content-length", b"transfer-encoding", b"connection", b"upgrade", b"expect"),
        *(b"host", b"authorization", b"te", b"trailer", b"keep-alive", DATA_CLASS),
    }
)
CLEAN_METHODS: Final = [b"POST", b"GET", b"PUT", b"DELETE", b"PATCH", b"OPTIONS"]
DIRTY_METHODS: Final = [b"post", b"P\xd3ST", b"", b"CONNECT", b"TRACE", b"PRI", b"BREW"]
CLEAN_TARGETS: Final = [
    *(b"/v1/chat/completions", b"/v1/chat/completions?x=1&y", b"/v1/%63hat/completions"),
    *(b"/v1/completions", b"/v1/embeddings", b"/v1/models", b"/healthz", b"/readyz"),
    *(b"/metrics", b"/admin/status", b"/v1/provenance/receipts/req_0", b"/nope"),
    *(b"/v1/provenance/proofs/x", b"//v1/chat/completions", b"/v1/chat/completions/"),
    *(b"/V1/CHAT/COMPLETIONS", b"http://127.0.0.1/v1/chat/completions", b"/%ff%fe"),
    b"/v1/chat/completions%00",
]
DIRTY_TARGETS: Final = [b"", b"*", b"/\xe9", b"/a b", b"v1/chat/completions", b"/\x00"]
CLEAN_VERSIONS: Final = [b"HTTP/1.1", b"HTTP/1.0"]
DIRTY_VERSIONS: Final = [b"HTTP/2.0", b"HTTP/0.9", b"HTTP/1.2", b"http/1.1", b"HTTP/1.1x", b""]

_clean_names = (
    st.lists(st.sampled_from(TOKEN), min_size=1, max_size=20)
    .map(bytes)
    .filter(lambda name: name.lower() not in FRAMING_NAMES)
)
_clean_values = st.one_of(
    st.lists(st.sampled_from(VALUE_BYTES), max_size=30).map(bytes),
    st.builds(
        lambda fill, size: fill * size, st.sampled_from([b"v", b"\xff"]), st.integers(1, 100_000)
    ),
)
_clean_lines = st.lists(
    st.builds(lambda name, value: name + b": " + value, _clean_names, _clean_values), max_size=6
).map(lambda lines: (lines, True))
_dirty_lines = st.lists(
    st.one_of(
        st.binary(max_size=40),
        st.builds(lambda n, v: n + b": " + v, st.binary(max_size=12), st.binary(max_size=30)),
        st.builds(lambda name: name + b": a\r\n folded", _clean_names),
        st.sampled_from(
            [
                *(b": no name", b"no colon", b"x-data-class : phi", b"x-data-class:phi"),
                *(b"x-data-class: phi\r\n\tpublic", b"X-Data-Class:", b"expect: 100-continue"),
                *(b"connection: upgrade\r\nupgrade: h2c", b"host: a\r\nhost: b"),
                b"authorization: Bearer " + KEYS["open"].encode(),
                b"content-type: text/plain",
            ]
        ),
        st.builds(
            lambda count: b"\r\n".join(b"x-h-%d: v" % i for i in range(count)),
            st.integers(100, 5000),
        ),
    ),
    min_size=1,
    max_size=4,
).map(lambda lines: (lines, False))

FRAMINGS: Final = [
    *("exact", "chunked", "short", "long", "bad-length", "two-lengths", "bad-chunked"),
    *("te-and-cl", "te-variant", "none"),
]
BAD_LENGTHS: Final = [b"+5", b"-1", b"1e3", b"0x10", b"5 5", b"99999999999999999999", b"", b"\xb9"]
BAD_CHUNKS: Final = [
    *(b"zz\r\nabc\r\n0\r\n\r\n", b"ffffffffffffffffff\r\nabc\r\n0\r\n\r\n"),
    *(b"-1\r\nabc\r\n0\r\n\r\n", b"3\r\nabcdef\r\n0\r\n\r\n", b"3\r\nabc0\r\n\r\n"),
    *(b"3\r\nabc\r\n", b"3 \r\nabc\r\n0\r\n\r\n", b"3\nabc\n0\n\n"),
]
TE_VARIANTS: Final = [
    b"Chunked",
    b"chunked ",
    b"gzip, chunked",
    b"chunked, gzip",
    b"identity",
    b"x",
]


# Trailer fields after the last chunk (uvicorn appends them to the request's headers).
TRAILERS: Final = [b"", b"x-trailer: 1\r\n", b"x-data-class: public\r\n", b"x-data-class:\r\n"]


def chunked(
    body: bytes, sizes: Sequence[int], upper: bool, extension: bool, trailer: bytes
) -> bytes:
    """`body` in chunks of `sizes` (the rest in one), then the last chunk and `trailer`."""
    out, start = [], 0
    for size in [*sizes, len(body)]:
        piece = body[start : start + max(size, 1)]
        start += len(piece)
        if not piece:
            break
        head = (b"%X" if upper else b"%x") % len(piece) + (b";ext=1" if extension else b"")
        out.append(head + b"\r\n" + piece + b"\r\n")
    out.append(b"0\r\n" + trailer + b"\r\n")
    return b"".join(out)


@st.composite
def _framed(draw: st.DrawFn, body: bytes) -> tuple[list[bytes], bytes, bool]:
    """(framing header lines, the bytes after the head, whether they frame `body` exactly)."""
    kind = draw(st.sampled_from(FRAMINGS))
    length = len(body)
    if kind == "exact":
        return [b"content-length: %d" % length], body, True
    if kind == "chunked":
        sizes = draw(st.lists(st.integers(1, 64), max_size=6))
        upper, extension = draw(st.tuples(st.booleans(), st.booleans()))
        trailer = draw(st.sampled_from(TRAILERS))
        return (
            [b"transfer-encoding: chunked"],
            chunked(body, sizes, upper, extension, trailer),
            True,
        )
    if kind == "short":  # declares more than it sends
        return [b"content-length: %d" % (length + draw(st.integers(1, 1000)))], body, False
    if kind == "long":  # sends more than it declares: the rest reads as a next request
        return [b"content-length: %d" % max(0, length - draw(st.integers(1, 40)))], body, False
    if kind == "bad-length":
        return [b"content-length: " + draw(st.sampled_from(BAD_LENGTHS))], body, False
    if kind == "two-lengths":
        other = draw(st.sampled_from([length, length + 1, 0]))
        return [b"content-length: %d" % length, b"content-length: %d" % other], body, False
    if kind == "bad-chunked":
        return [b"transfer-encoding: chunked"], draw(st.sampled_from(BAD_CHUNKS)), False
    if kind == "te-and-cl":
        lines = [b"content-length: %d" % length, b"transfer-encoding: chunked"]
        return lines, chunked(body, [], False, False, b""), False
    if kind == "te-variant":
        te = b"transfer-encoding: " + draw(st.sampled_from(TE_VARIANTS))
        return [te], chunked(body, [], False, False, b""), False
    return [], body, False  # no length at all: a POST's body reads as a next request


@dataclass(frozen=True, repr=False)
class RawRequest(_Printed):
    """Request bytes; `complete` when well formed and fully sent (it must be answered)."""

    data: bytes
    complete: bool
    model: str

    def __repr__(self) -> str:
        return f"RawRequest({short_repr(self.data, 1500)}, complete={self.complete})"


PARTS: Final = ("method", "target", "version", "headers", "framing", "body", "order")


@st.composite
def raw_requests(draw: st.DrawFn, tenant: str) -> RawRequest:
    """A valid chat request of `tenant` with up to three of its parts replaced by variants
    (well formed or not): most requests still reach routing, and every part shrinks back
    to its valid form."""
    changed = draw(st.sets(st.sampled_from(PARTS), max_size=3))
    method, path, version = b"POST", b"/v1/chat/completions", b"HTTP/1.1"
    if "method" in changed:
        method = draw(st.sampled_from(CLEAN_METHODS + DIRTY_METHODS))
    if "target" in changed:
        path = draw(
            st.one_of(
                st.sampled_from(CLEAN_TARGETS + DIRTY_TARGETS),
                st.integers(1, 100_000).map(lambda n: b"/" + b"a" * n),
            )
        )
    if "version" in changed:
        version = draw(st.sampled_from(CLEAN_VERSIONS + DIRTY_VERSIONS))
    model = draw(st.sampled_from(["m", "f", "g"]))
    body = chat_body(model)
    if "body" in changed:
        body = draw(st.one_of(st.just(b""), st.binary(max_size=64)))
    extra, extra_clean = (
        draw(st.one_of(_clean_lines, _dirty_lines)) if "headers" in changed else ([], True)
    )
    framing, payload, exact = (
        draw(_framed(body))
        if "framing" in changed
        else ([b"content-length: %d" % len(body)], body, True)
    )
    base = [b"host: 127.0.0.1", auth(tenant), b"content-type: application/json"]
    base.append(b"connection: close")
    lines = [*framing, *base, *extra] if "order" in changed else [*base, *extra, *framing]
    well_formed = (
        method in CLEAN_METHODS
        and path not in DIRTY_TARGETS
        and version in CLEAN_VERSIONS
        and extra_clean
    )
    data = build_request(method, path, lines, payload, version)
    return RawRequest(data, well_formed and exact, model)
