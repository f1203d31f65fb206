"""One look for the plots in docs/: 150 dpi, font sizes readable on a laptop screen, no overlapping labels, and a
unit on every axis.

    from benchmarks.plotstyle import axis_labels, pyplot, save
    plt = pyplot()                      # Agg backend, the style applied
    fig, ax = plt.subplots(figsize=(9, 4))
    axis_labels(ax, ("delay", "ms"), ("events", "%"))
    save(fig, DOCS / "x.png")           # 150 dpi, tight bounding box; refuses an axis without a label
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

DPI = 150

STYLE = {
    "figure.dpi": 100,
    "savefig.dpi": DPI,
    "savefig.bbox": "tight",
    # constrained layout moves titles, labels and legends apart; tight_layout misses suptitles and legends.
    "figure.constrained_layout.use": True,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 8.5,
    "legend.framealpha": 0.85,
    "figure.titlesize": 12,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "lines.linewidth": 1.6,
}


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display here) with STYLE applied."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(STYLE)
    return plt


def unit_label(quantity: str, unit: str | None) -> str:
    """'delay', 'ms' -> 'delay (ms)'; no unit for a count of named things or categories: ('configuration', None)."""
    return quantity if unit is None else f"{quantity} ({unit})"


def axis_labels(ax: Any, x: tuple[str, str | None] | None, y: tuple[str, str | None]) -> None:
    """Label both axes with their units; x None leaves the x axis to the axes below that share it."""
    if x is not None:
        ax.set_xlabel(unit_label(*x))
    ax.set_ylabel(unit_label(*y))


def unlabelled_axes(fig: Any) -> list[str]:
    """Axes of ``fig`` with no y label, or no x label where no axes sharing its x axis has one."""
    missing: list[str] = []
    for index, ax in enumerate(fig.axes):
        if not ax.get_visible() or not ax.axison:
            continue
        where = ax.get_title() or f"axes {index}"
        if not ax.get_ylabel():
            missing.append(f"{where}: y")
        siblings = ax.get_shared_x_axes().get_siblings(ax)
        if not any(other.get_xlabel() for other in siblings):
            missing.append(f"{where}: x")
    return missing


def save(fig: Any, path: Path) -> None:
    """Write ``fig`` at DPI and close it; an axis without a label is a bug in the benchmark, not a style choice."""
    missing = unlabelled_axes(fig)
    if missing:
        raise ValueError(f"{path.name}: axes without a label (and unit): {', '.join(missing)}")
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
