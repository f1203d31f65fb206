"""A source's clock steps +5 s, then -2 s, between its periodic re-syncs (docs/architecture.md, "Clock steps").

Real gateway with its time-sync server, real SDK clients, real broker. Three sources send an event every 10 ms; the
stepping one is told to re-sync only every 10 minutes, so only the gateway's resync request can renew its estimate in
time. The gateway must catch each step at the first event stamped after it (exact seq), ask for a re-sync, and publish
every event of the stepped source on the events topic within its error bound of the truth; the other two sources'
events must come out as they would without the step: all on the events topic, in order, within their own error
bounds, none late.
"""

from __future__ import annotations

import asyncio

import pytest

from broker.reader import read_stream, read_topic
from clients import Backoff, SimulatedClock, SkewlessClient
from contract.topics import TopicNames
from gateway.server import Gateway, GatewayConfig
from timesync.clocks import system_time_us
from timesync.server import ServerConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TICK_S = 0.01
PHASE_S = 1.5
# (step applied to "a" at the start of the phase, phase name); the steps add up: +5 s, then back by 2 s to +3 s.
PHASES = [(0, "before"), (5_000_000, "stepped +5 s"), (-2_000_000, "stepped -2 s")]


async def test_clock_steps_are_caught_at_the_first_event_resynced_and_mapped_within_the_error_bound(
        kafka, topic_prefix):
    gateway = Gateway(GatewayConfig(port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix,
                                    timesync=ServerConfig(host="127.0.0.1", port=0)))
    await gateway.start()
    assert gateway.timesync_port is not None
    clocks = {"a": SimulatedClock(0), "b": SimulatedClock(300_000), "c": SimulatedClock(-200_000)}
    clients = {name: SkewlessClient("127.0.0.1", gateway.port, name, ["s"], udp_port=gateway.timesync_port,
                                    clock_us=clock, resync_interval_s=600.0, sync_attempts=6,
                                    backoff=Backoff(initial_s=0.02, max_s=0.2))
               for name, clock in clocks.items()}
    first_after_step: list[int] = []
    try:
        await asyncio.gather(*(c.connect() for c in clients.values()))
        loop = asyncio.get_running_loop()
        for step_us, phase in PHASES:
            if step_us:
                clocks["a"].ahead_us += step_us
            end = loop.time() + PHASE_S
            first = True
            while loop.time() < end:
                for name, client in clients.items():
                    # The true time and the source's stamp of the same instant: the simulated clock gives the truth.
                    true_us = system_time_us()
                    seq = await client.send("s", {"true_us": true_us, "phase": phase},
                                            source_ts_us=clocks[name].at(true_us))
                    if name == "a" and step_us and first:
                        first_after_step.append(seq)
                        first = False
                await asyncio.sleep(TICK_S)
        await asyncio.gather(*(c.flush(30.0) for c in clients.values()))
        steps = list(gateway.core.clock_steps)
        holds = list(gateway.core.clock_step_holds)
        counters = gateway.core.counters
        resyncs = {name: c.stats.resyncs_requested for name, c in clients.items()}
        final_offset_us = gateway.store.get("a").offset_us  # type: ignore[union-attr]
    finally:
        for client in clients.values():
            await client.close()
        await gateway.stop()

    topics = TopicNames(topic_prefix)
    published, _punctuations = read_stream(kafka.bootstrap_servers, topics.events("s"))
    late = [v for _k, v in read_topic(kafka.bootstrap_servers, topics.late("s"), timeout_s=5.0)]

    # Every event of every source is on the events topic, within its error bound of the truth; none is late.
    assert late == []
    for name, client in clients.items():
        mine = [r for r in published if r["source_id"] == name]
        assert [r["seq"] for r in mine] == list(range(client.next_seq("s"))), name
        for record in mine:
            error_us = abs(record["ref_ts_us"] - record["payload"]["true_us"])
            assert error_us <= record["uncertainty_us"], (name, record)
    # The events topic keeps its order promise across the steps.
    refs = [r["ref_ts_us"] for r in published]
    assert refs == sorted(refs)

    # Each step was caught at the first event stamped after it, and only there; only "a" was asked to re-sync.
    assert [(s.source_id, s.seq) for s in steps] == [("a", seq) for seq in first_after_step]
    assert steps[0].apparent_step_us == pytest.approx(5_000_000, abs=100_000)
    assert steps[1].apparent_step_us == pytest.approx(-2_000_000, abs=100_000)
    assert resyncs == {"a": 2, "b": 0, "c": 0}
    assert (counters.clock_steps, counters.clock_step_unresolved, counters.clock_step_false_alarms) == (2, 0, 0)
    assert final_offset_us == pytest.approx(-3_000_000, abs=5_000)  # the resync renewed the estimate: 3 s ahead
    assert [(h.source_id, h.outcome) for h in holds] == [("a", "resolved"), ("a", "resolved")]
    print(f"steps caught at a's seqs {first_after_step}; holds: "
          f"{[(h.events, round(h.held_us / 1000, 1)) for h in holds]} (events, ms)")
