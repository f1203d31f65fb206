"""Load figures for docs/reliability.md: 1,000 concurrent sources on 10,000 connections for a bounded time.

Starts its own single-node broker, then runs benchmarks/harness/load.py's `run_load` (a `skewless gateway` process,
a load generator process, /proc sampling and /healthz probes every 100 ms), prints the figures, stores the time
series in artifacts/reliability/load-samples-<sources>.json and rebuilds docs/reliability.md (with
docs/reliability-load.png) from whatever campaign rows are in artifacts/reliability/.

Run: .venv/bin/python -m benchmarks.reliability_load [--sources 1000 --pool 10 --rate 10 --duration-s 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import uuid
from pathlib import Path
from typing import Any

import orjson

from benchmarks.harness.load import run_load
from benchmarks.harness.report import render
from broker.launcher import KafkaBroker
from reorder.eval.progress import progress_bar, progress_enabled

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "artifacts" / "reliability"


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="skewless-load-") as tmp:
        enabled = progress_enabled(not args.no_progress)
        broker = KafkaBroker(Path(tmp) / "kafka")
        with progress_bar("starting Kafka", None, enabled=enabled):
            state = broker.start()
        try:
            # run_load has no progress hook: a pulsing bar with the elapsed time (connect, load, drain).
            with progress_bar(f"{args.sources:,} sources, {args.duration_s:g} s of load, then the drain", None,
                              enabled=enabled):
                return await run_load(state.bootstrap_servers, f"load{uuid.uuid4().hex[:6]}", Path(tmp) / "work",
                                      args.sources, args.pool, args.rate, args.duration_s)
        finally:
            broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sources", type=int, default=1_000)
    parser.add_argument("--pool", type=int, default=10)
    parser.add_argument("--rate", type=float, default=10.0, help="events/s per source")
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (stderr, terminals only)")
    args = parser.parse_args()
    result = asyncio.run(measure(args))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"load-samples-{args.sources}.json").write_bytes(orjson.dumps(result))
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    print(f"wrote {render(OUT).relative_to(REPO)}")


if __name__ == "__main__":
    main()
