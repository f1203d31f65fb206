"""Real processes for the reliability campaign and the benchmarks: a `skewless gateway` process that can be killed
and restarted on its ports, HTTP probes of its /metrics and /healthz, exactly-once reads of a stream, /proc readings,
and the one way to stop a helper process.
tests/reliability/ and benchmarks/ share these (the test suite imports them; nothing here imports the tests).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from broker.reader import read_stream
from contract.topics import TopicNames
from gateway.launch import GatewayLaunchError, spawn_gateway_async

REPO = Path(__file__).resolve().parents[2]


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


@dataclass
class GatewayProcess:
    """`skewless gateway` as its own process (so it can be SIGKILLed), on fixed ports so a restart keeps them.

    A port left 0 is the gateway's to pick at its first start (read from its ready lines), then kept for restarts:
    a port picked here and bound by the gateway later could meanwhile be taken as the local port of any outgoing
    connection on the machine (a CI run once lost a test to that)."""

    bootstrap: str
    prefix: str
    log_dir: Path
    port: int = 0
    metrics_port: int = 0
    host: str = "127.0.0.1"
    timesync_port: int | None = None
    extra_args: Sequence[str] = ()
    netns_prefix: Sequence[str] = ()
    process: asyncio.subprocess.Process | None = None
    starts: int = 0
    drainers: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self, timeout_s: float = 60.0) -> None:
        self.starts += 1
        args = ["--host", self.host, "--port", str(self.port), "--bootstrap", self.bootstrap, "--prefix", self.prefix,
                "--metrics-port", str(self.metrics_port), *self.extra_args]
        if self.timesync_port is None:
            args.append("--no-timesync")
        else:
            args += ["--timesync-port", str(self.timesync_port)]
        stderr = (self.log_dir / f"gateway-{self.starts}.log").open("wb")
        try:
            self.process, addresses = await spawn_gateway_async(
                args, wrapper=self.netns_prefix, env=child_env(), cwd=REPO, stderr=stderr, timeout_s=timeout_s)
        except GatewayLaunchError as exc:
            raise AssertionError(f"{exc}; see {self.log_dir}") from exc
        finally:
            stderr.close()
        self.port = addresses.port
        if addresses.metrics_port is not None:
            self.metrics_port = addresses.metrics_port
        if self.timesync_port is not None and addresses.timesync_port is not None:
            self.timesync_port = addresses.timesync_port
        # Keep draining stdout so the gateway never blocks on a full pipe.
        self.drainers.append(asyncio.get_running_loop().create_task(self._drain_stdout()))

    async def _drain_stdout(self) -> None:
        process = self.process
        if process is None or process.stdout is None:
            return
        while await process.stdout.readline():
            pass

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def kill(self) -> None:
        """SIGKILL: no flush, no checkpoint, no goodbye."""
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
            await self.process.wait()

    async def stop(self) -> str:
        """SIGTERM (graceful), returns the gateway's log."""
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(30):
                    await self.process.wait()
            except TimeoutError:
                await self.kill()
        return self.log()

    def log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("gateway-*.log")))

    async def health(self) -> tuple[int, dict[str, Any]]:
        return await http_get_json(self.host, self.metrics_port, "/healthz")

    async def metrics(self) -> dict[str, float]:
        status, body = await http_get(self.host, self.metrics_port, "/metrics")
        assert status == 200
        values: dict[str, float] = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, _, value = line.partition(" ")
                values[name.removesuffix("_total")] = float(value)
        return values


async def http_get(host: str, port: int, path: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    async with asyncio.timeout(timeout_s):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
            data = await reader.read()
        finally:
            writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def http_get_json(host: str, port: int, path: str, timeout_s: float = 5.0) -> tuple[int, dict[str, Any]]:
    status, body = await http_get(host, port, path, timeout_s)
    return status, orjson.loads(body)


@dataclass
class Delivery:
    """What Kafka holds for one stream, and the exactly-once verdict per source."""

    events: list[dict[str, Any]]
    late: list[dict[str, Any]]

    def seqs(self, source_id: str) -> list[int]:
        return [r["seq"] for r in self.events if r["source_id"] == source_id]

    def lost(self, source_id: str, n: int) -> int:
        return len(self.missing(source_id, n))

    def missing(self, source_id: str, n: int) -> list[int]:
        """The seqs below ``n`` of the source on neither topic."""
        seen = {r["seq"] for r in self.events + self.late if r["source_id"] == source_id}
        return sorted(set(range(n)) - seen)

    def around_missing(self, source_id: str, n: int, width: int = 3) -> dict[int, list[dict[str, Any]]]:
        """For each missing seq of the source: the records of its neighbours (seq +- ``width``) on either topic,
        with everything they carry, so that a loss can be read from a failure message."""
        records = [r for r in self.events + self.late if r["source_id"] == source_id]
        return {seq: [r for r in records if abs(r["seq"] - seq) <= width] for seq in self.missing(source_id, n)}

    def duplicated(self, source_id: str) -> int:
        counts = Counter(r["seq"] for r in self.events + self.late if r["source_id"] == source_id)
        return sum(c - 1 for c in counts.values() if c > 1)

    def summary(self, expected: dict[str, int]) -> dict[str, Any]:
        return {"events_expected": sum(expected.values()), "events_in_kafka": len(self.events),
                "late_records": len(self.late),
                "lost": sum(self.lost(s, n) for s, n in expected.items()),
                "duplicated": sum(self.duplicated(s) for s in expected),
                "sources_in_exact_seq_order": sum(self.seqs(s) == list(range(n)) for s, n in expected.items()),
                "sources": len(expected)}

    def assert_exactly_once_in_order(self, expected: dict[str, int]) -> None:
        summary = self.summary(expected)
        assert summary["lost"] == 0, summary
        assert summary["duplicated"] == 0, summary
        for source_id, n in expected.items():
            assert self.seqs(source_id) == list(range(n)), (source_id, summary)
        assert len(self.events) == sum(expected.values()), summary


def read_delivery(bootstrap: str, prefix: str, stream: str) -> Delivery:
    topics = TopicNames(prefix)
    events, _punctuations = read_stream(bootstrap, topics.events(stream))
    late, _ = read_stream(bootstrap, topics.late(stream), timeout_s=10.0)
    return Delivery(events, late)


# ----------------------------------------------------------------------------------------------- /proc readings

CLK_TCK = os.sysconf("SC_CLK_TCK")


def stat_fields(stat: str) -> list[str]:
    """The fields of a /proc/PID/stat line after the command name, from the state (field 3) on. The command name is
    in parentheses and may itself hold spaces and ')', so the fields are counted after the last ')'."""
    return stat.rsplit(")", 1)[1].split()


def stat_command(stat: str) -> str:
    """The command name (field 2) of a /proc/PID/stat line, without its parentheses."""
    return stat[stat.index("(") + 1:stat.rindex(")")]


def stat_parent(stat: str) -> int:
    """The parent pid (field 4) of a /proc/PID/stat line."""
    return int(stat_fields(stat)[1])


def stat_cpu_ticks(stat: str) -> int:
    """utime + stime (clock ticks) of a /proc/PID/stat line: the process's own, not its children's."""
    fields = stat_fields(stat)
    return int(fields[11]) + int(fields[12])


def machine_ticks(proc_stat_cpu: str) -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs from the aggregate ``cpu`` line of /proc/stat (user nice system idle
    iowait irq softirq steal ...): total sums the first eight (guest time is already inside user), busy is total
    less idle and iowait."""
    name, *fields = proc_stat_cpu.split()
    if name != "cpu":
        raise ValueError(f"not the aggregate cpu line of /proc/stat: {proc_stat_cpu!r}")
    ticks = [int(f) for f in fields[:8]]
    total = sum(ticks)
    return total - ticks[3] - ticks[4], total


def process_tree(root: int, parent_of: Mapping[int, int]) -> list[int]:
    """``root`` and every descendant of it in ``parent_of`` (pid -> parent pid), root first, then in pid order."""
    children: dict[int, list[int]] = {}
    for pid, parent in parent_of.items():
        children.setdefault(parent, []).append(pid)
    below: set[int] = set()
    frontier = [root]
    while frontier:
        frontier = [pid for parent in frontier for pid in children.get(parent, ()) if pid not in below | {root}]
        below.update(frontier)
    return [root, *sorted(below)]


def proc_stat(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (all its threads)."""
    return stat_cpu_ticks(proc_stat(pid)) / CLK_TCK


def live_stats() -> dict[int, str]:
    """pid -> /proc/PID/stat line of every live process (ones that exit while /proc is read are skipped)."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stats[int(entry)] = proc_stat(int(entry))
            except OSError:
                continue
    return stats


def _parents(stats: Mapping[int, str]) -> dict[int, int]:
    parents = {}
    for pid, stat in stats.items():
        try:
            parents[pid] = stat_parent(stat)
        except (IndexError, ValueError):
            continue
    return parents


def parents_now() -> dict[int, int]:
    """pid -> parent pid of every live process."""
    return _parents(live_stats())


def tree_cpu_s(root: int) -> dict[int, tuple[str, float]]:
    """pid -> (command name, CPU seconds) of ``root`` and of every live descendant, from one read of /proc."""
    stats = live_stats()
    tree = process_tree(root, _parents(stats))
    return {pid: (stat_command(stats[pid]), stat_cpu_ticks(stats[pid]) / CLK_TCK) for pid in tree if pid in stats}


class TreeCpuSampler:
    """CPU seconds per process of ``root`` and of its descendants, sampled every ``interval_s`` by a thread: a
    process that exits meanwhile (Spark stops idle Python workers) keeps what it had used at its last sample."""

    def __init__(self, root: int, interval_s: float = 0.2) -> None:
        self.root = root
        self.start = tree_cpu_s(root)
        self.last = dict(self.start)
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> None:
        self.last.update(tree_cpu_s(self.root))

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.sample()

    def stop(self) -> None:
        """Stops the thread, then takes a last sample."""
        self._stop.set()
        self._thread.join()
        self.sample()

    def used_s(self, pid: int) -> float:
        """CPU seconds ``pid`` used since the sampler started (a process started since: all it used)."""
        return self.last[pid][1] - self.start.get(pid, ("", 0.0))[1]


def machine_cpu_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of every core of the machine since boot (all processes, ours and others')."""
    with open("/proc/stat") as stat:
        busy, total = machine_ticks(stat.readline())
    return busy / CLK_TCK, total / CLK_TCK


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def stop_process(process: subprocess.Popen[Any], timeout_s: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited after ``timeout_s``; returns once it is reaped."""
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def jit_compiler_cpu_s(pid: int) -> float:
    """CPU seconds a JVM's JIT compiler threads (HotSpot's "C1/C2 CompilerThread<n>") have used so far: a broker
    still compiling runs them for milliseconds at a stretch."""
    total_ticks = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if "CompilerThre" in (task / "comm").read_text():
                total_ticks += stat_cpu_ticks((task / "stat").read_text())
        except OSError:  # the thread ended meanwhile
            continue
    return total_ticks / CLK_TCK
