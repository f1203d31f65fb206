"""What the commands share, in one place: validation of float options and the parsers of duration options.

typer turns "nan" and "inf" into floats without a word, and a NaN then fails far from the option that carried it
("cannot convert float NaN to integer", issue 28 item 5): :func:`finite_float` refuses them at the option. A
duration option takes any unit (250ms, 1.5s, 2m) and gives integer microseconds; its parser says what a bare number
means.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import typer

from contract.units import duration_parser

__all__ = ["DURATION_BARE_MS", "DURATION_BARE_S", "DURATION_BARE_US", "DURATION_UNIT_REQUIRED",
           "SIGNED_DURATION_BARE_US", "finite_float"]

DURATION_BARE_US = duration_parser("us")
DURATION_BARE_MS = duration_parser("ms")
DURATION_BARE_S = duration_parser("s")
# A clock shift (how far ahead, or an offset): either sign.
SIGNED_DURATION_BARE_US = duration_parser("us", allow_negative=True)
DURATION_UNIT_REQUIRED = duration_parser(None)


def finite_float(*, above: float | None = None, at_least: float | None = None,
                 meaning: str = "") -> Callable[[float], float]:
    """A typer ``callback=`` that accepts a finite float, ``> above`` and ``>= at_least`` when given, and refuses
    anything else with one line naming what is accepted (``meaning`` adds what the number does)."""
    bounds = [f"> {above:g}" if above is not None else "", f">= {at_least:g}" if at_least is not None else ""]
    accepted = " and ".join(b for b in bounds if b)
    wanted = f"a finite number{' ' + accepted if accepted else ''}{f' ({meaning})' if meaning else ''}"

    def check(value: float) -> float:
        if (not math.isfinite(value) or (above is not None and value <= above)
                or (at_least is not None and value < at_least)):
            raise typer.BadParameter(f"{value:g} is not {wanted}")
        return value
    return check
