"""Clock faults: a source whose clock jumps an hour ahead and back, and one drifting at 500 ppm, next to a healthy one.

Everything goes through the real gateway with its time-sync server, the real SDK (re-syncing every second) and the
real broker. The faulty sources' events must be corrected (mapped to the right reference time within their error
bound) or quarantined on the late topic with a reason, never lost or duplicated; the healthy and the drifting source
must not be disturbed: all their events in the ordered topic, in order, none late, and no watermark promised ahead
of the gateway's clock.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from broker.reader import read_stream
from clients import Backoff, SimulatedClock, SkewlessClient
from contract.topics import TopicNames
from gateway.server import Gateway, GatewayConfig
from tests.reliability.harness import read_delivery, record_outcome
from timesync.clocks import system_time_us
from timesync.server import ServerConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

HOUR_US = 3_600_000_000
LONG = pytest.mark.reliability_long


# Both in the long suite since a fresh-clone run on 7e58ccf lost 1 event in [fast] (passed on 8602a96 and in 20
# runs since, 10 of them beside a busy loop on one of the two cores): not explained yet. A failure now names the
# missing seqs.
@pytest.mark.parametrize("phase_s", [pytest.param(2.5, id="fast", marks=LONG),
                                     pytest.param(10.0, id="long", marks=LONG)])
async def test_clock_jump_and_500ppm_skew_are_corrected_or_quarantined_never_poisoning_the_merge(
        kafka, topic_prefix, phase_s: float):
    gateway = Gateway(GatewayConfig(port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix,
                                    timesync=ServerConfig(host="127.0.0.1", port=0)))
    await gateway.start()
    assert gateway.timesync_port is not None
    jumper_clock = SimulatedClock(0, 0.0)
    clocks = {"steady": system_time_us, "skewed": SimulatedClock(0, 500.0), "jumper": jumper_clock}
    clients = {name: SkewlessClient("127.0.0.1", gateway.port, name, ["s"], udp_port=gateway.timesync_port,
                                    clock_us=clock, resync_interval_s=1.0, sync_attempts=6,
                                    backoff=Backoff(initial_s=0.02, max_s=0.2))
               for name, clock in clocks.items()}
    phases: list[tuple[str, int]] = [("before", 0), ("jumped +1 h", HOUR_US), ("back", 0)]
    try:
        await asyncio.gather(*(c.connect() for c in clients.values()))

        async def run(client: SkewlessClient, phase: str) -> None:
            loop = asyncio.get_running_loop()
            end = loop.time() + phase_s
            while loop.time() < end:
                # Stamp the event at the instant its true time is read: send() may first wait for room (backpressure),
                # and a stamp taken after that wait would not belong to this true time.
                true_us = system_time_us()
                clock = clocks[client.source_id]
                source_us = clock.at(true_us) if isinstance(clock, SimulatedClock) else true_us
                await client.send("s", {"true_us": true_us, "phase": phase}, source_ts_us=source_us)
                await asyncio.sleep(0.01)

        for phase, jump_us in phases:
            jumper_clock.ahead_us = jump_us
            await asyncio.gather(*(run(c, phase) for c in clients.values()))
        await asyncio.gather(*(c.flush(timeout_s=60) for c in clients.values()))
        sent = {name: c.next_seq("s") for name, c in clients.items()}
        estimates = {name: gateway.store.get(name) for name in clients}
    finally:
        await asyncio.gather(*(c.close() for c in clients.values()))
        await gateway.stop()

    delivery = read_delivery(kafka.bootstrap_servers, topic_prefix, "s")
    _events, punctuations = read_stream(kafka.bootstrap_servers, TopicNames(topic_prefix).events("s"))
    assert delivery.summary(sent)["lost"] == 0, {name: delivery.missing(name, n)[:5] for name, n in sent.items()}
    assert delivery.summary(sent)["duplicated"] == 0
    # The healthy and the drifting source: everything ordered, in seq order, nothing late, mapped within the bound.
    errors_us: dict[str, list[int]] = {}
    for name in ("steady", "skewed"):
        assert delivery.seqs(name) == list(range(sent[name])), name
        assert not [r for r in delivery.late if r["source_id"] == name]
        records = [r for r in delivery.events if r["source_id"] == name]
        errors_us[name] = [abs(r["ref_ts_us"] - r["payload"]["true_us"]) for r in records]
        outside = [r for r in records if abs(r["ref_ts_us"] - r["payload"]["true_us"]) > r["uncertainty_us"] + 2_000]
        assert not outside, outside[:3]
    # The skewed clock really drifted: by the end it is 500 ppm x the run ahead of true time, raw.
    skewed = [r for r in delivery.events if r["source_id"] == "skewed"]
    raw_drift_us = skewed[-1]["source_ts_us"] - skewed[-1]["payload"]["true_us"]
    assert raw_drift_us > 500e-6 * 3 * phase_s * 0.8 * 1e6
    # The merged stream is in reference-time order and no watermark was ever promised ahead of the gateway clock.
    refs = [r["ref_ts_us"] for r in delivery.events]
    assert refs == sorted(refs)
    assert all(p["watermark_us"] <= p["release_ts_us"] for p in punctuations)
    # The jumper: every event either corrected (within a second of its true time, on the ordered topic) or on the
    # late topic with a reason.
    jumper_fate: Counter[str] = Counter()
    for r in delivery.events:
        if r["source_id"] == "jumper":
            error = abs(r["ref_ts_us"] - r["payload"]["true_us"])
            assert error < 1_000_000, r
            jumper_fate[f"{r['payload']['phase']}: corrected"] += 1
    for r in delivery.late:
        assert r["source_id"] == "jumper", r
        assert r["late_reason"] in ("future_dated", "after_punctuation", "clock_step_unresolved"), r
        jumper_fate[f"{r['payload']['phase']}: late ({r['late_reason']})"] += 1
    assert sum(jumper_fate.values()) == sent["jumper"]
    # The jump is caught at the first event after it (ingest rule 9): the source re-syncs and its events are mapped
    # with the new estimate instead of being quarantined as future-dated.
    assert any("jumped +1 h: corrected" in k for k in jumper_fate), jumper_fate
    estimate_skew = {name: round(info.skew_ppm, 1) for name, info in estimates.items() if info is not None}
    p99 = {name: sorted(v)[len(v) * 99 // 100] for name, v in errors_us.items()}
    record_outcome(
        f"Clock jump +1 h and back, 500 ppm skew ({phase_s:g} s phases)", group="clock",
        injected="source A's clock jumps +1 h then back (re-sync every 1 s); source B drifts at 500 ppm; source C "
                 "healthy; 100 events/s each",
        checked="0 lost/duplicated; B and C: all ordered, none late, |ref - true| <= bound + 2 ms; merged stream "
                "in ref order; no watermark ahead of the gateway clock; A's events corrected or late with a reason",
        outcome={"events": sent, "jumper_fate": dict(sorted(jumper_fate.items())),
                 "p99_abs_ref_error_us": p99, "skewed_raw_drift_us": raw_drift_us,
                 "estimated_skew_ppm": estimate_skew, "late_records": len(delivery.late)})
