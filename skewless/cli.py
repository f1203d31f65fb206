"""The `skewless` command line: one typer app, each package contributes its own subcommands."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, help="Skewless: clock-aware, order-restoring ingestion for event streams.")


def _register_subcommands() -> None:
    # Each package owns its commands; importing them here keeps `skewless --help` one place.
    from skewless import cli_infra

    cli_infra.register(app)
    for module_name in ("reorder.cli", "timesync.cli", "gateway.cli", "spark_jobs.cli", "clients.cli"):
        try:
            module = __import__(module_name, fromlist=["register"])
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        module.register(app)


def main() -> None:
    _register_subcommands()
    app()
