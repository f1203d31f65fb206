"""`skewless spark ...` option errors come before any Spark session starts."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spark_jobs import cli

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("args", [
    ["window-count", "--allowed-lateness", "5"],
    ["window-count", "--window", "abc"],
    ["three-window", "--allowed-lateness", "an hour"],
    ["pattern", "--pattern", "SEQ(a: k == 'a', b: k == 'b') WITHIN 1 s", "--allowed-lateness", "x"],
    ["sequence", "--query", "EVENT SEQ(A a, B b) WITHIN 1 s", "--allowed-lateness", "-"],
])
def test_a_bad_duration_is_refused_before_spark_starts(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def no_spark(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a Spark session was started")

    monkeypatch.setattr(cli, "create_spark_session", no_spark)
    result = CliRunner().invoke(cli.spark_app, args)
    assert result.exit_code == 2
    assert "not a duration" in result.output


def test_a_temporary_checkpoint_is_removed_on_ctrl_c(tmp_path: Path) -> None:
    """A job run without --checkpoint makes skewless-<job>-XXXX under the temp dir; Ctrl-C (SIGINT, the
    KeyboardInterrupt unwinding the program) must not leave it behind (issue 28 item 4). The Spark job's own path
    (normal exit) is covered by tests/integration/test_spark_quiet.py."""
    # SIGINT's Python handler, whatever the parent left: a shell's background job inherits SIGINT ignored.
    program = ("import signal, time\n"
               "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
               "from spark_jobs.stateful import temporary_checkpoint\n"
               "path = temporary_checkpoint('window_count')\n"
               "open(path + '/metadata', 'w').write('{}')\n"
               "print(path, flush=True)\n"
               "time.sleep(60)\n")
    process = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "TMPDIR": str(tmp_path)}, cwd=ROOT)
    assert process.stdout is not None
    path = Path(process.stdout.readline().strip())
    assert path.parent == tmp_path and path.name.startswith("skewless-window-count-")
    assert (path / "metadata").exists()
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=10)
    # Python exits by SIGINT itself after an unhandled KeyboardInterrupt (atexit handlers ran before).
    assert process.returncode == -signal.SIGINT and "KeyboardInterrupt" in err
    assert list(tmp_path.iterdir()) == []


def test_the_jvm_logs_follow_the_project_log_level_and_format() -> None:
    import logging

    from spark_jobs.session import NOISY_SPARK_LOGGERS, log4j2_level, log4j2_properties

    assert [log4j2_level(level) for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR,
                                              logging.CRITICAL)] == ["debug", "warn", "warn", "error", "fatal"]
    default = dict(line.split(" = ", 1) for line in log4j2_properties(logging.INFO, False).splitlines())
    assert default["rootLogger.level"] == "warn"
    assert default["appender.console.target"] == "SYSTEM_ERR"
    assert default["appender.console.layout.pattern"] == "%d{yyyy-MM-dd HH:mm:ss,SSS} %p %c %m%n%ex"
    assert {default[f"logger.noisy{i}.name"]: default[f"logger.noisy{i}.level"]
            for i in range(len(NOISY_SPARK_LOGGERS))} == dict.fromkeys(NOISY_SPARK_LOGGERS, "error")
    debug = dict(line.split(" = ", 1) for line in log4j2_properties(logging.DEBUG, True).splitlines())
    assert debug["rootLogger.level"] == "debug" and not any(k.startswith("logger.noisy") for k in debug)
    assert debug["appender.console.layout.pattern"].startswith('{"ts_us": %d{UNIX_MILLIS}000, "level": ')


def test_py4j_logs_warnings_only_unless_the_project_runs_at_debug() -> None:
    import logging

    from spark_jobs.session import _quiet_py4j

    py4j = logging.getLogger("py4j")
    before = py4j.level
    try:
        _quiet_py4j(logging.INFO)
        assert py4j.level == logging.WARNING
        _quiet_py4j(logging.ERROR)
        assert py4j.level == logging.ERROR
        _quiet_py4j(logging.DEBUG)
        assert py4j.level == logging.DEBUG
    finally:
        py4j.setLevel(before)


def test_py4j_records_while_the_jvm_stops_pass_only_at_debug() -> None:
    import logging

    from spark_jobs.session import PY4J_SHUTDOWN, _quiet_py4j

    py4j = logging.getLogger("py4j")
    before = py4j.level
    record = logging.LogRecord("py4j.clientserver", logging.ERROR, __file__, 1, "Exception occurred while shutting "
                               "down connection", (), None)
    try:
        _quiet_py4j(logging.INFO)
        assert PY4J_SHUTDOWN in logging.getLogger("py4j.clientserver").filters
        assert PY4J_SHUTDOWN.filter(record)  # while the job runs, a py4j error is shown
        PY4J_SHUTDOWN.stopping = True  # what stop_spark sets before it stops the JVM
        assert not PY4J_SHUTDOWN.filter(record)
        py4j.setLevel(logging.DEBUG)
        assert PY4J_SHUTDOWN.filter(record)
    finally:
        PY4J_SHUTDOWN.stopping = False
        py4j.setLevel(before)
