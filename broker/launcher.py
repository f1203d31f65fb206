"""Run a single-node Apache Kafka broker in KRaft mode from the official Maven Central jars.

The broker is a plain JVM process (`kafka.Kafka`) on loopback; its storage is formatted by Kafka's own
StorageTool. State (pid, ports) is kept in `<work_dir>/broker.json` so `skewless kafka stop|status` can find it.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from broker.jars import ensure_kafka_jars
from broker.netutil import ensure_tcp_port_free, free_tcp_port, wait_for_tcp
from broker.paths import RESOURCES_DIR, cache_dir

DEFAULT_HEAP_MB = 512
READY_TIMEOUT_S = 90.0


class BrokerError(RuntimeError):
    pass


@dataclass(frozen=True)
class BrokerState:
    pid: int
    host: str
    port: int
    controller_port: int
    work_dir: str

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"


def default_work_dir() -> Path:
    return cache_dir() / "kafka"


def _server_properties(host: str, port: int, controller_port: int, log_dir: Path,
                       group_min_session_timeout_ms: int | None = None) -> str:
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{host}:{controller_port}",
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(log_dir),
        "num.partitions": "1",
        # Topics are created explicitly with the contract's settings; a typo must not create a stray topic.
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "log.retention.hours": "24",
    }
    if group_min_session_timeout_ms is not None:
        # Kafka's default floor is 6 s: a gateway's session_timeout_s below it is refused when it joins its group.
        settings["group.min.session.timeout.ms"] = str(group_min_session_timeout_ms)
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home) / "bin" / "java" if java_home else None
    if candidate is not None and candidate.exists():
        return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise BrokerError("java (17+) is required to run the Kafka broker")
    return found


def _kafka_cluster_id() -> str:
    # Kafka's Uuid text form: url-safe base64 of 16 random bytes, unpadded. Like Kafka's own Uuid.randomUuid,
    # redraw ids that start with "-": a command-line parser reads those as an option (1 run in 64 failed on it).
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class KafkaBroker:
    """One broker process; `start()` formats fresh storage unless the work dir already has a formatted one."""

    def __init__(self, work_dir: Path | None = None, host: str = "127.0.0.1", port: int | None = None,
                 heap_mb: int = DEFAULT_HEAP_MB, group_min_session_timeout_ms: int | None = None) -> None:
        self.work_dir = (work_dir or default_work_dir()).resolve()
        self.host = host
        self.port = port
        self.heap_mb = heap_mb
        self.group_min_session_timeout_ms = group_min_session_timeout_ms
        self._process: subprocess.Popen[bytes] | None = None
        self._last_state: BrokerState | None = None

    @property
    def state_file(self) -> Path:
        return self.work_dir / "broker.json"

    def read_state(self) -> BrokerState | None:
        try:
            return BrokerState(**json.loads(self.state_file.read_text()))
        except (FileNotFoundError, json.JSONDecodeError, TypeError):
            return None

    def running_state(self) -> BrokerState | None:
        state = self.read_state()
        if state is None or not _pid_alive(state.pid):
            return None
        return state

    def start(self, ready_timeout_s: float = READY_TIMEOUT_S) -> BrokerState:
        existing = self.running_state()
        if existing is not None:
            return existing
        if self.port:
            # Checked before anything starts: a broker on a taken port only fails its readiness wait, 90 s later.
            ensure_tcp_port_free(self.host, self.port)
        jars = ensure_kafka_jars()
        port = self.port or free_tcp_port(self.host)
        controller_port = free_tcp_port(self.host)
        data_dir = self.work_dir / "data"
        logs_dir = self.work_dir / "logs"
        # Ports change between runs, so each start writes a new config and formats fresh storage.
        if data_dir.exists():
            shutil.rmtree(data_dir)
        data_dir.mkdir(parents=True)
        logs_dir.mkdir(parents=True, exist_ok=True)
        config = self.work_dir / "server.properties"
        config.write_text(_server_properties(self.host, port, controller_port, data_dir,
                                             self.group_min_session_timeout_ms))
        base = self._java_command(jars, logs_dir)
        formatted = subprocess.run(
            [*base, "kafka.tools.StorageTool", "format", f"--cluster-id={_kafka_cluster_id()}", f"--config={config}"],
            capture_output=True, text=True, check=False,
        )
        if formatted.returncode != 0:
            raise BrokerError(f"formatting KRaft storage failed:\n{formatted.stdout}{formatted.stderr}")
        return self._launch(base, config, BrokerState(0, self.host, port, controller_port, str(self.work_dir)),
                            ready_timeout_s)

    def restart(self, ready_timeout_s: float = READY_TIMEOUT_S) -> BrokerState:
        """Start the broker again after `stop()`, on the same ports and the same storage: a broker outage, not a
        new cluster (topics, offsets and idempotent-producer state survive)."""
        if self.running_state() is not None:
            raise BrokerError("the broker is still running: stop() it first")
        last = self._last_state
        config = self.work_dir / "server.properties"
        if last is None or not config.exists():
            raise BrokerError("nothing to restart: start() this broker first")
        base = self._java_command(ensure_kafka_jars(), self.work_dir / "logs")
        return self._launch(base, config, last, ready_timeout_s)

    def _launch(self, base: list[str], config: Path, planned: BrokerState, ready_timeout_s: float) -> BrokerState:
        logs_dir = self.work_dir / "logs"
        with (logs_dir / "stdout.log").open("ab") as out:
            self._process = subprocess.Popen(
                [*base, "kafka.Kafka", str(config)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        state = BrokerState(self._process.pid, planned.host, planned.port, planned.controller_port,
                            planned.work_dir)
        self.state_file.write_text(json.dumps(asdict(state)))
        self._last_state = state
        if not self._wait_ready(state, ready_timeout_s):
            self.stop()
            raise BrokerError(f"broker not ready within {ready_timeout_s}s; see {logs_dir / 'server.log'}")
        return state

    def _java_command(self, jars: Path, logs_dir: Path) -> list[str]:
        return [
            _java(), f"-Xms{self.heap_mb // 2}m", f"-Xmx{self.heap_mb}m", "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dkafka.logs.dir={logs_dir}",
            f"-Dlog4j2.configurationFile={RESOURCES_DIR / 'kafka-log4j2.properties'}",
            "-cp", f"{jars}/*",
        ]

    def _wait_ready(self, state: BrokerState, timeout_s: float) -> bool:
        from broker.client import KafkaClientConfig

        deadline = time.monotonic() + timeout_s
        if not wait_for_tcp(state.host, state.port, timeout_s):
            return False
        admin = KafkaClientConfig(state.bootstrap_servers).admin()
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                return False
            try:
                metadata = admin.list_topics(timeout=2)
            except Exception:  # noqa: BLE001 - any metadata failure just means "not ready yet"
                time.sleep(0.2)
                continue
            if metadata.brokers:
                return True
        return False

    def stop(self, timeout_s: float = 30.0) -> bool:
        """SIGTERM for a clean controlled shutdown, SIGKILL only if it hangs. Returns True if one was running."""
        state = self.read_state()
        pid = state.pid if state else (self._process.pid if self._process else None)
        if pid is None or not _pid_alive(pid):
            self.state_file.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _pid_alive(pid):
            self._reap()
            time.sleep(0.1)
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        self._reap()
        self.state_file.unlink(missing_ok=True)
        return True

    def _reap(self) -> None:
        if self._process is not None:
            self._process.poll()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); treat it as gone.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"
