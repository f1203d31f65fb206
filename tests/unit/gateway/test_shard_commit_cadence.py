"""The commit task's cadence (``ShardRuntime._commit_forever``): a commit every ``commit_interval_s`` counted from
each commit's start, so a slow commit (its confirm phase, its acks) does not stretch the interval the setting
names."""

from __future__ import annotations

import asyncio
import dataclasses
from unittest import mock

import pytest

from gateway.shard import next_commit_delay_s
from tests.unit.gateway.test_acks_confirmed_run import T0
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
