"""A real local Spark job in a subprocess, stderr not a terminal (issue 28 items 1 and 4): no py4j INFO line, no
Spark progress bar, no log4j banner, no Spark WARN chatter; the temporary checkpoint is gone after exit. The same
job started by the documented spark-submit command writes no INFO line either."""

from __future__ import annotations

import os
import shlex
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


# About 30 s: in the long suite (CI's budget); the documented spark-submit below checks the same quiet start in CI.
@pytest.mark.reliability_long
def test_a_spark_job_off_a_terminal_writes_nothing_but_the_jvm_note_to_stderr(kafka: BrokerState, topic_prefix: str,
                                                                              tmp_path: Path) -> None:
    names = TopicNames(topic_prefix)
    ensure_topics(kafka.bootstrap_servers, [names.events("sensors"), names.late("sensors")])
    warm_transaction_coordinator(kafka.bootstrap_servers)
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


def warm_transaction_coordinator(bootstrap: str) -> None:
    """A broker that just started loads its transaction coordinator on first use, and the job's transactional
    results sink then says so in one INFO line (broker/client.py): the broker's state, not Spark's noise, which is
    what this test is about. A first transactional producer takes that line here."""
    from broker.transactions import TransactionalPublisher

    publisher = TransactionalPublisher(bootstrap, f"warm-up-{time.monotonic_ns()}")
    try:
        publisher.init(60)
    finally:
        publisher.close()


ROOT = Path(__file__).resolve().parents[2]
# What the docs' cluster command names that a local run on this machine replaces: the master, the connector (Maven
# Central -> the jars of our Maven cache), the workers' Python and their copy of our code (both this interpreter).
CLUSTER_ONLY = {"--master", "--packages", "--py-files"}
# A short-lived JVM on 2 shared cores: the C1 compiler alone and one GC thread start it for far less CPU.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def documented_spark_submit() -> tuple[list[str], list[str]]:
    """The spark-submit line of docs/spark-jobs.md ("On a cluster"): its launcher options and the entry point."""
    text = (ROOT / "docs" / "spark-jobs.md").read_text()
    block = text[text.index("    spark-submit \\"):].split("\n\n")[0]
    argv = shlex.split(block.replace("\\\n", " "))
    script = next(i for i, arg in enumerate(argv) if arg.endswith(".py"))
    return argv[1:script], argv[script:script + 1]


def test_the_documented_spark_submit_of_a_job_writes_no_info_line(kafka: BrokerState, topic_prefix: str,
                                                                  tmp_path: Path) -> None:
    """spark-submit's driver JVM is started by the launcher, not by the session: the docs' command points it at the
    shipped log4j2 file (deploy/spark-log4j2.properties) or it writes ~80 INFO lines before the job runs."""
    import pyspark

    from broker.jars import ensure_spark_jars
    from spark_jobs.session import connector_jars, pyspark_jars_dir

    names = TopicNames(topic_prefix)
    ensure_topics(kafka.bootstrap_servers, [names.events("sensors"), names.late("sensors")])
    options, entry_point = documented_spark_submit()
    pairs = list(zip(options[0::2], options[1::2], strict=True))
    kept = [arg for flag, value in pairs if flag not in CLUSTER_ONLY and not value.startswith("spark.pyspark.python=")
            for arg in (flag, f"{value} {QUICK_JVM}" if flag == "--driver-java-options" else value)]
    assert "--driver-java-options" in kept
    jars = ",".join(str(j) for j in connector_jars(ensure_spark_jars(), pyspark_jars_dir()))
    command = [str(Path(pyspark.__file__).parent / "bin" / "spark-submit"), "--master", "local[2]", "--jars", jars,
               "--conf", f"spark.pyspark.python={sys.executable}", "--conf", "spark.ui.enabled=false", *kept,
               *entry_point, "window-count", "--bootstrap", kafka.bootstrap_servers, "--prefix", topic_prefix,
               "--stream", "sensors", "--available-now", "--checkpoint", str(tmp_path / "checkpoint")]
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k not in ("SKEWLESS_SPARK_MASTER", "PYSPARK_PYTHON", "SPARK_HOME")}
    done = subprocess.run(command, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=150,
                          check=False, env={**env, "SPARK_LOCAL_IP": "127.0.0.1", "TMPDIR": str(tmp_path)})
    elapsed_s = time.monotonic() - started
    lines = done.stderr.splitlines()
    info = [line for line in lines if " INFO " in line]
    print(f"spark-submit job: exit {done.returncode} in {elapsed_s:.1f} s, {len(lines)} stderr lines, "
          f"{len(info)} INFO")
    assert done.returncode == 0, done.stderr[-6000:]
    assert info == [], f"{len(info)} INFO lines, e.g. {info[:3]}"
    assert not [line for line in lines if "py4j" in line or "Traceback" in line]
    assert set(lines) <= {JVM_NOTE}, lines


def test_the_shipped_log4j2_file_is_what_a_bare_run_generates_at_the_default_level() -> None:
    import logging

    from spark_jobs.session import log4j2_properties

    shipped = (ROOT / "deploy" / "spark-log4j2.properties").read_text().splitlines(keepends=True)
    assert "".join(line for line in shipped if not line.startswith("#")) == log4j2_properties(logging.INFO, False)
