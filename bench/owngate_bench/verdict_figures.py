"""A verdict and the figure printed beside it, kept in agreement.

CPU is read from /proc in 10 ms ticks, so a figure computed from ticks can land on its
target exactly (9 ticks over 6 is 1.5x; 20 ticks over 2,000 requests is 100 µs), and the
floats on the way must not decide it: `passes` judges a figure to 9 significant digits.
A figure over its target by less than the digits it is printed with would read as
meeting it ("0.250 ms, not met, target <= 0.25 ms"): `shown` prints as many more places
as it takes for the printed figure to agree with the verdict.
"""

from __future__ import annotations

__all__ = ["passes", "shown"]

_MAX_PLACES = 9


def passes(value: float, op: str, threshold: float) -> bool:
    """Whether `value` meets `op threshold` (`<=` or `>=`), judged to 9 significant digits."""
    value = float(f"{value:.9g}")
    return value <= threshold if op == "<=" else value >= threshold


def shown(value: float, places: int, op: str, threshold: float, fmt: str = ",") -> str:
    """`value` to `places` decimals (`fmt`: what goes before the precision, e.g. "," or
    "+,"), or to as many more as it takes for the printed figure to pass or fail
    `op threshold` as `value` does."""
    met = passes(value, op, threshold)
    for more in range(places, max(places, _MAX_PLACES) + 1):
        text = f"{value:{fmt}.{more}f}"
        if passes(float(text.replace(",", "")), op, threshold) is met:
            return text
    return f"{value:{fmt}.{places}f}"
