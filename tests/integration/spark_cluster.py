"""A real Spark standalone cluster on loopback for tests: one master and N workers started with pyspark's own
launch script (bin/spark-class), logs in a directory of the test, torn down (with the executors the workers
started) however the test ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from broker.netutil import free_tcp_port

LOOPBACK = "127.0.0.1"
STARTUP_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0


def pyspark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


@dataclass
class SparkCluster:
    master_url: str
    """spark://127.0.0.1:<port>, for spark-submit --master."""
    webui_port: int
    log_dir: Path
    worker_dirs: list[Path] = field(default_factory=list)
    """Each worker's --work-dir: one directory per application that ran an executor there."""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def apps_on_worker(self, index: int) -> set[str]:
        return {p.name for p in self.worker_dirs[index].glob("app-*")}

    def state(self) -> dict[str, Any]:
        """The master's own view (the JSON behind its web UI): workers, running and completed applications."""
        with urllib.request.urlopen(f"http://{LOOPBACK}:{self.webui_port}/json", timeout=5) as response:
            state: dict[str, Any] = orjson.loads(response.read())
        return state

    def alive_workers(self) -> int:
        return sum(1 for worker in self.state().get("workers", []) if worker.get("state") == "ALIVE")

    def logs(self, tail_chars: int = 3000) -> str:
        """The tail of every process log: what a failed start or job shows."""
        return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-tail_chars:]}"
                         for path in sorted(self.log_dir.glob("*.log")))


def _daemon_env() -> dict[str, str]:
    env = dict(os.environ)
    # Loopback only, and small daemons: the machine is shared with the broker and the jobs' own JVMs.
    # The C1 compiler alone and one GC thread: daemons that live for one test module barely need more.
    env.update(SPARK_LOCAL_IP=LOOPBACK, SPARK_DAEMON_MEMORY="256m", SPARK_HOME=str(pyspark_home()),
               SPARK_DAEMON_JAVA_OPTS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    return env


def _start(cluster: SparkCluster, name: str, args: list[str]) -> None:
    with (cluster.log_dir / f"{name}.log").open("wb") as log:
        # Own session: the group holds the daemon's JVM and, for a worker, the executors and Python workers it
        # starts, so teardown reaches every one of them and nothing else.
        process = subprocess.Popen([str(pyspark_home() / "bin" / "spark-class"), *args], stdout=log,
                                   stderr=subprocess.STDOUT, env=_daemon_env(), start_new_session=True)
    cluster.processes.append(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, STOP_TIMEOUT_S)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        # The daemon is gone; its executors (same group) may still be shutting down.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        return


@contextlib.contextmanager
def standalone_cluster(work_dir: Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> Iterator[SparkCluster]:
    """Master and workers on 127.0.0.1 with free ports; yields once every worker registered ALIVE."""
    log_dir = work_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    master_port, webui_port = free_tcp_port(LOOPBACK), free_tcp_port(LOOPBACK)
    cluster = SparkCluster(f"spark://{LOOPBACK}:{master_port}", webui_port, log_dir)
    try:
        _start(cluster, "master", ["org.apache.spark.deploy.master.Master", "--host", LOOPBACK,
                                   "--port", str(master_port), "--webui-port", str(webui_port)])
        for index in range(workers):
            cluster.worker_dirs.append(work_dir / f"worker-{index}")
            _start(cluster, f"worker-{index}", [
                "org.apache.spark.deploy.worker.Worker", cluster.master_url, "--cores", str(cores),
                "--memory", memory, "--host", LOOPBACK, "--webui-port", str(free_tcp_port(LOOPBACK)),
                "--work-dir", str(cluster.worker_dirs[index])])
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            exited = [p.args for p in cluster.processes if p.poll() is not None]
            if exited:
                raise RuntimeError(f"a Spark daemon exited during startup: {exited}\n{cluster.logs()}")
            with contextlib.suppress(OSError):
                if cluster.alive_workers() == workers:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{workers} workers not ALIVE after {STARTUP_TIMEOUT_S} s\n{cluster.logs()}")
            time.sleep(0.5)
        yield cluster
    finally:
        # Workers first: a worker that loses its master keeps retrying to reconnect and logs it.
        for process in reversed(cluster.processes):
            _stop(process)
