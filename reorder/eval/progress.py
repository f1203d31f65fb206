"""Progress bars for the long commands and the benchmarks: rich, on stderr, only when stderr is a terminal and the
caller did not turn them off (``--no-progress``). stdout never changes, so what tests and scripts parse there stays
the same. rich is imported only when a bar is shown."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Sized
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = ["progress_bar", "progress_enabled", "track"]

T = TypeVar("T")
Advance = Callable[..., None]


def progress_enabled(requested: bool = True) -> bool:
    """A bar is drawn when requested and stderr is a terminal (not a pipe, a file or a test's capture)."""
    return requested and sys.stderr.isatty()


def _no_op(*_args: Any, **_kwargs: Any) -> None:
    pass


@contextmanager
def progress_bar(description: str, total: int | None, *, enabled: bool) -> Iterator[Advance]:
    """Yields ``advance(steps=1, description=None)``; ``total`` None draws a pulsing bar (no known end)."""
    if not enabled:
        yield _no_op
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    # Without a total there is nothing to count or extrapolate: the pulsing bar and the elapsed time only.
    counted = [MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn()] if total is not None else [
        TimeElapsedColumn()]
    columns = [TextColumn("{task.description}"), BarColumn(), *counted]
    with Progress(*columns, console=Console(stderr=True)) as progress:
        task = progress.add_task(description, total=total)

        def advance(steps: int = 1, description: str | None = None) -> None:
            if description is None:
                progress.advance(task, steps)
            else:
                progress.update(task, advance=steps, description=description)

        yield advance


def track(items: Iterable[T], description: str, *, total: int | None = None, enabled: bool) -> Iterator[T]:
    """``items`` unchanged, advancing a bar per item (``total`` defaults to ``len(items)`` when it has one)."""
    if total is None and isinstance(items, Sized):
        total = len(items)
    with progress_bar(description, total, enabled=enabled) as advance:
        for item in items:
            yield item
            advance()
