"""Network faults between the SDK and the gateway: clients in their own network namespace behind a userspace relay
(tests/reliability/netfault.py) that delays, jitters, drops, duplicates and reorders packets, or blackholes them for
a partition. The gateway and the broker stay in the host namespace.

The same workload (3 sources, deterministic source timestamps) runs once over a clean relay and once over the
impaired one; what Kafka holds must be the same: the same events, each once, in the same merged order.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import replace
from typing import Any

import orjson
import pytest

from gateway.server import Gateway, GatewayConfig
from reorder.pipeline import GATEWAY_SEQUENCE_DEFAULTS, PipelineConfig
from tests.reliability.harness import REPO, Delivery, child_env, read_delivery, record_outcome
from tests.reliability.netfault import Impairment, netlab, netns_unavailable
from timesync.clocks import system_time_us

_UNAVAILABLE = netns_unavailable()
pytestmark = [pytest.mark.integration, pytest.mark.netns, pytest.mark.timeout(300),
              pytest.mark.skipif(_UNAVAILABLE is not None, reason=f"network namespaces: {_UNAVAILABLE}")]

SOURCES = ("n0", "n1", "n2")
IMPAIRED = Impairment(delay_us=2_000, jitter_us=1_500, loss=0.02, duplicate=0.02, reorder=0.03, reorder_extra_us=4_000)
# A deployment that must ride out partitions of up to ~15 s lets the merge wait that long for a silent source.
PARTITION_TOLERANT = PipelineConfig(sequence=replace(GATEWAY_SEQUENCE_DEFAULTS, min_timeout_us=20_000_000,
                                                     latency_threshold_us=20_000_000))


async def run_workload(kafka, prefix: str, lab_index: int, impairment: Impairment, n: int, ts_base: int,
                       partition_s: float = 0.0, pipeline: PipelineConfig | None = None) -> tuple[
        Delivery, dict[str, Any], dict[str, Any]]:
    with netlab(lab_index, impairment, seed=lab_index) as lab:
        config = GatewayConfig(host=lab.gateway_ip, port=0, bootstrap_servers=kafka.bootstrap_servers,
                               topic_prefix=prefix)
        if pipeline is not None:
            config.pipeline = pipeline
        gateway = Gateway(config)
        await gateway.start()
        relay_stats: dict[str, Any] = {}
        try:
            started = time.monotonic()
            child = await asyncio.create_subprocess_exec(
                *lab.client_prefix, sys.executable, "-m", "tests.reliability.client_driver", "--host", lab.gateway_ip,
                "--port", str(gateway.port), "--sources", ",".join(SOURCES), "--events", str(n), "--ts-base",
                str(ts_base), "--batch", "50", "--pace-every", "50", "--pace-s", "0.02", "--backoff-max-s", "1.0",
                stdout=asyncio.subprocess.PIPE, env=child_env(), cwd=str(REPO))
            assert child.stdout is not None
            lines: list[str] = []
            async with asyncio.timeout(240):
                if partition_s:
                    while True:  # partition once every source has a third of its events acknowledged
                        line = (await child.stdout.readline()).decode()
                        assert line, "the clients finished before the partition"
                        lines.append(line)
                        if line.startswith("progress") and int(line.split()[3]) >= n // 3:
                            break
                    lab.command("partition on")
                    await asyncio.sleep(partition_s)  # the fault itself: 10 s of blackholed packets
                    relay_stats["partition"] = lab.command("partition off")["stats"]
                out, _ = await child.communicate()
            lines += out.decode().splitlines()
            assert child.returncode == 0, lines[-5:]
            summary = orjson.loads(lines[-1])
            relay_stats.update(lab.command("stats")["stats"])  # type: ignore[arg-type]
            relay_stats["run_s"] = round(time.monotonic() - started, 2)
            relay_stats["merge_source_timeouts"] = gateway.pipeline.counters.source_timeouts
            relay_stats["gateway_duplicates_dropped"] = gateway.counters.duplicates
        finally:
            await gateway.stop()
    return read_delivery(kafka.bootstrap_servers, prefix, "s"), summary, relay_stats


def fingerprint(delivery: Delivery) -> tuple[list[tuple[str, int, int, Any]], list[tuple[str, int]]]:
    """(every event's identity and content, the merged order): what must not depend on the network."""
    events = sorted((r["source_id"], r["seq"], r["source_ts_us"], orjson.dumps(r["payload"])) for r in delivery.events)
    order = [(r["source_id"], r["seq"]) for r in delivery.events]
    return events, order  # type: ignore[return-value]


@pytest.mark.parametrize("n", [pytest.param(1_000, id="fast"),
                               pytest.param(3_000, id="long", marks=pytest.mark.reliability_long)])
async def test_delay_jitter_loss_duplication_reordering_change_nothing(kafka, n: int):
    ts_base = system_time_us() - 3_600_000_000
    clean, _, _ = await run_workload(kafka, f"nb{n}{ts_base % 10_000}", 11, Impairment(), n, ts_base)
    impaired, summary, relay = await run_workload(kafka, f"ni{n}{ts_base % 10_000}", 12, IMPAIRED, n, ts_base)
    expected = dict.fromkeys(SOURCES, n)
    clean.assert_exactly_once_in_order(expected)
    impaired.assert_exactly_once_in_order(expected)
    assert clean.late == [] and impaired.late == []
    assert fingerprint(impaired) == fingerprint(clean)
    assert relay["lost"] > 0 and relay["duplicated"] > 0 and relay["reordered"] > 0  # the faults really happened
    record_outcome(
        f"Network impairment ({n} events/source)", group="network",
        injected=f"clients in a network namespace behind a userspace relay: {IMPAIRED.describe()}, both directions",
        checked="same events, each once, same merged order as the run over a clean relay; nothing late",
        outcome={**impaired.summary(expected), "identical_to_clean_run": True,
                 "packets": {k: relay[k] for k in ("forwarded", "lost", "duplicated", "reordered")},
                 "run_s": relay["run_s"], "client_reconnects": sum(s["reconnects"] for s in summary["sources"])})


@pytest.mark.reliability_long
async def test_ten_second_partition_changes_nothing(kafka):
    n = 3_000
    ts_base = system_time_us() - 3_600_000_000
    clean, _, _ = await run_workload(kafka, f"pb{ts_base % 10_000}", 13, Impairment(), n, ts_base)
    tolerant, _, relay = await run_workload(kafka, f"pt{ts_base % 10_000}", 14, IMPAIRED, n, ts_base,
                                            partition_s=10.0, pipeline=PARTITION_TOLERANT)
    default, _, relay_default = await run_workload(kafka, f"pd{ts_base % 10_000}", 15, IMPAIRED, n, ts_base,
                                                   partition_s=10.0)
    expected = dict.fromkeys(SOURCES, n)
    clean.assert_exactly_once_in_order(expected)
    tolerant.assert_exactly_once_in_order(expected)
    assert tolerant.late == []
    assert fingerprint(tolerant) == fingerprint(clean)
    assert relay["partition"]["partition_dropped"] > 0
    # With the default merge waits (<= 2 s) the partitioned sources time out in the merge: still nothing lost or
    # duplicated, each source's ordered events in seq order, and what the merge could no longer place in order is on
    # the late topic with its reason.
    summary = default.summary(expected)
    assert summary["lost"] == 0 and summary["duplicated"] == 0
    for source in SOURCES:
        seqs = default.seqs(source)
        assert seqs == sorted(seqs)
    assert {r["late_reason"] for r in default.late} <= {"after_punctuation", "behind_watermark", "late"}
    record_outcome(
        "Network partition 10 s", group="network",
        injected=f"10 s blackhole of every packet mid-stream on top of {IMPAIRED.describe()}",
        checked="merge configured to wait 20 s for silent sources: identical to the clean run; default merge "
                "waits: 0 lost, 0 duplicated, per-source order kept, the rest on the late topic",
        outcome={"tolerant": {**tolerant.summary(expected), "identical_to_clean_run": True,
                              "partition_dropped_packets": relay["partition"]["partition_dropped"],
                              "run_s": relay["run_s"]},
                 "default_waits": {**summary, "merge_source_timeouts": relay_default["merge_source_timeouts"],
                                   "late_reasons": sorted({r["late_reason"] for r in default.late})}})
