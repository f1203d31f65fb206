"""The `skewless` command line: one typer app over the subcommands of skewless/cli_*.py (and spark_jobs/cli.py,
which spark-submit runs too).

Every error ends the command with one line on stderr, ``error: what (where): how to fix``, and a non-zero exit
code (2: a bad command line or configuration, 1: a failure while running); ``--debug`` (anywhere on the command
line) shows the traceback instead.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sys
import tomllib
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, NoReturn

import typer

from gateway.logs import (
    LOG_FORMAT_ENV,
    LOG_LEVEL_ENV,
    JsonFormatter,
    LogFormat,
    LogLevel,
    configure_logging,
    current_log_format,
)

# rich_markup_mode=None: help text is plain text, so "[gateway]" and "[default: 1]" survive (Rich markup ate them);
# the sub-apps inherit it from this root. pretty_exceptions_enable=False: main() reports errors itself.
app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, pretty_exceptions_enable=False,
                  add_completion=False,
                  help="Skewless: clock-aware, order-restoring ingestion for event streams.")

DEBUG_ENV = "SKEWLESS_DEBUG"
USAGE_EXIT = 2
FAILURE_EXIT = 1


def package_version() -> str:
    try:
        return version("skewless")
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"skewless {package_version()}")
        raise typer.Exit(0)


@app.callback()
def _global_options(
    debug: Annotated[bool, typer.Option(
        "--debug", help=f"Show the traceback of an error (also anywhere on the command line, or {DEBUG_ENV}=1).")]
    = False,
    show_version: Annotated[bool, typer.Option(
        "--version", help="Print the version and exit.", callback=_show_version, is_eager=True)] = False,
    log_format: Annotated[LogFormat, typer.Option(
        envvar=LOG_FORMAT_ENV, case_sensitive=False,
        help="Log lines on stderr as text, or as one JSON object per line (librdkafka's included).")] = "text",
    log_level: Annotated[LogLevel | None, typer.Option(
        envvar=LOG_LEVEL_ENV, case_sensitive=False, help="Log level [INFO].")] = None,
) -> None:
    """Skewless: clock-aware, order-restoring ingestion for event streams."""
    # Before any subcommand runs, so its log lines (and librdkafka's) have one format.
    configure_logging(log_level, json_format=log_format.lower() == "json")


_registered: list[bool] = []


def _register_subcommands() -> None:
    if _registered:  # main() may run more than once in a process (tests)
        return
    _registered.append(True)
    from skewless.cli_gateway import register as register_gateway
    from skewless.cli_kafka import register as register_kafka
    from skewless.cli_replay import register as register_replay
    from skewless.cli_source import register as register_source
    from skewless.cli_timesync import register as register_timesync
    from skewless.demo import demo
    from skewless.native_cores import pipeline_cores
    from spark_jobs.cli import register as register_spark

    register_kafka(app)
    app.command("demo")(demo)
    register_replay(app, cores=pipeline_cores())  # the replay harness (floor 2) takes its cores injected
    for register in (register_timesync, register_gateway, register_spark, register_source):
        register(app)


def _split_debug(argv: Sequence[str]) -> tuple[list[str], bool]:
    """``--debug`` is global: taken out wherever it stands (before a ``--``)."""
    args = list(argv)
    end = args.index("--") if "--" in args else len(args)
    debug = "--debug" in args[:end]
    if debug:
        args = [a for a in args[:end] if a != "--debug"] + args[end:]
    return args, debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def _strip_validator_noise(message: str) -> str:
    # typer's validators prefix "Value error, " to the message of a parser's ValueError.
    return message.replace("Value error, ", "")


# asyncio's create_server (and timesync's UDP bind) name the address: "... bind on address ('127.0.0.1', 7700): ...".
_BIND_ADDRESS = re.compile(r"bind on (udp )?address \('([^']*)', (\d+)")


def _taken_address(exc: OSError) -> str:
    """``port 7700 (tcp, 127.0.0.1)`` when the error names the address it could not bind, else ``address``."""
    found = _BIND_ADDRESS.search(str(exc))
    if found is None:
        return "address"
    udp, host, port = found.groups()
    return f"port {port} ({'udp' if udp else 'tcp'}, {host})"


def describe(exc: BaseException) -> tuple[str, int]:
    """One line for an error that escaped a command, and the exit code."""
    ctx = getattr(exc, "ctx", None)
    if isinstance(exc, typer.TyperException) and ctx is not None:  # a usage error (typer's UsageError has a ctx)
        return (f"{ctx.command_path}: {_strip_validator_noise(exc.format_message())} "
                f"(see '{ctx.command_path} --help')", exc.exit_code)
    if isinstance(exc, typer.TyperException):
        return _strip_validator_noise(exc.format_message()), exc.exit_code
    if isinstance(exc, tomllib.TOMLDecodeError):
        return f"malformed TOML: {exc} (fix the file's syntax)", USAGE_EXIT
    if isinstance(exc, FileNotFoundError):
        return f"no such file: {exc.filename} (check the path)", USAGE_EXIT
    if isinstance(exc, PermissionError):
        where = f": {exc.filename}" if exc.filename else " (ports below 1024 need root)"
        return f"permission denied{where}", USAGE_EXIT
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return (f"{_taken_address(exc)} already in use: another process listens on it; pick another port, or 0 "
                "for any free one", USAGE_EXIT)
    if isinstance(exc, ModuleNotFoundError) and exc.name in _EXTRA_OF_MODULE:
        extra = _EXTRA_OF_MODULE[exc.name]
        return (f"this command needs {exc.name}, which is not installed: pip install 'skewless[{extra}]'",
                FAILURE_EXIT)
    # A class we did not foresee: still one line, with its type so it can be searched for.
    return f"{type(exc).__name__}: {exc} (run with --debug for the traceback)", FAILURE_EXIT


_EXTRA_OF_MODULE = {"confluent_kafka": "gateway", "prometheus_client": "gateway", "sortedcontainers": "gateway",
                    "orjson": "gateway", "pyspark": "spark", "pandas": "spark", "pyarrow": "spark"}


def fail(message: str, code: int) -> NoReturn:
    if current_log_format() == "json":
        # Under --log-format json stderr is read as JSON lines: the error is one more record (whatever the level).
        record = logging.LogRecord("skewless", logging.ERROR, __file__, 0, "error: %s", (message,), None)
        typer.echo(JsonFormatter().format(record), err=True)
    else:
        typer.echo(f"error: {message}", err=True)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> None:
    args, debug = _split_debug(sys.argv[1:] if argv is None else argv)
    try:
        _register_subcommands()
        result = typer.main.get_command(app).main(args, prog_name="skewless", standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("aborted", err=True)
        sys.exit(130)
    except Exception as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # `skewless kafka` alone: the help text, as click shows it
            exc.show()  # type: ignore[attr-defined]
            sys.exit(USAGE_EXIT)
        if debug:
            raise
        fail(*describe(exc))
    # standalone_mode=False hands back what the command returned; an int is its exit code (typer.Exit handled).
    sys.exit(result if isinstance(result, int) else 0)
