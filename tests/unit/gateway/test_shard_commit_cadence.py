"""The commit task's cadence (``ShardRuntime._commit_forever``): a commit every ``commit_interval_s`` counted from
each commit's start, so a slow commit (its confirm phase, its acks) does not stretch the interval the setting
names; and each commit's duration in the gateway's histogram (``skewless_gateway_transaction_commit_seconds``)."""

from __future__ import annotations

import asyncio
import dataclasses
from unittest import mock

import pytest
from confluent_kafka import KafkaError, KafkaException

from gateway.histograms import DELIVERY_LATENCY_BUCKETS_US, Histogram
from gateway.shard import ShardLost, next_commit_delay_s
from tests.unit.gateway.test_acks_confirmed_run import T0
from tests.unit.gateway.test_shard_delivery_reports import three_records
from tests.unit.gateway.test_shard_stop import Step, transactional_runtime

pytestmark = pytest.mark.timeout(30)


class Stop(Exception):
    pass


@pytest.mark.parametrize(("durations_s", "expected_sleeps_s"), [
    ([0.03, 0.03, 0.03], [0.07, 0.07, 0.07]),  # the rest of each interval
    ([0.5, 0.03, 0.25], [0.0, 0.07, 0.0]),  # a commit longer than the interval: the next starts at once
])
async def test_commits_start_an_interval_apart_whatever_each_took(durations_s: list[float],
                                                                   expected_sleeps_s: list[float]) -> None:
    steps: list[Step] = []
    runtime = transactional_runtime(steps, [T0])
    runtime.settings = dataclasses.replace(runtime.settings, commit_interval_s=0.1)
    clock_s = [1000.0]
    runtime._monotonic_s = lambda: clock_s[0]
    commits: list[float] = []
    sleeps: list[float] = []

    async def commit() -> None:
        commits.append(clock_s[0])
        clock_s[0] += durations_s[len(commits) - 1]

    async def sleep(delay_s: float) -> None:
        sleeps.append(round(delay_s, 9))
        clock_s[0] += delay_s
        if len(sleeps) == len(durations_s):
            raise Stop

    runtime._commit = commit  # type: ignore[method-assign]
    runtime._produced_in_transaction = 1  # every round has something to commit
    with mock.patch.object(asyncio, "sleep", sleep), pytest.raises(Stop):
        await runtime._commit_forever()
    assert sleeps == expected_sleeps_s
    starts = [round(c - commits[0], 9) for c in commits]
    assert starts == [round(sum(max(0.1, d) for d in durations_s[:i]), 9) for i in range(len(durations_s))]


def test_the_delay_is_what_is_left_of_the_interval_never_negative() -> None:
    assert next_commit_delay_s(0.1, 10.0, 10.04) == pytest.approx(0.06)
    assert next_commit_delay_s(0.1, 10.0, 10.1) == pytest.approx(0.0)
    assert next_commit_delay_s(0.1, 10.0, 11.0) == 0.0


@pytest.mark.parametrize("fails", [False, True])
async def test_each_commit_goes_into_the_gateways_histogram_with_its_duration(fails: bool) -> None:
    steps: list[Step] = []
    now = [T0 + 100]
    runtime = transactional_runtime(steps, now, commit_error=KafkaException(KafkaError(KafkaError._FATAL))
                                    if fails else None)
    durations = Histogram(DELIVERY_LATENCY_BUCKETS_US)
    runtime.settings = dataclasses.replace(runtime.settings, commit_durations=durations)
    clock_s = [1000.0]
    runtime._monotonic_s = lambda: clock_s[0]
    publisher = runtime._publisher
    commit = publisher.commit

    def slow_commit(timeout_s: float) -> None:
        clock_s[0] += 0.0375  # Kafka took 37.5 ms to answer
        commit(timeout_s)

    publisher.commit = slow_commit  # type: ignore[method-assign]
    three_records(runtime, now)
    if fails:
        with pytest.raises(ShardLost):
            await runtime._commit()
        assert (durations.count, durations.sum_us) == (0, 0)  # a failed commit is no commit
        return
    await runtime._commit()
    assert (durations.count, durations.sum_us) == (1, 37_500)
    assert durations.counts[DELIVERY_LATENCY_BUCKETS_US.index(50_000)] == 1  # in (25 ms, 50 ms]
