"""The product face: the `skewless` command line and the demo (floor 4; nothing imports it)."""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> None:
    """The `skewless` console script: the SDK-only install (`pip install skewless`) has no CLI dependencies, so
    their absence is one line naming the extra, not an ImportError."""
    try:
        from skewless.cli import main as cli_main
    except ModuleNotFoundError as exc:
        if exc.name not in ("typer", "rich", "confluent_kafka", "orjson"):
            raise
        sys.stderr.write(f"error: the skewless command needs {exc.name}, which is not installed: "
                         f"pip install 'skewless[gateway]'\n")
        sys.exit(1)
    cli_main()
