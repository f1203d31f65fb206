"""Logging setup shared by the commands: human-readable text, or one JSON object per line for log pipelines.

The root `skewless` command calls ``configure_logging`` before any subcommand runs (``--log-format``,
``--log-level``, env SKEWLESS_LOG_FORMAT / SKEWLESS_LOG_LEVEL); librdkafka's lines arrive as records of the
``librdkafka`` logger (broker/client.py), so they take the same format. Child processes a command starts (gateway
workers, the demo's gateway) get the same settings through ``child_env``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any, Literal

import orjson

LOG_FORMAT_ENV = "SKEWLESS_LOG_FORMAT"
LOG_LEVEL_ENV = "SKEWLESS_LOG_LEVEL"
LogFormat = Literal["text", "json"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
LOG_LEVELS: tuple[LogLevel, ...] = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts_us": int(record.created * 1_000_000),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record arrives, so a replaced stderr (pytest's capture, a
    redirect) never leaves a handler on a closed stream."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:  # StreamHandler.setStream would assign it
        pass


_current: dict[str, str] = {}


def configure_logging(level: str | None = None, json_format: bool = False) -> None:
    """One handler on the root logger, on stderr (stdout stays for a command's output, e.g. the gateway's ready
    line). ``level`` None is INFO, not chosen by the user (``level_chosen``). Calling it again replaces the previous
    setup; handlers others added (pytest's caplog) stay."""
    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter() if json_format else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, _StderrHandler)] + [handler]
    root.setLevel((level or "INFO").upper())
    _current.clear()
    _current[LOG_FORMAT_ENV] = "json" if json_format else "text"
    if level is not None:
        _current[LOG_LEVEL_ENV] = level.upper()


def quiet_unless_chosen(logger_name: str, level: int = logging.WARNING) -> None:
    """Drop ``logger_name``'s records below ``level`` from our handler, unless the user chose a log level (option
    or env): a command's own summary may say what a library logs at INFO. Loggers themselves stay untouched."""
    if LOG_LEVEL_ENV in _current:
        return
    prefix = logger_name + "."

    def keep(record: logging.LogRecord) -> bool:
        ours = record.name == logger_name or record.name.startswith(prefix)
        return not ours or record.levelno >= level

    for handler in logging.getLogger().handlers:
        if isinstance(handler, _StderrHandler):
            handler.addFilter(keep)


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child `skewless` process: ``base`` (default: ours) plus the log settings in force."""
    return {**(os.environ if base is None else base), **_current}


def current_log_format() -> str:
    return _current.get(LOG_FORMAT_ENV, "text")


def current_log_level() -> str:
    return _current.get(LOG_LEVEL_ENV, "INFO")


# -- rate-limited log lines ---------------------------------------------------------------------------------------

# Per-event warnings (a refused payload, a refused hello) come at the rate a hostile or broken source sends: 1.21 M
# refused events once wrote 121 MiB of WARNING lines. Each kind of line (its key) may burst LOG_BURST lines, then
# LOG_LINES_PER_S per second; what is dropped meanwhile is summed into the next line that passes ("N similar lines
# suppressed"). Counters keep the exact totals: the log line is an example, not the count.
LOG_BURST = 10
LOG_LINES_PER_S = 1.0


class LogLimiter:
    """A token bucket per key; sans-IO (the caller passes the time, or the monotonic clock is read)."""

    def __init__(self, burst: int = LOG_BURST, lines_per_s: float = LOG_LINES_PER_S) -> None:
        self.burst = burst
        self.lines_per_s = lines_per_s
        self._buckets: dict[str, tuple[float, float, int]] = {}  # key -> (tokens, at_s, suppressed since)
        self.suppressed_total = 0

    def admit(self, key: str, now_s: float) -> int | None:
        """None: drop this line; else the number of lines of ``key`` dropped since the last one admitted."""
        tokens, at_s, suppressed = self._buckets.get(key, (float(self.burst), now_s, 0))
        tokens = min(float(self.burst), tokens + max(0.0, now_s - at_s) * self.lines_per_s)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now_s, suppressed + 1)
            self.suppressed_total += 1
            return None
        self._buckets[key] = (tokens - 1.0, now_s, 0)
        if len(self._buckets) > 4096:  # keys are a fixed set of line kinds; bound it anyway
            self._buckets.clear()
        return suppressed


LIMITER = LogLimiter()


def limited_log(logger: logging.Logger, level: int, key: str, message: str, *args: Any,
                now_us: int | None = None, limiter: LogLimiter | None = None) -> bool:
    """``logger.log(level, message, *args)`` unless lines of ``key`` come faster than the limiter allows; the
    first line after a suppressed run says how many were left out. ``now_us``: the caller's clock (sans-IO cores
    pass theirs). Returns whether the line was written."""
    if not logger.isEnabledFor(level):
        return False
    now_s = time.monotonic() if now_us is None else now_us / 1_000_000
    suppressed = (limiter or LIMITER).admit(key, now_s)
    if suppressed is None:
        return False
    if suppressed:
        logger.log(level, message + " (%d similar lines suppressed)", *args, suppressed)
    else:
        logger.log(level, message, *args)
    return True
