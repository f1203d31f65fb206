"""benchmarks/gateway_workers.py and benchmarks/harness/processes.py: the pure helpers (/proc stat fields, the
process tree, shard ownership and the routing of sources to workers, the throughput bound, the per-configuration
means) on hand-computed examples."""

from __future__ import annotations

import pytest

from benchmarks.gateway_workers import (
    WorkersRun,
    evenly_split,
    host_throughput_bound,
    route_sources,
    shard_owners,
    summarize,
)
from benchmarks.harness.processes import machine_ticks, process_tree, stat_command, stat_cpu_ticks, stat_parent

# /proc/PID/stat with a command name holding a space and a ')': after the last ')' come state (S), ppid (77),
# pgrp, session, tty_nr, tpgid, flags, minflt, cminflt, majflt, cmajflt, utime (250), stime (75), cutime (3),
# cstime (4), ...
STAT = "4242 (my ) proc) S 77 4242 4242 0 -1 4194304 100 0 0 0 250 75 3 4 20 0 5 0 123 456 789"


def test_cpu_ticks_are_utime_plus_stime_counted_after_the_last_parenthesis() -> None:
    assert stat_cpu_ticks(STAT) == 250 + 75  # children's cutime and cstime are not the process's own


def test_the_parent_pid_is_the_field_after_the_state() -> None:
    assert stat_parent(STAT) == 77


def test_the_command_name_is_all_between_the_first_and_the_last_parenthesis() -> None:
    assert stat_command(STAT) == "my ) proc"


def test_the_process_tree_is_the_root_and_every_descendant_and_nothing_else() -> None:
    # 1 -> 10 -> {20, 21}; 20 -> 30 (a grandchild); 1 -> 40 (a sibling of the root, not below it); 30 -> 35
    parent_of = {1: 0, 10: 1, 21: 10, 20: 10, 30: 20, 35: 30, 40: 1, 41: 40}
    assert process_tree(10, parent_of) == [10, 20, 21, 30, 35]
    assert process_tree(40, parent_of) == [40, 41]
    assert process_tree(35, parent_of) == [35]  # a leaf: itself only
    assert process_tree(99, parent_of) == [99]  # gone from the table: still itself (its CPU read will fail)


def test_shard_owners_maps_each_shard_to_the_worker_serving_it() -> None:
    assert shard_owners([[0, 2], [3, 1]], 4) == {0: 0, 2: 0, 3: 1, 1: 1}
    assert shard_owners([[0, 1, 2, 3]], 4) == {0: 0, 1: 0, 2: 0, 3: 0}


@pytest.mark.parametrize(("serving", "message"), [
    ([[0, 1], [1, 2, 3]], "shard 1 served by workers 0 and 1"),
    ([[0, 1], [3]], r"shards \[2\] served by no worker"),
    ([[0, 1], [2, 3, 4]], "worker 1 serves shard 4, outside 0..3"),
])
def test_shard_owners_refuses_a_split_that_is_not_settled(serving: list[list[int]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        shard_owners(serving, 4)


def test_an_even_split_gives_every_worker_as_many_shards_give_or_take_one() -> None:
    assert evenly_split({0: 0, 1: 0, 2: 1, 3: 1}, 2)
    assert not evenly_split({0: 0, 1: 0, 2: 0, 3: 1}, 2)
    assert not evenly_split({0: 0, 1: 0, 2: 0, 3: 0}, 2)  # worker 1 holds none yet
    assert evenly_split({0: 0, 1: 1, 2: 0}, 2)  # 3 shards: 2 and 1
    assert evenly_split({0: 0, 1: 0, 2: 0, 3: 0}, 1)


def test_each_source_goes_to_the_worker_owning_its_kafka_partition() -> None:
    # Kafka's murmur2 vectors (tests/unit/contract/test_sharding.py): "abc" -> 479470107, "21" -> 1173551340,
    # "foobar" -> -790332482; & 0x7fffffff, % 4: shards 3, 0 and (1357151166 % 4 =) 2.
    owners = {0: 1, 1: 0, 2: 0, 3: 1}
    assert route_sources(["abc", "21", "foobar"], 4, owners) == {"abc": 1, "21": 1, "foobar": 0}


def test_a_source_of_a_shard_nobody_owns_is_an_error_not_a_guess() -> None:
    with pytest.raises(KeyError):
        route_sources(["abc"], 4, {0: 0, 1: 0, 2: 1})  # shard 3 has no owner


def test_machine_ticks_are_busy_and_total_of_the_aggregate_cpu_line() -> None:
    # user 100, nice 10, system 40, idle 500, iowait 20, irq 5, softirq 15, steal 10; guest 7 and guest_nice 0
    # are already counted in user and nice.
    assert machine_ticks("cpu  100 10 40 500 20 5 15 10 7 0") == (100 + 10 + 40 + 5 + 15 + 10, 700)
    with pytest.raises(ValueError, match="aggregate"):
        machine_ticks("cpu0 100 10 40 500 20 5 15 10 7 0")


def test_the_host_bound_is_cores_times_a_million_over_the_summed_us_per_event() -> None:
    assert host_throughput_bound(4, [10.0, 5.0, 5.0]) == 200_000.0  # 4e6 / 20
    assert host_throughput_bound(2, [20.0]) == 100_000.0


def run(label: str, workers: int, events: int, seconds: float, gateway_cpu_s: float, broker_cpu_s: float,
        machine_cpu_s: float) -> WorkersRun:
    return WorkersRun(label=label, workers=workers, round=1, events=events, seconds=seconds,
                      gateway_cpu_s=gateway_cpu_s, process_cpu_s={"the process": gateway_cpu_s},
                      main_thread_cpu_s=gateway_cpu_s / 2, machine_cpu_s=machine_cpu_s, broker_cpu_s=broker_cpu_s,
                      loadgen_cpu_s=0.5, ack_p50_ms=1.0, ack_p99_ms=2.0, late=0, redirects=0,
                      events_per_worker=[events], load_start=[0.0, 0.0, 0.0], load_end=[0.0, 0.0, 0.0])


def test_other_processes_are_the_machine_busy_time_less_gateway_broker_and_load_generator() -> None:
    assert run("1 process", 1, 100_000, 2.0, 2.0, 1.0, 4.0).others_cpu_s == 4.0 - 2.0 - 1.0 - 0.5


def test_a_configuration_is_the_mean_of_its_rounds_in_the_order_first_run() -> None:
    runs = [run("1 process", 1, 100_000, 2.0, 2.0, 1.0, 4.0), run("--workers 2", 2, 100_000, 1.0, 1.5, 0.8, 2.0),
            run("1 process", 1, 100_000, 4.0, 3.0, 1.2, 6.0)]
    one, two = summarize(runs)
    assert (one.label, one.runs, two.label, two.runs) == ("1 process", 2, "--workers 2", 1)
    assert one.events_per_s == (50_000 + 25_000) / 2
    assert one.gateway_us == (20.0 + 30.0) / 2  # 2.0 s and 3.0 s over 100,000 events
    assert one.main_thread_us == (10.0 + 15.0) / 2
    assert one.broker_us == pytest.approx((10.0 + 12.0) / 2)
    assert one.loadgen_us == 5.0
    assert one.gateway_cores == (1.0 + 0.75) / 2
    assert one.others_cores == pytest.approx((0.5 / 2.0 + 1.3 / 4.0) / 2)  # 4 - 2 - 1 - 0.5; 6 - 3 - 1.2 - 0.5
    assert one.per_gateway_core == 1e6 / 25.0
    assert two.events_per_s == 100_000 and two.gateway_us == 15.0 and two.broker_cores == 0.8
