"""A real local Spark job in a subprocess, stderr not a terminal (issue 28 items 1 and 4): no py4j INFO line, no
Spark progress bar, no log4j banner, no Spark WARN chatter; the temporary checkpoint is gone after exit."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.admin import ensure_topics
from broker.launcher import BrokerState
from contract.topics import TopicNames

pytestmark = pytest.mark.timeout(180)

# Printed by the JVM itself (Spark 4 runs it with --add-modules jdk.incubator.vector), before any logging exists.
JVM_NOTE = "WARNING: Using incubator modules: jdk.incubator.vector"


def test_a_spark_job_off_a_terminal_writes_nothing_but_the_jvm_note_to_stderr(kafka: BrokerState, topic_prefix: str,
                                                                              tmp_path: Path) -> None:
    names = TopicNames(topic_prefix)
    ensure_topics(kafka.bootstrap_servers, [names.events("sensors"), names.late("sensors")])
    started = time.monotonic()
    done = subprocess.run(
        [str(Path(sys.executable).parent / "skewless"), "spark", "window-count", "--bootstrap",
         kafka.bootstrap_servers, "--prefix", topic_prefix, "--stream", "sensors", "--available-now"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=150, check=False,
        env={**os.environ, "TMPDIR": str(tmp_path)})
    elapsed_s = time.monotonic() - started
    lines = done.stderr.splitlines()
    print(f"spark job: exit {done.returncode} in {elapsed_s:.1f} s, {len(lines)} stderr lines")
    assert done.returncode == 0, done.stderr
    assert not [line for line in lines if "py4j" in line]
    assert "[Stage" not in done.stderr and "\r" not in done.stderr
    assert not [line for line in lines if "log4j" in line.lower() or " WARN " in line or "Traceback" in line]
    assert set(lines) <= {JVM_NOTE}, lines
    # The temporary checkpoint (skewless-window-count-XXXX under TMPDIR) was removed on exit.
    assert [p.name for p in tmp_path.iterdir()] == []
