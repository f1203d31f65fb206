"""The command-line flags every figure-drawing benchmark takes: --no-progress and --plot-from-doc."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def parse_or_redraw(parser: argparse.ArgumentParser, redraw: Callable[[argparse.Namespace], None],
                    redraw_help: str) -> argparse.Namespace | None:
    """Add --no-progress and --plot-from-doc to ``parser`` and parse the command line. With --plot-from-doc,
    ``redraw`` draws the figure again from the doc's tables and None says there is nothing left to run: a figure's
    style can change without the hours a measurement takes."""
    parser.add_argument("--plot-from-doc", action="store_true", help=f"only re-draw {redraw_help}")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (stderr, terminals only)")
    args = parser.parse_args()
    if args.plot_from_doc:
        redraw(args)
        return None
    return args
