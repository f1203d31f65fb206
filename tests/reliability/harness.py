"""Shared pieces of the reliability campaign: the outcome log here; real gateway processes, exactly-once checks and
/proc readings in benchmarks/harness/processes.py (benchmarks use them too).

Every scenario ends with `record_outcome(...)`: when SKEWLESS_RELIABILITY_OUT names a directory (`make reliability`,
benchmarks/harness/campaign.py, sets it), one JSON file per scenario lands there and becomes a row of
docs/reliability.md.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks.harness.processes import (  # noqa: F401  (the campaign's tests import them from here)
    REPO,
    Delivery,
    GatewayProcess,
    child_env,
    http_get,
    http_get_json,
    open_fds,
    read_delivery,
    rss_kib,
)
from tests.conditions import wait_until  # noqa: F401  (the campaign's tests import it from here)

OUT_ENV = "SKEWLESS_RELIABILITY_OUT"


def record_outcome(scenario: str, injected: str, checked: str, outcome: dict[str, Any], *, group: str) -> None:
    """One row of docs/reliability.md (written only when the campaign runner asked for it)."""
    out = os.environ.get(OUT_ENV)
    if not out:
        return
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", scenario.lower()).strip("-")
    row = {"scenario": scenario, "group": group, "injected": injected, "checked": checked, "outcome": outcome,
           "recorded_unix_s": time.time()}
    (path / f"{slug}.json").write_bytes(orjson.dumps(row, option=orjson.OPT_INDENT_2))
