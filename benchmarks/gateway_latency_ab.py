"""Two gateways' added latency side by side: this checkout against another (``--before``), in alternating rounds on
one broker (warmed up as docs/gateway-latency.md's is), the paced load of that page's target row (20 sources x 500
events/s, a frame every 5 ms) in one of its variants (``--variant``; by default "gateway first": the sources and the
gateway's event loop at real-time priority).

On this shared 2-core machine the page's figure moves with the host's state by more than most changes move it (its
runs read 6.2-8.2 ms at p99 for one tree in two days), so a change is judged here against the tree before it in the
same minutes: each round runs both gateways, one after the other, the first of the pair alternating. Every run
checks what gateway_latency checks (every event in Kafka exactly once, none late). Prints per run, then per tree the
medians over the rounds (added p99, read lag p99, the loop's thread on a CPU) and in how many rounds this checkout's
added p99 was the lower; writes nothing.

Run: .venv/bin/python -m benchmarks.gateway_latency_ab --before CHECKOUT [--rounds 8] [--seconds 5]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Side", "comparison", "round_order"]

THIS = "this checkout"
BEFORE = "before"


@dataclass(frozen=True, slots=True)
class Side:
    label: str
    tree: Path | None  # None: this checkout


def round_order(sides: Sequence[Side], index: int) -> list[Side]:
    """Round ``index``'s order: as given in even rounds, reversed in odd ones, so that neither always runs first."""
    return list(sides) if index % 2 == 0 else list(sides)[::-1]


def comparison(rounds: Sequence[dict[str, dict[str, Any]]]) -> str:
    """Per side the medians over ``rounds`` (each ``{label: the run's figures}``), and the rounds in which this
    checkout's added p99 was below the one before it."""
    lines = []
    for label in (THIS, BEFORE):
        runs = [r[label] for r in rounds]
        lines.append(f"{label:>14}: added p99 median {statistics.median(x['added_p99_ms'] for x in runs):.2f} ms "
                     f"(range {min(x['added_p99_ms'] for x in runs):.2f}-{max(x['added_p99_ms'] for x in runs):.2f}), "
                     f"read lag p99 median {statistics.median(x['read_lag_p99_ms'] for x in runs):.2f} ms, loop's "
                     f"thread on a CPU {statistics.median(x['gateway_cpu_share'] for x in runs):.2f} of the wall")
    lower = sum(1 for r in rounds if r[THIS]["added_p99_ms"] < r[BEFORE]["added_p99_ms"])
    lines.append(f"this checkout's added p99 lower in {lower} of {len(rounds)} rounds")
    return "\n".join(lines)


def main() -> None:
    from benchmarks.gateway_latency import VARIANTS, latency_run, warm_up_broker
    from benchmarks.gateway_throughput import scratch_broker_state

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="the other checkout (its gateway, its modules)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0, help="how long each run's sources send")
    parser.add_argument("--core", choices=["python", "native"], default="native")
    parser.add_argument("--rt-priority", type=int, default=10, help="the sources' SCHED_FIFO priority (the loop's: "
                        "one less)")
    parser.add_argument("--variant", choices=VARIANTS, default="gateway first", help="docs/gateway-latency.md's")
    args = parser.parse_args()
    sides = [Side(THIS, None), Side(BEFORE, args.before.resolve())]
    rounds: list[dict[str, dict[str, Any]]] = []
    with scratch_broker_state() as broker:
        bootstrap = broker.bootstrap_servers
        print(f"broker warm-up: its JIT compiler used {warm_up_broker(bootstrap, broker.pid):.2f} s of CPU", flush=True)
        for index in range(args.rounds):
            runs: dict[str, dict[str, Any]] = {}
            for side in round_order(sides, index):
                run = latency_run(bootstrap, 20, 500.0, args.seconds, args.core, args.rt_priority, args.variant,
                                  tree=side.tree, broker_pid=broker.pid)
                runs[side.label] = run
                print(f"#{index} {side.label:>14}: added p99 {run['added_p99_ms']:.2f} ms, read lag p99 "
                      f"{run['read_lag_p99_ms']:.2f} max {run['read_lag_max_ms']:.2f}, sources' schedule p99 "
                      f"{run['scheduled_p99_ms']:.2f}, loop's thread on a CPU {run['gateway_cpu_share']:.2f}, waiting for one "
                      f"{run['gateway_runqueue_share']:.3f}, broker JIT {run['broker_jit_s']:.2f} s",
                      flush=True)
            rounds.append(runs)
    print(comparison(rounds))


if __name__ == "__main__":
    main()
