"""Network faults without sch_netem: a userspace packet relay between a client network namespace and the host.

    client netns                       relay process                       host netns (gateway, Kafka)
    10.213.<n>.2 ── tun skrc<n> ──▶  delay ± jitter, loss, duplication,  ──▶ tun skrg<n> ── 10.213.<n>.1
                                   ◀── reordering, partition (blackhole) ◀──

The relay opens one TUN device inside the client namespace (setns) and one in the host namespace, and forwards raw
IP packets between them through a timer heap, so the kernels at both ends run real TCP (retransmits, duplicate
ACKs, out-of-order queues) over an impaired link. The devices are not persistent: they vanish with the relay.
Commands on stdin: `partition on`, `partition off`, `stats` (a JSON line on stdout).

This kernel has no sch_netem and the host has no iptables/nft, so a partition is the relay dropping every packet.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import heapq
import json
import os
import random
import select
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000


def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({path})")
    finally:
        os.close(fd)


def _open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


@dataclass
class Impairment:
    delay_us: int = 0
    jitter_us: int = 0
    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    reorder_extra_us: int = 5_000

    def describe(self) -> str:
        return (f"delay {self.delay_us / 1000:g} ms ± {self.jitter_us / 1000:g} ms, loss {self.loss:.1%}, "
                f"duplication {self.duplicate:.1%}, reordering {self.reorder:.1%} (+{self.reorder_extra_us / 1000:g}"
                " ms)")


def relay_main(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    host_ns = os.open("/proc/self/ns/net", os.O_RDONLY)
    _setns(f"/var/run/netns/{args.netns}")
    client_fd = _open_tun(args.client_tun)
    ctypes.CDLL(None, use_errno=True).setns(host_ns, CLONE_NEWNET)
    os.close(host_ns)
    host_fd = _open_tun(args.host_tun)
    imp = Impairment(args.delay_us, args.jitter_us, args.loss, args.duplicate, args.reorder, args.reorder_extra_us)
    stats = {"forwarded": 0, "lost": 0, "duplicated": 0, "reordered": 0, "partition_dropped": 0}
    partitioned = False
    heap: list[tuple[float, int, int, bytes]] = []
    counter = 0
    peer = {client_fd: host_fd, host_fd: client_fd}
    print("ready", flush=True)
    stdin = sys.stdin.fileno()
    while True:
        now = time.monotonic()
        while heap and heap[0][0] <= now:
            _, _, out_fd, packet = heapq.heappop(heap)
            with contextlib.suppress(OSError):
                os.write(out_fd, packet)
        timeout = max(0.0, heap[0][0] - time.monotonic()) if heap else 0.5
        ready, _, _ = select.select([client_fd, host_fd, stdin], [], [], timeout)
        for fd in ready:
            if fd == stdin:
                line = sys.stdin.readline()
                if not line:
                    return
                command = line.strip()
                if command == "partition on":
                    partitioned = True
                elif command == "partition off":
                    partitioned = False
                print(json.dumps({"stats": stats, "partitioned": partitioned}), flush=True)
                continue
            for _ in range(64):
                try:
                    packet = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if partitioned:
                    stats["partition_dropped"] += 1
                    continue
                if rng.random() < imp.loss:
                    stats["lost"] += 1
                    continue
                delay = imp.delay_us + rng.uniform(-imp.jitter_us, imp.jitter_us)
                if rng.random() < imp.reorder:
                    delay += imp.reorder_extra_us
                    stats["reordered"] += 1
                copies = 2 if rng.random() < imp.duplicate else 1
                stats["duplicated"] += copies - 1
                for copy in range(copies):
                    counter += 1
                    due = time.monotonic() + max(0.0, delay + copy * 300) / 1e6
                    heapq.heappush(heap, (due, counter, peer[fd], packet))
                stats["forwarded"] += 1


def netns_unavailable() -> str | None:
    """Why the lab cannot run here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing"
    probe = subprocess.run(["ip", "netns", "add", "skrel_probe"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"cannot create a network namespace: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", "skrel_probe"], capture_output=True, check=False)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class NetLab:
    """One client namespace behind one relay. `client_prefix` runs a command inside the namespace."""

    index: int
    impairment: Impairment
    seed: int = 1
    relay: subprocess.Popen[str] | None = None
    created: list[str] = field(default_factory=list)

    @property
    def netns(self) -> str:
        return f"skrel_c{self.index}"

    @property
    def gateway_ip(self) -> str:
        return f"10.213.{self.index}.1"

    @property
    def client_ip(self) -> str:
        return f"10.213.{self.index}.2"

    @property
    def client_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns]

    def up(self) -> None:
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, check=False)
        _ip("netns", "add", self.netns)
        self.created.append(self.netns)
        _ip("-n", self.netns, "link", "set", "lo", "up")
        client_tun, host_tun = f"skrc{self.index}", f"skrg{self.index}"
        imp = self.impairment
        self.relay = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.netfault", "relay", "--netns", self.netns, "--client-tun",
             client_tun, "--host-tun", host_tun, "--delay-us", str(imp.delay_us), "--jitter-us", str(imp.jitter_us),
             "--loss", str(imp.loss), "--duplicate", str(imp.duplicate), "--reorder", str(imp.reorder),
             "--reorder-extra-us", str(imp.reorder_extra_us), "--seed", str(self.seed)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        assert self.relay.stdout is not None
        line = self.relay.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"relay did not start: {line!r}")
        _ip("-n", self.netns, "addr", "add", self.client_ip, "peer", self.gateway_ip, "dev", client_tun)
        _ip("-n", self.netns, "link", "set", client_tun, "up")
        _ip("addr", "add", self.gateway_ip, "peer", self.client_ip, "dev", host_tun)
        _ip("link", "set", host_tun, "up")

    def command(self, text: str) -> dict[str, object]:
        assert self.relay is not None and self.relay.stdin is not None and self.relay.stdout is not None
        self.relay.stdin.write(text + "\n")
        self.relay.stdin.flush()
        reply: dict[str, object] = json.loads(self.relay.stdout.readline())
        return reply

    def down(self) -> None:
        if self.relay is not None:
            if self.relay.stdin is not None:
                with contextlib.suppress(OSError):
                    self.relay.stdin.close()
            try:
                self.relay.wait(5)
            except subprocess.TimeoutExpired:
                self.relay.kill()
                self.relay.wait()
        for ns in self.created:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        self.created.clear()


@contextlib.contextmanager
def netlab(index: int, impairment: Impairment, seed: int = 1) -> Iterator[NetLab]:
    lab = NetLab(index, impairment, seed)
    try:
        lab.up()
        yield lab
    finally:
        lab.down()


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    relay = sub.add_parser("relay")
    relay.add_argument("--netns", required=True)
    relay.add_argument("--client-tun", required=True)
    relay.add_argument("--host-tun", required=True)
    relay.add_argument("--delay-us", type=int, default=0)
    relay.add_argument("--jitter-us", type=int, default=0)
    relay.add_argument("--loss", type=float, default=0.0)
    relay.add_argument("--duplicate", type=float, default=0.0)
    relay.add_argument("--reorder", type=float, default=0.0)
    relay.add_argument("--reorder-extra-us", type=int, default=5_000)
    relay.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    relay_main(args)


if __name__ == "__main__":
    main()
