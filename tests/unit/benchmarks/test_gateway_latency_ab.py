"""benchmarks/gateway_latency_ab.py: the rounds' alternating order and the comparison, on hand-made figures."""

from __future__ import annotations

from pathlib import Path

from benchmarks.gateway_latency_ab import BEFORE, THIS, Side, comparison, round_order


def test_the_first_of_each_pair_alternates() -> None:
    sides = [Side(THIS, None), Side(BEFORE, Path("/tmp/before"))]
    assert [[s.label for s in round_order(sides, i)] for i in range(3)] == [
        [THIS, BEFORE], [BEFORE, THIS], [THIS, BEFORE]]


def run(added: float, lag: float, cpu: float) -> dict[str, float]:
    return {"added_p99_ms": added, "read_lag_p99_ms": lag, "gateway_cpu_share": cpu}


def test_the_comparison_gives_each_sides_medians_and_the_rounds_this_checkout_was_lower() -> None:
    rounds = [{THIS: run(6.5, 1.8, 0.60), BEFORE: run(7.0, 2.4, 0.62)},
              {THIS: run(7.2, 2.6, 0.66), BEFORE: run(6.9, 2.2, 0.64)},
              {THIS: run(6.4, 1.6, 0.61), BEFORE: run(7.4, 2.9, 0.63)}]
    assert comparison(rounds).splitlines() == [
        " this checkout: added p99 median 6.50 ms (range 6.40-7.20), read lag p99 median 1.80 ms, loop's thread on a "
        "CPU 0.61 of the wall",
        "        before: added p99 median 7.00 ms (range 6.90-7.40), read lag p99 median 2.40 ms, loop's thread on a "
        "CPU 0.63 of the wall",
        "this checkout's added p99 lower in 2 of 3 rounds"]
