"""JSON source text for property tests of the body's key checks: objects nested to a chosen
depth, their keys and leaf values spelled as the caller chooses (escapes, repeats, names as
values), so a test sees the bytes a client may send rather than what a JSON encoder writes."""

from __future__ import annotations

from hypothesis import strategies as st

__all__ = ["json_texts"]


def json_texts(
    keys: st.SearchStrategy[str],
    scalars: st.SearchStrategy[str],
    depth: int,
    max_pairs: int,
) -> st.SearchStrategy[str]:
    """The text of a JSON object of at most `max_pairs` members, keys drawn from `keys`
    (each already a quoted JSON string), values from `scalars` (each valid JSON text) or,
    down to `depth` levels, arrays of up to 3 values and objects built the same way."""

    def value(depth: int) -> st.SearchStrategy[str]:
        if depth == 0:
            return scalars
        return st.one_of(
            scalars,
            st.lists(value(depth - 1), max_size=3).map(lambda xs: "[" + ",".join(xs) + "]"),
            obj(depth - 1),
        )

    def obj(depth: int) -> st.SearchStrategy[str]:
        pair = st.tuples(keys, value(depth)).map(lambda kv: f"{kv[0]} : {kv[1]}")
        return st.lists(pair, max_size=max_pairs).map(lambda ps: "{" + ",".join(ps) + "}")

    return obj(depth)
