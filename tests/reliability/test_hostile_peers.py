"""Issue 24 items 4, 5, 8 (keys) and 9 against a real `skewless gateway` process and broker: a peer that floods and
never reads, thousands of sources that only say hello, a source inventing stream names, and a source signing as
another. Each time a well-behaved source streams beside it and must lose nothing, duplicate nothing, and keep its
acks prompt; each writes a row of docs/reliability.md with the measured RSS, counts and times.
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import resource
import socket
import time
import tracemalloc
from pathlib import Path

import pytest

from broker.client import KafkaClientConfig
from clients import Backoff, SkewlessClient
from clients.auth import derive_source_key
from clients.client import GatewayRejected
from contract.wire.frames import FrameDecoder, encode_frame
from contract.wire.messages import build_event, build_events
from gateway.connection import MAX_PENDING_READ_BYTES, WRITE_BUFFER_MAX_BYTES
from gateway.session import GatewaySession
from tests.reliability.harness import GatewayProcess, read_delivery, record_outcome, rss_kib
from timesync.clocks import system_time_us

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FAST = Backoff(initial_s=0.02, max_s=0.2)
# Scaled down from the 2,000 (docs/operations.md, "Limits", gives the full figure): the per-source cost is
# what is checked, and 500 connections keep the scenario within ~30 s on a shared 2-core machine.
HELLO_ONLY_SOURCES = int(os.environ.get("SKEWLESS_HELLO_ONLY_SOURCES", "500"))
HELLO_STREAMS = 64
# The documented bound (docs/operations.md, "Limits"): a hello-only source costs about 120 B per stream it names (a
# checkpoint entry, a place among the stream's silent newcomers) plus its connection while connected; measured as RSS
# (23 KiB per source for 2,000) this allows for allocator slack. A merge entry per stream made at hello cost 115 KiB.
HELLO_ONLY_KIB_PER_SOURCE = 64
# A second wave may grow RSS by allocator noise (the good source's records, Kafka's buffers): measured 7-9 MiB for
# waves of 500 and 2,000, whose own cost is 12 and 45 MiB.
REGROWTH_NOISE_KIB = 16 * 1024


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def start(kafka, prefix: str, tmp_path: Path, settings: str) -> GatewayProcess:
    config = tmp_path / "gateway.toml"
    config.write_text("[gateway]\n" + settings)
    gateway = GatewayProcess(kafka.bootstrap_servers, prefix, tmp_path, extra_args=("--config", str(config)))
    await gateway.start()
    return gateway


class GoodSource:
    """Streams `rounds` rounds of `per_round` events, flushing after each: the flush time is its ack latency."""

    def __init__(self, port: int, source_id: str = "good", **client_args) -> None:
        self.client = SkewlessClient("127.0.0.1", port, source_id, ["s"], backoff=FAST, **client_args)
        self.sent = 0
        self.ack_latencies_s: list[float] = []

    async def run(self, rounds: int, per_round: int = 50, pause_s: float = 0.2) -> None:
        await self.client.connect()
        for _ in range(rounds):
            for _ in range(per_round):
                assert await self.client.send("s", {"i": self.sent}) == self.sent
                self.sent += 1
            started = time.monotonic()
            await self.client.flush(timeout_s=60)
            self.ack_latencies_s.append(time.monotonic() - started)
            await asyncio.sleep(pause_s)
        await self.client.close()

    def latency(self) -> dict[str, float]:
        ordered = sorted(self.ack_latencies_s)
        return {"good_ack_p50_ms": round(ordered[len(ordered) // 2] * 1e3, 1),
                "good_ack_p99_ms": round(ordered[min(len(ordered) - 1, len(ordered) * 99 // 100)] * 1e3, 1),
                "good_ack_max_ms": round(ordered[-1] * 1e3, 1)}


def merge_hold(delivery, source_id: str = "good") -> dict[str, float]:
    """How long the gateway held the source's events between their arrival and their release (the merge's waits),
    from the records themselves: the gateway's part of an ack's latency, apart from the client's own event loop
    (shared with the hostile clients in these tests) and Kafka's."""
    ordered = sorted(r["release_ts_us"] - r["arrival_ts_us"] for r in delivery.events if r["source_id"] == source_id)
    return {"good_hold_p50_ms": round(ordered[len(ordered) // 2] / 1e3, 1),
            "good_hold_p99_ms": round(ordered[min(len(ordered) - 1, len(ordered) * 99 // 100)] / 1e3, 1),
            "good_hold_max_ms": round(ordered[-1] / 1e3, 1)}


# What a peer that floods and never reads may make the gateway hold (docs/operations.md, "Limits"): its answers up to
# write_buffer_max_bytes, and what it sent that was read and not yet processed, decoded: at most
# MAX_PENDING_READ_BYTES plus one read (uvloop reads up to 256,000 bytes) plus the start of a frame the last read
# completed, times what decoding makes of those bytes (measured below on the very frame the test sends).
UVLOOP_READ_BYTES = 256_000
# Beyond the formula: the good source's state and records, the Kafka client's buffers, allocator slack (measured
# growth stayed below the formula itself: docs/reliability.md).
FLOOD_RSS_ALLOWANCE_MIB = 8


def decoded_bytes_per_byte(frame: bytes) -> float:
    """What a session holds decoded per byte of ``frame`` (tracemalloc: about 5.3 for one-event frames)."""
    session = GatewaySession()
    session.receive_data(hello("probe", ["s"]))
    data = frame * max(1, 1_000_000 // len(frame))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        actions = session.receive_data(data)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert actions
    return held / len(data)


def flood_formula_mib(frame: bytes) -> float:
    pending = MAX_PENDING_READ_BYTES + UVLOOP_READ_BYTES + len(frame)
    return (WRITE_BUFFER_MAX_BYTES + decoded_bytes_per_byte(frame) * pending) / 2**20


def hello(source_id: str, streams: list[str]) -> bytes:
    return encode_frame({"type": "hello", "version": 1, "source_id": source_id, "streams": streams})


async def test_a_flooding_peer_that_never_reads_is_paused_then_closed_and_costs_the_gateway_bounded_memory(
        kafka, topic_prefix, tmp_path: Path):
    """c005711: a peer sending refused payloads and never reading took the gateway from 62 to 269 MiB in 27 s, and
    1.21 M refused events wrote 121 MiB of WARNING lines."""
    gateway = await start(kafka, topic_prefix, tmp_path, "slow_reader_timeout_s = 4\n")
    good = GoodSource(gateway.port)
    try:
        await GoodSource(gateway.port, "warm-up").run(1, per_round=1, pause_s=0)  # topics exist, caches warm
        rss_before = rss_kib(gateway.pid)
        frame = encode_frame({"type": "events", "events": [
            {"stream": "s", "seq": q, "source_ts_us": 1, "payload": math.nan} for q in range(1000)]})

        def flood() -> tuple[int, float, str]:
            """Blocking socket, tiny receive buffer, never read: send until the gateway stops taking bytes, then
            until it closes the connection."""
            sock = socket.create_connection(("127.0.0.1", gateway.port))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.settimeout(20)
            started = time.monotonic()
            sent = 0
            try:
                sock.sendall(hello("flooder", ["s"]))
                while time.monotonic() - started < 30:
                    sock.sendall(frame)
                    sent += 1
                return sent, time.monotonic() - started, "still open after 30 s"
            except (ConnectionResetError, BrokenPipeError) as exc:
                return sent, time.monotonic() - started, type(exc).__name__
            except TimeoutError:
                return sent, time.monotonic() - started, "send blocked 20 s"
            finally:
                sock.close()

        flooding = asyncio.get_running_loop().run_in_executor(None, flood)
        rss_peak = rss_before
        streaming = asyncio.create_task(good.run(rounds=30))
        while not flooding.done():
            rss_peak = max(rss_peak, rss_kib(gateway.pid))
            await asyncio.sleep(0.2)
        frames_sent, flood_s, flood_end = await flooding
        await streaming
        metrics = await gateway.metrics()
    finally:
        log = await gateway.stop()
    delivery = read_delivery(kafka.bootstrap_servers, topic_prefix, "s")
    delivery.assert_exactly_once_in_order({"good": good.sent, "warm-up": 1})
    assert flood_end in ("ConnectionResetError", "BrokenPipeError"), flood_end
    assert metrics["skewless_gateway_slow_readers_closed"] == 1
    refused_lines = [line for line in log.splitlines() if "refused flooder/s" in line]
    rss_growth_mib = (rss_peak - rss_before) / 1024
    # The write buffer is capped at 4 MiB (write_buffer_max_bytes) and reading stops at its 256 KiB high-water
    # mark; beyond, what was read before the pause, decoded (MAX_PENDING_READ_BYTES): the documented formula.
    formula_mib = flood_formula_mib(frame)
    assert rss_growth_mib < formula_mib + FLOOD_RSS_ALLOWANCE_MIB, (rss_growth_mib, formula_mib)
    assert len(refused_lines) <= 40, len(refused_lines)
    # Ack latency is a figure of the row, not a timed assertion (a shared, loaded machine): the first ack waits out
    # the merge's 2 s join window for the flooder, a source of the same stream; this bound catches a starved one.
    assert max(good.ack_latencies_s) < 15.0, good.latency()
    record_outcome(
        "Flooding peer that never reads", group="hostile",
        injected="a raw client sends frames of 1,000 events with a NaN payload (each refused with an error frame) "
                 "and never reads its socket, while one SDK source streams 30 rounds of 50 events",
        checked="the gateway stops reading the flooder at its write high-water mark and closes it after "
                "slow_reader_timeout_s (4 s); RSS growth within the documented formula plus "
                f"{FLOOD_RSS_ALLOWANCE_MIB} MiB, log lines bounded; good source exactly once, acks prompt",
        outcome={"flood_frames_sent": frames_sent, "flood_closed_after_s": round(flood_s, 1), "flood_end": flood_end,
                 "slow_readers_closed": metrics["skewless_gateway_slow_readers_closed"],
                 "invalid_payloads": metrics.get("skewless_gateway_invalid_payloads"),
                 "refused_log_lines": len(refused_lines),
                 "log_lines_suppressed": metrics.get("skewless_gateway_log_lines_suppressed"),
                 "rss_before_mib": round(rss_before / 1024, 1), "rss_peak_mib": round(rss_peak / 1024, 1),
                 "rss_growth_mib": round(rss_growth_mib, 1), "rss_formula_mib": round(formula_mib, 1),
                 **delivery.summary({"good": good.sent, "warm-up": 1}), **good.latency(),
                 "load_average_1m": round(os.getloadavg()[0], 1)})


# Issue 24 item 4's duplicate flood: each frame repeats the same acked seqs, answered by one ack frame. One event per
# frame: the gateway then writes an ack per ~60 bytes it reads, enough to fill the kernel's socket buffers (up to
# 4 MiB on loopback) and its 256 KiB high-water mark within seconds; with 100 events per frame the gateway spent its
# CPU on the duplicates and had written only ~350 KB of acks after 30 s, all absorbed by the kernel.
DUPLICATE_FRAME_EVENTS = int(os.environ.get("SKEWLESS_DUPLICATE_FRAME_EVENTS", "1"))


# In the long suite since a fresh-clone run on 1f7a03e: the flooder's send blocked 20 s instead of being reset (the
# gateway had stopped reading it, its small acks below the write high-water mark, so no slow-reader close came in
# time). Bounded either way; whether such a peer must be closed, not just paused, is open (closing note).
@pytest.mark.reliability_long
async def test_a_duplicate_flood_from_a_peer_that_never_reads_gets_one_ack_per_frame_and_is_closed(
        kafka, topic_prefix, tmp_path: Path):
    """c005711: a client resending an acked batch in a loop and never reading got one ack frame per duplicate
    event (4.71 M frames) queued in the gateway: 537 MiB of RSS."""
    gateway = await start(kafka, topic_prefix, tmp_path, "slow_reader_timeout_s = 4\n")
    good = GoodSource(gateway.port)
    k = DUPLICATE_FRAME_EVENTS
    try:
        await GoodSource(gateway.port, "warm-up").run(1, per_round=1, pause_s=0)
        rss_before = rss_kib(gateway.pid)
        now_us = system_time_us()
        frame = encode_frame(build_events([build_event("s", q, now_us + q, {"i": q}) for q in range(k)]))
        # A small receive buffer, set before connecting (so the window is small from the start), never read.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(20)
        sock.connect(("127.0.0.1", gateway.port))
        sock.sendall(hello("flooder", ["s"]) + frame)
        started = time.monotonic()
        while (await gateway.metrics()).get("skewless_gateway_events_published", 0) < 1 + k:
            assert time.monotonic() - started < 20, "the flooder's batch was never published"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # its ack follows the publish: a resend of an acked seq is re-acked

        def flood() -> tuple[int, float, str]:
            """Resend the same (now duplicate) frame until the gateway stops taking bytes, then until it closes."""
            started = time.monotonic()
            sent = 0
            try:
                while time.monotonic() - started < 30:
                    sock.sendall(frame)
                    sent += 1
                return sent, time.monotonic() - started, "still open after 30 s"
            except (ConnectionResetError, BrokenPipeError) as exc:
                return sent, time.monotonic() - started, type(exc).__name__
            except TimeoutError:
                return sent, time.monotonic() - started, "send blocked 20 s"
            finally:
                sock.close()

        flooding = asyncio.get_running_loop().run_in_executor(None, flood)
        rss_peak = rss_before
        streaming = asyncio.create_task(good.run(rounds=30))
        while not flooding.done():
            rss_peak = max(rss_peak, rss_kib(gateway.pid))
            await asyncio.sleep(0.2)
        frames_sent, flood_s, flood_end = await flooding
        await streaming
        metrics = await gateway.metrics()
    finally:
        log = await gateway.stop()
    expected = {"good": good.sent, "warm-up": 1, "flooder": k}
    delivery = read_delivery(kafka.bootstrap_servers, topic_prefix, "s")
    delivery.assert_exactly_once_in_order(expected)
    assert delivery.late == []
    assert flood_end in ("ConnectionResetError", "BrokenPipeError"), flood_end
    assert metrics["skewless_gateway_slow_readers_closed"] == 1
    # Every event the gateway read from the flooder after its batch was a duplicate, and it read whole frames.
    duplicates = int(metrics["skewless_gateway_duplicates"])
    assert duplicates == metrics["skewless_gateway_events_received"] - sum(expected.values())
    assert duplicates > 0 and duplicates % k == 0, duplicates
    frames_read = duplicates // k
    assert frames_read <= frames_sent
    flooder_lines = [line for line in log.splitlines() if "flooder" in line]
    rss_growth_mib = (rss_peak - rss_before) / 1024
    # c005711 grew 537 MiB on this flood; before reads were bounded by bytes, 44 MiB (64 reads of 256,000 bytes of
    # 74-byte frames, 5.3 bytes each decoded), beyond the documented formula.
    formula_mib = flood_formula_mib(frame)
    assert rss_growth_mib < formula_mib + FLOOD_RSS_ALLOWANCE_MIB, (rss_growth_mib, formula_mib)
    assert len(flooder_lines) <= 10, flooder_lines
    # Not asserted: the good source's ack latency. On this loaded 2-core machine (load average 8-11) both floods
    # stalled its acks for seconds (up to 15 s, a reconnect after 5 s of silence) while the gateway was busy with the
    # flooder; the refused-payload flood above measured 119 ms max when the machine was quieter. Recorded.
    record_outcome(
        "Duplicate flood from a peer that never reads", group="hostile",
        injected=f"a raw client sends one batch of {k} event(s), and once it is acked resends the same frame in a "
                 "tight loop without ever reading its socket, while one SDK source streams 30 rounds of 50 events",
        checked="every event read after the batch counted as a duplicate (whole frames, each re-acked); the "
                "gateway stops reading the flooder at its write high-water mark and closes it after "
                "slow_reader_timeout_s (4 s); RSS growth within the documented formula (answers up to "
                "write_buffer_max_bytes, reads pending up to MAX_PENDING_READ_BYTES, decoded) plus "
                f"{FLOOD_RSS_ALLOWANCE_MIB} MiB, log lines bounded; flooder's batch and good source exactly once (its "
                "ack latency measured, not bounded)",
        outcome={"flood_frames_sent": frames_sent, "frames_read": frames_read, "duplicates": duplicates,
                 "flood_closed_after_s": round(flood_s, 1), "flood_end": flood_end,
                 "slow_readers_closed": metrics["skewless_gateway_slow_readers_closed"],
                 "flooder_log_lines": len(flooder_lines),
                 "rss_before_mib": round(rss_before / 1024, 1), "rss_peak_mib": round(rss_peak / 1024, 1),
                 "rss_growth_mib": round(rss_growth_mib, 1), "rss_formula_mib": round(formula_mib, 1),
                 **delivery.summary(expected), **good.latency(), "load_average_1m": round(os.getloadavg()[0], 1)})


async def open_hello_only(port: int, count: int, streams: list[str], prefix: str
                          ) -> list[asyncio.StreamWriter]:
    """`count` connections that each say hello naming `streams`, wait for the welcome, and send nothing more."""

    async def one(k: int) -> asyncio.StreamWriter:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(hello(f"{prefix}-{k}", streams))
        decoder = FrameDecoder()
        frames: list[dict] = []
        async with asyncio.timeout(60):
            while not frames:
                data = await reader.read(65536)
                assert data, "closed before the welcome"
                frames += decoder.feed(data)
        assert frames[0]["type"] == "welcome", frames
        return writer

    writers: list[asyncio.StreamWriter] = []
    for start_k in range(0, count, 100):
        writers += await asyncio.gather(*(one(k) for k in range(start_k, min(count, start_k + 100))))
    return writers


async def test_sources_that_only_say_hello_cost_the_documented_bytes_and_are_freed(kafka, topic_prefix,
                                                                                   tmp_path: Path):
    """c005711: 2,000 hello-only connections naming 64 streams took RSS from 62 MiB to 1.2 GiB (545 KiB per source),
    unchanged after they closed; the sources metric read 1; a good source's ack took 1.35 s meanwhile."""
    raise_fd_limit()
    n = HELLO_ONLY_SOURCES
    streams = [f"h{i}" for i in range(HELLO_STREAMS - 1)] + ["s"]
    gateway = await start(kafka, topic_prefix, tmp_path, "idle_source_retention_s = 2\n")
    good = GoodSource(gateway.port)
    waves: list[dict[str, float]] = []
    try:
        await GoodSource(gateway.port, "warm-up").run(1, per_round=1, pause_s=0)
        # The 64 streams' topics exist before the measured waves: creating 128 topics takes seconds, once.
        for writer in await open_hello_only(gateway.port, 1, streams, "topics"):
            writer.close()
        streaming = asyncio.create_task(good.run(rounds=40, pause_s=0.3))
        for wave in range(2):
            rss_before = rss_kib(gateway.pid)
            opened_at = time.monotonic()
            sockets = await open_hello_only(gateway.port, n, streams, f"hello-{wave}")
            hello_wave_s = time.monotonic() - opened_at
            rss_connected = rss_kib(gateway.pid)
            connected_sources = (await gateway.metrics())["skewless_gateway_sources"]
            for writer in sockets:
                writer.close()
            closed_at = time.monotonic()
            while True:  # freed after the 2 s retention, at the next sweep (every second)
                after = await gateway.metrics()
                if after.get("skewless_gateway_sources_forgotten", 0) >= n * (wave + 1):
                    break
                assert time.monotonic() - closed_at < 30, after
                await asyncio.sleep(0.2)
            freed_after_s = time.monotonic() - closed_at
            waves.append({"rss_before_kib": rss_before, "rss_connected_kib": rss_connected,
                          "rss_after_free_kib": rss_kib(gateway.pid), "sources_connected": connected_sources,
                          "sources_after_free": after["skewless_gateway_sources"], "freed_after_s": freed_after_s,
                          "hello_wave_s": hello_wave_s})
        await streaming
    finally:
        await gateway.stop()
    delivery = read_delivery(kafka.bootstrap_servers, topic_prefix, "s")
    delivery.assert_exactly_once_in_order({"good": good.sent, "warm-up": 1})
    first, second = waves
    per_source_kib = (first["rss_connected_kib"] - first["rss_before_kib"]) / n
    assert per_source_kib < HELLO_ONLY_KIB_PER_SOURCE, per_source_kib
    # The metric sees every hello-only source while it is held, and none once freed (good, warm-up, topics remain).
    assert first["sources_connected"] >= n
    assert first["sources_after_free"] <= 3 and second["sources_after_free"] <= 3
    # Freed state is reused: a second wave of as many sources does not grow the gateway by a wave's worth.
    regrowth_kib = second["rss_after_free_kib"] - first["rss_after_free_kib"]
    wave_kib = first["rss_connected_kib"] - first["rss_before_kib"]
    assert regrowth_kib < 0.25 * wave_kib + REGROWTH_NOISE_KIB, (regrowth_kib, waves)
    record_outcome(
        "Sources that only say hello", group="hostile",
        injected=f"two waves of {n} connections that each say hello naming {HELLO_STREAMS} streams and nothing "
                 "more, then close; one SDK source streams beside them",
        checked="RSS per hello-only source within the documented bound; every one freed after "
                "idle_source_retention_s (2 s); a second wave reuses the memory; the sources gauge follows; good "
                "source exactly once",
        outcome={"sources_per_wave": n, "streams_per_hello": HELLO_STREAMS,
                 "rss_per_source_kib": round(per_source_kib, 1),
                 "rss_mib": [round(w[k] / 1024, 1) for w in waves
                             for k in ("rss_before_kib", "rss_connected_kib", "rss_after_free_kib")],
                 "sources_gauge": [w[k] for w in waves for k in ("sources_connected", "sources_after_free")],
                 "freed_after_close_s": [round(w["freed_after_s"], 1) for w in waves],
                 "hello_wave_s": [round(w["hello_wave_s"], 1) for w in waves],
                 **delivery.summary({"good": good.sent, "warm-up": 1}), **good.latency(), **merge_hold(delivery),
                 "load_average_1m": round(os.getloadavg()[0], 1)})
    # A good source on a stream the newcomers name waits for them one join grace (2 s) at most per window, plus the
    # gateway's time registering them (0.1-0.25 ms of CPU per hello of 64 streams; more on a loaded machine): the time
    # it took to welcome a wave.
    bound_s = 2.0 + max(w["hello_wave_s"] for w in waves) + 1.0
    assert max(good.ack_latencies_s) < bound_s, (good.latency(), bound_s)


def list_stream_topics(bootstrap: str, prefix: str) -> set[str]:
    topics = KafkaClientConfig(bootstrap).admin().list_topics(timeout=10).topics
    return {t for t in topics if t.startswith(f"{prefix}.events.") or t.startswith(f"{prefix}.late.")}


async def test_a_source_inventing_stream_names_creates_nothing_past_the_cap(kafka, topic_prefix, tmp_path: Path):
    """c005711: 320 new stream names created 642 topics in about a second, with no limit."""
    cap = 100
    gateway = await start(kafka, topic_prefix, tmp_path, f"max_streams = {cap}\n")
    good = GoodSource(gateway.port)
    answers: list[str] = []
    try:
        await good.client.connect()  # stream "s": the first of the cap
        loop = asyncio.get_running_loop()

        def inventor(k: int) -> str:
            with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
                sock.settimeout(30)
                sock.sendall(hello(f"inventor-{k}", [f"x{k}-{i}" for i in range(64)]))
                decoder = FrameDecoder()
                frames: list[dict] = []
                while not frames:
                    data = sock.recv(65536)
                    if not data:
                        return "closed"
                    frames += decoder.feed(data)
                return frames[0].get("code", frames[0]["type"])

        started = time.monotonic()
        answers = [await loop.run_in_executor(None, inventor, k) for k in range(5)]  # 320 names
        refused_s = time.monotonic() - started
        good_task = asyncio.create_task(good.run(rounds=5))
        await good_task
        metrics = await gateway.metrics()
    finally:
        await gateway.stop()
    topics = list_stream_topics(kafka.bootstrap_servers, topic_prefix)
    delivery = read_delivery(kafka.bootstrap_servers, topic_prefix, "s")
    delivery.assert_exactly_once_in_order({"good": good.sent})
    # "s" + one hello of 64 names fit under 100; the next four would not: refused before creating anything.
    assert answers == ["welcome", "stream_refused", "stream_refused", "stream_refused", "stream_refused"], answers
    assert len(topics) == 2 * 65, len(topics)
    assert metrics["skewless_gateway_streams_refused"] == 4
    record_outcome(
        "Source inventing stream names", group="hostile",
        injected="5 hellos naming 64 new stream names each (320) against max_streams = 100, one SDK source beside",
        checked="hellos that would pass the cap get `stream_refused` and create no topic; counter; good source "
                "exactly once",
        outcome={"stream_names_named": 320, "answers": answers, "stream_topics_created": len(topics),
                 "streams_refused": metrics["skewless_gateway_streams_refused"],
                 "refusals_took_s": round(refused_s, 2), **delivery.summary({"good": good.sent})})


async def test_a_source_holding_its_own_key_cannot_speak_for_another(kafka, topic_prefix, tmp_path: Path):
    """c005711: with --hmac-secret one shared secret let any holder sign as any source: a forger's events with the
    victim's seqs won, and the victim's futures all resolved as delivered."""
    master = "m" * 32
    gateway = await start(kafka, topic_prefix, tmp_path, f'hmac_master = "{master}"\n')
    victim_key = derive_source_key(master.encode(), "victim").encode()
    forger_key = derive_source_key(master.encode(), "forger").encode()
    victim = GoodSource(gateway.port, "victim", hmac_secret=victim_key)
    refused: list[str] = []
    try:
        await victim.client.connect()
        forger = SkewlessClient("127.0.0.1", gateway.port, "victim", ["s"], hmac_secret=forger_key, backoff=FAST)
        try:
            await forger.connect()
            for i in range(50):
                await forger.send("s", {"forged": i})
            await forger.flush(timeout_s=5)
        except GatewayRejected as exc:
            refused.append(exc.code)
        finally:
            await forger.close()
        await victim.run(rounds=2)
        metrics = await gateway.metrics()
    finally:
        await gateway.stop()
    delivery = read_delivery(kafka.bootstrap_servers, topic_prefix, "s")
    delivery.assert_exactly_once_in_order({"victim": 100})
    assert all("forged" not in e["payload"] for e in delivery.events)
    assert refused == ["unauthenticated"], refused
    assert metrics["skewless_gateway_events_received"] == 100  # not one forged event was read
    record_outcome(
        "Source signing as another", group="hostile",
        injected="a gateway with hmac_master; a forger holding its own derived key says hello as `victim` and sends "
                 "50 events; the victim streams 100 with its key",
        checked="the forger's hello is refused (`unauthenticated`); Kafka holds exactly the victim's 100 events",
        outcome={"forger_refused": refused, **delivery.summary({"victim": 100})})

