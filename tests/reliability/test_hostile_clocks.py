"""Hostile clocks beside well-behaved sources, on a real `skewless gateway` process and broker (issue 24 items 1, 6).

A runaway source heartbeats (and stamps) a day ahead: before heartbeats were checked, one such heartbeat ran the
stream's watermark 86,380 s forward, every on-time event of the other sources went to the late topic, and the bad
watermark survived a restart in the checkpoint. A backwards source stamps its events going back along its seqs:
before, a frame of them put its inversions on the events topic. The well-behaved sources must lose nothing, get
nothing duplicated and nothing diverted; the events topic must stay in reference order; every hostile event must be
on the events topic or on the late topic with its reason.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from broker.reader import read_stream, read_topic
from clients import SimulatedClock, SkewlessClient
from clients.errors import EventRefused
from contract.topics import TopicNames
from contract.wire.frames import FrameDecoder, encode_frame
from contract.wire.messages import build_event, build_events, build_heartbeat, build_hello
from tests.reliability.harness import GatewayProcess, read_delivery, record_outcome, rss_kib
from timesync.clocks import ClockUs, system_time_us

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

DAY_US = 86_400_000_000
HOUR_US = 3_600_000_000
INT64_MAX = 2**63 - 1
MAX_FUTURE_US = 60_000_000
GOOD = ("good-0", "good-1", "good-2")


async def _send(client: SkewlessClient, n: int, rate_per_s: float) -> None:
    for i in range(n):
        await client.send("s", {"i": i})
        await asyncio.sleep(1 / rate_per_s)
    await client.flush(timeout_s=30)


async def _runaway(port: int, stop: asyncio.Event) -> dict[str, int]:
    """A raw source a day ahead: heartbeats every 100 ms and one event every 500 ms, all stamped +1 day."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    decoder = FrameDecoder()
    answers: Counter[str] = Counter()
    writer.write(encode_frame(build_hello("runaway", ["s"])))
    seq = 0
    beats = 0

    async def read() -> None:
        while data := await reader.read(65536):
            for frame in decoder.feed(data):
                answers[f"{frame['type']}:{frame.get('code', '')}"] += 1

    reading = asyncio.create_task(read())
    try:
        while not stop.is_set():
            now_us = system_time_us()
            writer.write(encode_frame(build_heartbeat(now_us + DAY_US, {"s": seq})))
            beats += 1
            if beats % 5 == 0:
                writer.write(encode_frame(build_events([build_event("s", seq, now_us + DAY_US, {"runaway": seq})])))
                seq += 1
            await writer.drain()
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
    finally:
        writer.close()
        reading.cancel()
    return {"heartbeats_sent": beats, "events_sent": seq, **answers}


def _checkpoint_watermark_us(bootstrap: str, prefix: str) -> int | None:
    values = [orjson.loads(v) for k, v in read_topic(bootstrap, TopicNames(prefix).sources) if k == b"progress|s"]
    return values[-1]["watermark_us"] if values else None


async def test_a_runaway_heartbeat_beside_good_sources_diverts_nothing_and_the_checkpoint_stays_sane(
        kafka, topic_prefix, tmp_path: Path):
    gateway = GatewayProcess(kafka.bootstrap_servers, topic_prefix, tmp_path)
    await gateway.start()
    started = time.monotonic()
    stop = asyncio.Event()
    clients = [SkewlessClient("127.0.0.1", gateway.port, s, ["s"], batch_events=20) for s in GOOD]
    try:
        runaway = asyncio.create_task(_runaway(gateway.port, stop))
        await asyncio.sleep(0.3)  # the runaway's heartbeats come first: before, they alone punctuated the stream
        await asyncio.gather(*(c.connect() for c in clients))
        await asyncio.gather(*(_send(c, 200, 100.0) for c in clients))
        stop.set()
        runaway_counts = await runaway
        metrics = await gateway.metrics()
        rss = rss_kib(gateway.pid)
    finally:
        stop.set()
        await asyncio.gather(*(c.close() for c in clients))
        await gateway.stop()
    stopped_us = system_time_us()
    checkpoint_us = _checkpoint_watermark_us(kafka.bootstrap_servers, topic_prefix)
    assert checkpoint_us is not None and checkpoint_us <= stopped_us + MAX_FUTURE_US

    # After a restart, a newcomer's on-time events are on time.
    gateway = GatewayProcess(kafka.bootstrap_servers, topic_prefix, tmp_path, port=gateway.port,
                             metrics_port=gateway.metrics_port)
    await gateway.start()
    newcomer = SkewlessClient("127.0.0.1", gateway.port, "newcomer", ["s"], batch_events=20)
    try:
        await newcomer.connect()
        await _send(newcomer, 50, 200.0)
    finally:
        await newcomer.close()
        await gateway.stop()
    elapsed_s = time.monotonic() - started

    delivery = read_delivery(kafka.bootstrap_servers, topic_prefix, "s")
    expected = {**dict.fromkeys(GOOD, 200), "newcomer": 50}
    summary = delivery.summary(expected)
    good_late = [r for r in delivery.late if r["source_id"] != "runaway"]
    runaway_late = Counter(r["late_reason"] for r in delivery.late if r["source_id"] == "runaway")
    _events, punctuations = read_stream(kafka.bootstrap_servers, TopicNames(topic_prefix).events("s"))
    refs = [r["ref_ts_us"] for r in delivery.events]
    assert good_late == []
    assert (summary["lost"], summary["duplicated"]) == (0, 0)
    for source_id, n in expected.items():
        assert delivery.seqs(source_id) == list(range(n)), source_id
    assert [r for r in delivery.events if r["source_id"] == "runaway"] == []
    assert runaway_late == {"future_dated": runaway_counts["events_sent"]}
    assert refs == sorted(refs)
    assert all(p["watermark_us"] <= p["release_ts_us"] + MAX_FUTURE_US for p in punctuations)
    assert metrics["skewless_gateway_heartbeats_refused"] == runaway_counts["heartbeats_sent"]
    assert runaway_counts["error:invalid_message"] == runaway_counts["heartbeats_sent"]
    record_outcome(
        "Runaway heartbeats a day ahead beside good sources, then a restart", group="hostile",
        injected="a raw source heartbeats every 100 ms and sends an event every 500 ms, all stamped +1 day, before "
                 "and beside 3 SDK sources (200 events each at 100/s); the gateway is restarted, a newcomer sends 50",
        checked="good sources and newcomer: 0 lost/duplicated/late, in seq order; events topic in ref order; no "
                "punctuation or checkpoint watermark beyond release + 60 s; every runaway heartbeat refused and told",
        outcome={"good_events": 600, "newcomer_events": 50, "lost": summary["lost"],
                 "duplicated": summary["duplicated"], "good_late": len(good_late),
                 "runaway": runaway_counts, "runaway_late": dict(runaway_late),
                 "heartbeats_refused": metrics["skewless_gateway_heartbeats_refused"],
                 "checkpoint_watermark_minus_stop_ms": (checkpoint_us - stopped_us) // 1000,
                 "max_watermark_minus_release_ms": max(p["watermark_us"] - p["release_ts_us"]
                                                       for p in punctuations) // 1000,
                 "gateway_rss_mib": round(rss / 1024, 1), "elapsed_s": round(elapsed_s, 1)})


async def test_a_backwards_stamping_source_keeps_the_events_topic_in_reference_order(kafka, topic_prefix,
                                                                                     tmp_path: Path):
    gateway = GatewayProcess(kafka.bootstrap_servers, topic_prefix, tmp_path)
    await gateway.start()
    started = time.monotonic()
    clients = [SkewlessClient("127.0.0.1", gateway.port, s, ["s"], batch_events=20) for s in GOOD]
    backwards = SkewlessClient("127.0.0.1", gateway.port, "backwards", ["s"], batch_events=10)
    stamps: list[int] = []

    async def saw_tooth() -> None:
        # Ten stamps 10 ms apart going back, then the next ten start at the clock again: 9 of each 10 regress.
        for _frame in range(20):
            top_us = system_time_us()
            for i in range(10):
                stamps.append(top_us - 10_000 * i)
                await backwards.send("s", {"i": len(stamps) - 1}, source_ts_us=stamps[-1])
            await asyncio.sleep(0.1)
        await backwards.flush(timeout_s=30)

    try:
        await asyncio.gather(*(c.connect() for c in [*clients, backwards]))
        await asyncio.gather(saw_tooth(), *(_send(c, 200, 100.0) for c in clients))
        rss = rss_kib(gateway.pid)
    finally:
        await asyncio.gather(*(c.close() for c in [*clients, backwards]))
        await gateway.stop()
    elapsed_s = time.monotonic() - started

    delivery = read_delivery(kafka.bootstrap_servers, topic_prefix, "s")
    refs = [r["ref_ts_us"] for r in delivery.events]
    inversions = sum(1 for a, b in itertools.pairwise(refs) if b < a)
    # Ground truth from the stamps alone (no time sync: error bound 0): an event is on the events topic iff its
    # stamp is not below an earlier one of its source; otherwise late as a stamp regression, by that much.
    running = -1
    expected_fate: dict[int, tuple[str, int]] = {}
    for seq, stamp in enumerate(stamps):
        expected_fate[seq] = ("events", 0) if stamp >= running else ("stamp_regression", running - stamp)
        running = max(running, stamp)
    fate = {r["seq"]: ("events", 0) for r in delivery.events if r["source_id"] == "backwards"}
    fate.update({r["seq"]: (r["late_reason"], r["lateness_us"]) for r in delivery.late
                 if r["source_id"] == "backwards"})
    good_summary = delivery.summary(dict.fromkeys(GOOD, 200))
    good_late = [r for r in delivery.late if r["source_id"] != "backwards"]
    assert inversions == 0
    assert fate == expected_fate
    assert good_late == []
    assert (good_summary["lost"], good_summary["duplicated"]) == (0, 0)
    for source_id in GOOD:
        assert delivery.seqs(source_id) == list(range(200)), source_id
    on_events = sum(1 for f, _ in fate.values() if f == "events")
    record_outcome(
        "A source stamping backwards along its seqs beside good sources", group="hostile",
        injected="one SDK source sends 20 frames of 10 events whose stamps go back 10 ms each (source_ts_us=), "
                 "beside 3 SDK sources (200 events each at 100/s); no time sync",
        checked="events topic: 0 inversions; each backwards event on the events topic iff its stamp is not below "
                "an earlier one, else late stamp_regression by exactly that much; good sources 0 lost/dup/late",
        outcome={"backwards_events": len(stamps), "backwards_on_events": on_events,
                 "backwards_late_stamp_regression": len(stamps) - on_events, "inversions_on_events_topic": inversions,
                 "good_events": 600, "good_lost": good_summary["lost"], "good_duplicated": good_summary["duplicated"],
                 "good_late": len(good_late), "gateway_rss_mib": round(rss / 1024, 1),
                 "elapsed_s": round(elapsed_s, 1)})


async def test_timestamps_mapped_outside_the_contract_are_refused_beside_a_good_source(kafka, topic_prefix,
                                                                                      tmp_path: Path):
    """Issue 24 item 7 on a real gateway process with its time-sync server. c005711: a source clock one hour behind
    stamping near 2^63 gave a late record with ref_ts_us 9,223,372,040,454,774,784 (above 2^63 - 1); a clock one
    hour ahead stamping 0 gave a negative ref_ts_us."""
    n = 50
    gateway = GatewayProcess(kafka.bootstrap_servers, topic_prefix, tmp_path, timesync_port=0)
    await gateway.start()
    started = time.monotonic()

    def client(source_id: str, clock_us: ClockUs = system_time_us) -> SkewlessClient:
        return SkewlessClient("127.0.0.1", gateway.port, source_id, ["s"], udp_port=gateway.timesync_port,
                              clock_us=clock_us, sync_attempts=6, batch_events=10)

    # Mapped to reference time (+1 h for the source behind, -1 h for the one ahead), these stamps leave 0..2^63-1.
    stamps = {"behind": [INT64_MAX - k for k in range(n)], "ahead": list(range(n))}
    bad = {"behind": client("behind", SimulatedClock(-HOUR_US, 0.0)),
           "ahead": client("ahead", SimulatedClock(HOUR_US, 0.0))}
    good = client("good")
    refusals: Counter[str] = Counter()

    async def hostile(source_id: str) -> None:
        futures = [await bad[source_id].send_tracked("s", {"k": k}, source_ts_us=stamp)
                   for k, stamp in enumerate(stamps[source_id])]
        for future in futures:
            try:
                await asyncio.wait_for(future, 30)
                refusals["delivered"] += 1
            except EventRefused as exc:
                out_of_range = "timestamp_out_of_range" in str(exc)
                refusals[f"{exc.code}{': timestamp_out_of_range' if out_of_range else ''}"] += 1

    try:
        await asyncio.gather(good.connect(), *(c.connect() for c in bad.values()))
        await asyncio.gather(hostile("behind"), hostile("ahead"), _send(good, 200, 100.0))
        metrics = await gateway.metrics()
        rss = rss_kib(gateway.pid)
    finally:
        await asyncio.gather(good.close(), *(c.close() for c in bad.values()))
        await gateway.stop()
    elapsed_s = time.monotonic() - started

    delivery = read_delivery(kafka.bootstrap_servers, topic_prefix, "s")
    assert refusals == {"invalid_message: timestamp_out_of_range": 2 * n}, refusals
    assert metrics["skewless_gateway_timestamps_refused"] == 2 * n
    hostile_records = [r for r in delivery.events + delivery.late if r["source_id"] in bad]
    assert hostile_records == []
    out_of_range = [r for r in delivery.events + delivery.late
                    for f in ("ref_ts_us", "uncertainty_us", "arrival_ts_us", "release_ts_us")
                    if not 0 <= r[f] <= INT64_MAX]
    assert out_of_range == []
    delivery.assert_exactly_once_in_order({"good": 200})
    assert delivery.late == []
    record_outcome(
        "Timestamps mapped outside 0..2^63-1, with time sync", group="hostile",
        injected=f"a gateway process with its time-sync server; an SDK source whose clock is 1 h behind sends {n} "
                 f"events stamped 2^63-1-k, one 1 h ahead sends {n} stamped k (0..{n - 1}), each with a delivery "
                 "future, beside a synced SDK source sending 200 events at 100/s",
        checked="every out-of-range event refused (`invalid_message`, timestamp_out_of_range) and counted, none "
                "published on either topic; every record's timestamps in 0..2^63-1; good source exactly once, "
                "nothing late",
        outcome={"hostile_events": 2 * n, "refusals": dict(refusals),
                 "timestamps_refused": metrics["skewless_gateway_timestamps_refused"],
                 "hostile_records_in_kafka": len(hostile_records), **delivery.summary({"good": 200}),
                 "gateway_rss_mib": round(rss / 1024, 1), "elapsed_s": round(elapsed_s, 1)})
