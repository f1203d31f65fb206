"""`skewless spark ...` option errors come before any Spark session starts."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spark_jobs import cli

ROOT = Path(__file__).resolve().parents[2]


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
    program = ("import time\n"
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
