"""The bounds a reorder setting must keep, checked where its config is made: a ValueError that names the field."""

from __future__ import annotations

__all__ = ["check_at_least", "check_fraction"]


def check_fraction(name: str, value: float) -> None:
    """``value`` strictly between 0 and 1 (a quantile, a target accuracy)."""
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be in (0, 1)")


def check_at_least(minimum: int, **values: float) -> None:
    """Every named value at least ``minimum``; the first that is not, in the order given, is the error."""
    for name, value in values.items():
        if value < minimum:
            raise ValueError(f"{name} must be >= {minimum}")
