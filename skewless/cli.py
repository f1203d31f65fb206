"""The `skewless` command line: one typer app, each package contributes its own subcommands."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, help="Skewless: clock-aware, order-restoring ingestion for event streams.")


def _register_subcommands() -> None:
    # Each package owns its commands; importing them here keeps `skewless --help` one place.
    from broker import cli as broker_cli
    from skewless.demo import demo

    broker_cli.register(app)
    app.command("demo")(demo)
    for module_name in ("reorder.eval.cli", "timesync.cli", "gateway.cli", "spark_jobs.cli", "skewless.cli_source"):
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
