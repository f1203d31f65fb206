"""The time-sync server over real loopback sockets, with ntplib, ntpdig/sntp, ntpdate and chronyd.

External binaries come from scripts/install-ntp-tools.sh; a test skips (saying why) only when its
binary is missing, or, for sntp/ntpdate (which only talk to port 123), when port 123 cannot be
bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator

import pytest

from tests.conditions import wait_until
from timesync.client import PeriodicSync, TimeSyncError, sync_burst
from timesync.codec import NtpPacket, encode_packet, unix_us_to_ntp
from timesync.responder import ResponderConfig
from timesync.server import ServerConfig, TimeSyncServer, start_server
from timesync.store import SourceInfoStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SHIFT_US = 250_000
HOUR_US = 3_600_000_000


@pytest.fixture
async def server() -> AsyncIterator[TimeSyncServer]:
    srv = await start_server(
        ServerConfig(host="127.0.0.1", port=0, clock_offset_us=SHIFT_US), store=SourceInfoStore()
    )
    try:
        yield srv
    finally:
        await srv.close()


def _ntplib_offset_s(port: int) -> float:
    import ntplib

    return float(ntplib.NTPClient().request("127.0.0.1", version=3, port=port, timeout=2).offset)


async def test_ntplib_measures_the_shift(server: TimeSyncServer) -> None:
    _, port = server.address
    offsets = [await asyncio.to_thread(_ntplib_offset_s, port) for _ in range(3)]
    best = min(offsets, key=lambda o: abs(o * 1e6 - SHIFT_US))
    assert abs(best * 1e6 - SHIFT_US) < 2_000
    assert server.responder.stats.replied == 3


def _source_clock(offset_us: int, skew_ppm: float):  # type: ignore[no-untyped-def]
    """Source clock = system clock - true offset (true offset grows with skew)."""
    t0 = time.time_ns() // 1000

    def clock() -> int:
        now = time.time_ns() // 1000
        return now - round(offset_us + skew_ppm * 1e-6 * (now - t0))

    return clock


async def test_sync_burst_registers_source_one_hour_off(server: TimeSyncServer) -> None:
    _, port = server.address
    clock = _source_clock(-HOUR_US, 0.0)
    est = await sync_burst("127.0.0.1", port, "sensor-1", clock, count=10)
    true_offset = -HOUR_US + SHIFT_US  # source runs an hour ahead; t_ref = t_source + offset
    assert abs(est.offset_us - true_offset) < 1_000
    # The burst's last report may still be on its way to the server.
    await wait_until(lambda: server.responder.stats.samples_registered >= 10, what="10 registered samples")
    info = server.store["sensor-1"]
    assert info.sample_count == 10
    assert abs(info.offset_us - true_offset) < 1_000
    assert abs(info.offset_us - true_offset) <= info.error_bound_us(info.last_sync_us)
    assert info.rtt_us == server.store.max_rtt_us(["sensor-1"]) > 0
    assert server.responder.stats.samples_registered == 10
    if sys.platform == "linux":
        assert server.kernel_timestamps_enabled
        assert server.stats.kernel_timestamps >= 10


async def test_periodic_sync_resyncs_in_background(server: TimeSyncServer) -> None:
    _, port = server.address
    seen = []
    sync = PeriodicSync(
        "127.0.0.1", port, "sensor-2", _source_clock(5_000, 50.0), count=4, interval_s=0.15,
        on_estimate=seen.append,
    )
    async with sync:
        assert sync.estimate is not None
        for _ in range(100):
            if sync.bursts_ok >= 3:
                break
            await asyncio.sleep(0.05)
    assert not sync.running
    assert sync.bursts_ok >= 3 and len(seen) == sync.bursts_ok

    def three_bursts_registered() -> bool:
        est = server.responder.estimator("sensor-2")
        return est is not None and est.burst_count >= 3

    await wait_until(three_bursts_registered, what="three bursts registered")


async def test_sync_burst_fails_cleanly_without_server() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TimeSyncError):
        await sync_burst("127.0.0.1", port, "lonely", count=2, timeout_s=0.05)


async def test_garbage_and_floods_are_dropped_and_service_continues() -> None:
    srv = await start_server(
        ServerConfig(host="127.0.0.1", port=0, responder=ResponderConfig(rate_limit_per_s=50, rate_limit_burst=50))
    )
    try:
        _, port = srv.address
        good = encode_packet(NtpPacket(version=4, mode=3, transmit_ts=unix_us_to_ntp(time.time_ns() // 1000)))
        junk = [b"", b"x", b"\x23" * 47, b"\x23" * 1500, encode_packet(NtpPacket(version=4, mode=4, transmit_ts=1)),
                encode_packet(NtpPacket(version=7, mode=3, transmit_ts=1))]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.setblocking(False)
            for d in junk:
                s.sendto(d, ("127.0.0.1", port))
            await asyncio.sleep(0.05)
            for _ in range(300):  # a flood from one address
                with contextlib.suppress(BlockingIOError):
                    s.sendto(good, ("127.0.0.1", port))
            await asyncio.sleep(0.2)
            replies = 0
            while True:
                try:
                    reply = s.recv(2048)
                except BlockingIOError:
                    break
                assert len(reply) == 48
                replies += 1
        st = srv.responder.stats
        assert st.dropped_short == 3 and st.dropped_long == 1
        assert st.dropped_mode == 1 and st.dropped_version == 1
        # The kernel may drop part of the flood before the server reads it; whatever arrived beyond
        # the bucket (50 + refill) was rate limited.
        assert st.dropped_rate_limited > 0
        assert st.replied <= 60 and replies <= 60
        # The server keeps serving (another address / after refill).
        await asyncio.sleep(0.1)
        offset = await asyncio.to_thread(_ntplib_offset_s, port)
        assert abs(offset) < 0.01
    finally:
        await srv.close()


async def test_source_auth_with_hmac() -> None:
    key = bytes(range(32))
    store = SourceInfoStore()
    srv = await start_server(
        ServerConfig(host="127.0.0.1", port=0, responder=ResponderConfig(keys={"signed": key})), store=store
    )
    try:
        _, port = srv.address
        await sync_burst("127.0.0.1", port, "signed", count=3, key=b"not-the-key")
        await sync_burst("127.0.0.1", port, "unknown", count=3)
        await wait_until(lambda: srv.responder.stats.auth_failed >= 6, what="6 refused requests")
        assert store.source_ids() == []
        await sync_burst("127.0.0.1", port, "signed", count=3, key=key)
        await wait_until(lambda: store.source_ids() == ["signed"], what="the signed source registered")
    finally:
        await srv.close()


# -- external clients ---------------------------------------------------------------------------


def _need(binary: str) -> str:
    path = shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/sbin")
    if path is None:
        pytest.skip(f"{binary} not installed (scripts/install-ntp-tools.sh installs it)")
    return path


@pytest.fixture
async def server_on_port_123() -> AsyncIterator[TimeSyncServer]:
    # ntpdig (Debian's sntp) and ntpsec's ntpdate wrapper cannot be told another port. 127.0.0.2 keeps
    # clear of an NTP daemon listening on 127.0.0.1.
    try:
        srv = await start_server(ServerConfig(host="127.0.0.2", port=123, clock_offset_us=-1_500_000))
    except OSError as exc:
        pytest.skip(f"cannot bind 127.0.0.2:123 for sntp/ntpdate ({exc}); needs root and a free port 123")
    try:
        yield srv
    finally:
        await srv.close()


async def _run(*argv: str, timeout_s: float = 30.0) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


_SNTP_LINE = re.compile(r"([+-]\d+\.\d+) \+/- (\d+\.\d+) 127\.0\.0\.2 s1")


@pytest.mark.parametrize("tool", ["sntp", "ntpdate"])
async def test_sntp_and_ntpdate_accept_the_server(tool: str, server_on_port_123: TimeSyncServer) -> None:
    binary = _need(tool)
    argv = [binary, "-t", "2", "127.0.0.2"] if tool == "sntp" else [binary, "-q", "127.0.0.2"]
    rc, out = await _run(*argv)
    assert rc == 0, out
    m = _SNTP_LINE.search(out)
    assert m is not None, out
    assert abs(float(m.group(1)) + 1.5) < 0.005, out


async def test_chronyd_accepts_and_measures_the_shift(server: TimeSyncServer) -> None:
    chronyd = _need("chronyd")
    _, port = server.address
    with tempfile.TemporaryDirectory(prefix="chronyd-") as tmp:
        # -Q: measure only, never touch the clock; directives on the command line replace the
        # system config file; pid file in the temp dir, no command sockets; -t bounds the run.
        rc, out = await _run(
            chronyd, "-Q", "-t", "20", "-u", "root", "-f", "/dev/null",
            f"server 127.0.0.1 port {port} iburst", f"pidfile {tmp}/chronyd.pid", "cmdport 0",
            f"bindcmdaddress {tmp}/chronyd.sock",
            timeout_s=30,
        )
    m = re.search(r"System clock wrong by (-?\d+\.\d+) seconds", out)
    assert m is not None, out
    # chronyd reports how far the local clock is behind the server: our shift.
    assert abs(float(m.group(1)) * 1e6 - SHIFT_US) < 2_000, out
    assert rc == 0, out


async def test_upstream_discipline_follows_a_shifted_upstream(server: TimeSyncServer) -> None:
    from timesync.server import ReferenceClock, UpstreamDiscipline

    _, port = server.address
    clock = ReferenceClock()
    discipline = UpstreamDiscipline(clock, [f"127.0.0.1:{port}", "127.0.0.1:9"], timeout_s=0.3)
    correction = await discipline.poll_once()  # the second upstream is unreachable: tolerated
    assert correction is not None
    assert abs(correction - SHIFT_US) < 2_000
    assert abs(clock.now_us() - (time.time_ns() // 1000 + SHIFT_US)) < 5_000
    offline = UpstreamDiscipline(ReferenceClock(), ["127.0.0.1:9"], timeout_s=0.2)
    assert await offline.poll_once() is None


async def test_event_loop_t2_when_kernel_timestamps_are_off() -> None:
    srv = await start_server(ServerConfig(host="127.0.0.1", port=0, kernel_timestamps=False))
    try:
        _, port = srv.address
        est = await sync_burst("127.0.0.1", port, "loop-t2", count=3)
        assert abs(est.offset_us) < 2_000
        assert not srv.kernel_timestamps_enabled
        assert srv.stats.kernel_timestamps == 0 and srv.stats.loop_timestamps >= 3
    finally:
        await srv.close()
