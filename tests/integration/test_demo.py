"""The README's main job, `skewless demo`, as a user runs it: its own Kafka, gateway, three skewed sources and the
Spark window and CEP jobs, each result checked by the demo itself against the records in Kafka and the pure cores.

It once went red unnoticed for a day (its last window stayed open after the sources' byes stopped punctuating the
stream), so it runs here, with fewer events than its default."""

from __future__ import annotations

import subprocess
import sys


def test_the_main_job_runs_and_verifies_itself() -> None:
    result = subprocess.run([sys.executable, "-m", "skewless", "demo", "--events", "150"], capture_output=True,
                            text=True, timeout=600, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "events in the wrong window: 0 with Skewless' reference time" in output
    assert "Spark's window counts equal the counts of the records in Kafka" in output
    assert "the CEP jobs' results equal the pure cores' results on the same records" in output
