"""One way to log for every command (issue 15 item 5): `skewless --log-format text|json --log-level LEVEL ...` (or
SKEWLESS_LOG_FORMAT / SKEWLESS_LOG_LEVEL) before any subcommand runs; librdkafka's lines are records of the
``librdkafka`` logger, not raw lines on file descriptor 2; progress bars never touch stdout."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from broker.client import LIBRDKAFKA_LOGGER, KafkaClientConfig
from gateway import logs
from reorder.eval.progress import progress_bar, progress_enabled, track
from skewless.cli import main

ROOT = Path(__file__).resolve().parents[3]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(autouse=True)
def _restore_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in (logs.LOG_FORMAT_ENV, logs.LOG_LEVEL_ENV, "SKEWLESS_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logs._current.clear()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    out, err = capsys.readouterr()
    code = exited.value.code
    return (code if isinstance(code, int) else 0 if code is None else 1), out, err


def test_the_json_formatter_writes_one_object_per_record() -> None:
    record = logging.LogRecord("gateway.server", logging.WARNING, __file__, 1, "lag %d ms", (12,), None)
    record.created = 1_700_000_000.25
    assert orjson.loads(logs.JsonFormatter().format(record)) == {
        "ts_us": 1_700_000_000_250_000, "level": "warning", "logger": "gateway.server", "message": "lag 12 ms"}


def test_the_root_options_configure_logging_before_the_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--log-format", "json", "--log-level", "debug", "traces", "profiles")
    assert code == 0
    assert "dataset1" in out
    assert logging.getLogger().level == logging.DEBUG
    logging.getLogger("skewless.test").debug("hello %s", "json")
    line = capsys.readouterr().err.strip()
    assert orjson.loads(line)["message"] == "hello json"
    assert orjson.loads(line)["logger"] == "skewless.test"
    assert logs.child_env({}) == {logs.LOG_FORMAT_ENV: "json", logs.LOG_LEVEL_ENV: "DEBUG"}


def test_the_environment_sets_the_same_options(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(logs.LOG_FORMAT_ENV, "JSON")
    monkeypatch.setenv(logs.LOG_LEVEL_ENV, "warning")
    assert run(capsys, "traces", "profiles")[0] == 0
    assert logging.getLogger().level == logging.WARNING
    logging.getLogger("x").warning("w")
    assert orjson.loads(capsys.readouterr().err)["level"] == "warning"


def test_text_at_info_is_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "traces", "profiles")[0] == 0
    assert logging.getLogger().level == logging.INFO
    assert logs.child_env({}) == {logs.LOG_FORMAT_ENV: "text"}  # the level was not chosen: children pick theirs
    logging.getLogger("x").info("plain")
    assert capsys.readouterr().err.rstrip().endswith(" INFO x plain")


def test_a_bad_log_format_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--log-format", "xml", "traces", "profiles")
    assert code == 2
    assert err.splitlines() == ["error: skewless: Invalid value for '--log-format' (env var: 'SKEWLESS_LOG_FORMAT'): "
                                "'xml' is not one of 'text', 'json'. (see 'skewless --help')"]


def test_quiet_unless_chosen_drops_a_library_s_info_lines_only(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure_logging()
    logs.quiet_unless_chosen("clients")
    logging.getLogger("clients.client").info("reconnecting")
    logging.getLogger("clients.client").warning("gave up")
    logging.getLogger("gateway").info("kept")
    err = capsys.readouterr().err
    assert "reconnecting" not in err
    assert "gave up" in err and "kept" in err
    logs.configure_logging("INFO")  # chosen: every INFO line shows
    logs.quiet_unless_chosen("clients")
    logging.getLogger("clients.client").info("reconnecting")
    assert "reconnecting" in capsys.readouterr().err


def test_a_producer_logs_through_the_librdkafka_logger(caplog: pytest.LogCaptureFixture) -> None:
    # Delivered by poll(): the unreachable broker's connect failures become records, not raw stderr lines.
    producer = KafkaClientConfig(f"127.0.0.1:{closed_port()}").producer(error_cb=lambda _e: None)
    with caplog.at_level(logging.DEBUG, logger=LIBRDKAFKA_LOGGER):
        deadline = time.monotonic() + 20
        while not any(r.name == LIBRDKAFKA_LOGGER for r in caplog.records) and time.monotonic() < deadline:
            producer.poll(0.1)
    ours = [r for r in caplog.records if r.name == LIBRDKAFKA_LOGGER]
    assert ours, "no librdkafka record within 20 s"
    assert "Connection refused" in ours[0].getMessage()
    assert ours[0].levelno == logging.ERROR


SUBPROCESS = """
import logging, sys, time
from broker.client import KafkaClientConfig
from gateway.logs import configure_logging
configure_logging("INFO", json_format=True)
producer = KafkaClientConfig(sys.argv[1]).producer(error_cb=lambda _e: None)
consumer = KafkaClientConfig(sys.argv[1]).consumer("skewless-test")
deadline = time.monotonic() + 3
while time.monotonic() < deadline:
    producer.poll(0.1)
    consumer.poll(0.1)
consumer.close()
"""


def test_librdkafka_lines_in_a_json_log_are_json() -> None:
    # A subprocess: without a logger librdkafka writes to file descriptor 2 itself, which caplog would not see.
    result = subprocess.run([sys.executable, "-c", SUBPROCESS, f"127.0.0.1:{closed_port()}"], capture_output=True,
                            text=True, timeout=60, cwd=ROOT, check=False,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    entries = [orjson.loads(line) for line in result.stderr.splitlines()]  # every line parses, or this fails
    assert entries
    assert {e["logger"] for e in entries} == {LIBRDKAFKA_LOGGER}
    assert any("Connection refused" in e["message"] for e in entries)


def test_progress_is_off_without_a_terminal_and_never_writes_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert not progress_enabled()  # pytest captures stderr: not a terminal
    assert list(track(range(3), "x", enabled=progress_enabled())) == [0, 1, 2]
    with progress_bar("x", 3, enabled=False) as advance:
        advance()
    assert capsys.readouterr() == ("", "")


def test_a_drawn_progress_bar_goes_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert list(track([1, 2], "counting", enabled=True)) == [1, 2]
    out, err = capsys.readouterr()
    assert out == ""
    assert "counting" in err


def test_under_json_the_error_line_is_a_json_record_too(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--log-format", "json", "kafka", "topics", "s", "--kafka-property", "client.id")
    assert code == 2
    assert out == ""
    entry = orjson.loads(err)  # exactly one JSON object
    assert {k: entry[k] for k in ("level", "logger")} == {"level": "error", "logger": "skewless"}
    assert entry["message"] == ("error: skewless kafka topics: Invalid value for '--kafka-property': 'client.id' is "
                                "not KEY=VALUE (e.g. security.protocol=SASL_SSL) (see 'skewless kafka topics "
                                "--help')")


def test_gateway_workers_start_with_the_log_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.config import build_config, load_settings
    from skewless import cli_gateway as gateway_cli

    class Spawned(Exception):
        pass

    seen: list[dict[str, str]] = []

    def spawn(_args: list[str], *, env: dict[str, str], **_kwargs: object) -> None:
        seen.append(env)
        raise Spawned

    monkeypatch.setattr(gateway_cli, "spawn_gateway", spawn)
    logs.configure_logging("warning", json_format=True)
    with pytest.raises(Spawned):
        gateway_cli.run_workers(2, build_config(load_settings(None, env={})))
    assert {k: seen[0][k] for k in (logs.LOG_FORMAT_ENV, logs.LOG_LEVEL_ENV)} == {
        logs.LOG_FORMAT_ENV: "json", logs.LOG_LEVEL_ENV: "WARNING"}
