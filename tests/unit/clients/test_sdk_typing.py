"""The SDK's options are typed: mypy --strict rejects a misspelled or mistyped option in every entry point
(``connect``, ``connect_sync``, ``SkewlessClient``, ``SyncSkewlessClient``) and accepts the documented calls."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

GOOD = '''
import asyncio
from clients import SkewlessClient, SyncSkewlessClient, connect, connect_sync

async def main() -> None:
    client = await connect("127.0.0.1", 9892, None, "s1", 10, streams=["temps"], pool_size=2,
                           heartbeat_interval_s=1.0, gateways=[("10.0.0.2", 9892)])
    delivered: asyncio.Future[int] = await client.send_tracked("temps", {"celsius": 21.4})
    seq: int = await delivered
    SkewlessClient("127.0.0.1", 9892, "s1", ["temps"], udp_port=7452, time_sync=False, max_unacked=10)

def blocking() -> None:
    connect_sync("127.0.0.1", 9892, 7452, "s1", 10, streams=["temps"], pool_size=2)
    SyncSkewlessClient("127.0.0.1", 9892, "s1", ["temps"], udp_port=7452, sync_attempts=5)
'''

BAD = '''
from clients import SkewlessClient, SyncSkewlessClient, connect, connect_sync

async def main() -> None:
    await connect("127.0.0.1", 9892, None, "s1", 10, streams=["temps"], pool_sise=2)

def blocking() -> None:
    connect_sync("127.0.0.1", 9892, 7452, "s1", 10, streams=["temps"], pool_sise=2)
    SyncSkewlessClient("127.0.0.1", 9892, "s1", ["temps"], pool_sise=2)
    SkewlessClient("127.0.0.1", 9892, "s1", ["temps"], pool_sise=2)
    SyncSkewlessClient("127.0.0.1", 9892, "s1", ["temps"], pool_size="2")
'''


@pytest.mark.timeout(300)
def test_mypy_rejects_a_misspelled_option_and_accepts_the_documented_calls(tmp_path):
    (tmp_path / "good.py").write_text(textwrap.dedent(GOOD))
    (tmp_path / "bad.py").write_text(textwrap.dedent(BAD))
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--hide-error-context",
         "--cache-dir", str(tmp_path / "cache"), "--config-file", str(ROOT / "pyproject.toml"),
         str(tmp_path / "good.py"), str(tmp_path / "bad.py")],
        cwd=ROOT, capture_output=True, text=True, check=False)
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert result.returncode == 1, result.stdout + result.stderr
    assert not [e for e in errors if "good.py" in e], errors
    by_line = {int(m.group(1)): e for e in errors if (m := re.search(r"bad\.py:(\d+):", e))}
    # One error on each bad call: lines 5, 8, 9, 10 misspell pool_size, line 11 passes a str for an int.
    assert sorted(by_line) == [5, 8, 9, 10, 11], errors
    assert all('"pool_sise"' in by_line[line] for line in (5, 8, 9, 10)), errors
    assert '"pool_size"' in by_line[11] and '"str"' in by_line[11], errors
