"""`make reliability`: run the whole reliability campaign (fast + long suites) and regenerate docs/reliability.md.

Each scenario of tests/reliability/ writes its outcome row into artifacts/reliability/ (SKEWLESS_RELIABILITY_OUT);
the long suite's load test also leaves its time series there. benchmarks/harness/report.py turns the rows into the
document and docs/reliability-load.png. Exits non-zero if any scenario failed (the document is still rebuilt from
the rows that were written).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "artifacts" / "reliability"


def run_suite(marker: str) -> tuple[int, float]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/reliability", "-m", marker, "-p", "no:cacheprovider", "-q",
         "-o", "addopts=--strict-markers -ra"],
        cwd=REPO, env={**os.environ, "SKEWLESS_RELIABILITY_OUT": str(OUT), "PYTHONPATH": str(REPO)}, check=False)
    return result.returncode, time.monotonic() - started


def main() -> int:
    from benchmarks.harness.report import render

    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    fast_rc, fast_s = run_suite("not reliability_long")
    long_rc, long_s = run_suite("reliability_long")
    timings = {"its fast part (`-m 'not reliability_long'`)": fast_s, "its long part (`-m reliability_long`)": long_s}
    (OUT / "timings.json").write_bytes(orjson.dumps(timings))
    path = render(OUT, timings)
    print(f"wrote {path.relative_to(REPO)}; fast suite {fast_s:.0f} s (rc {fast_rc}), long suite {long_s:.0f} s "
          f"(rc {long_rc})")
    return 0 if fast_rc == 0 and long_rc == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
