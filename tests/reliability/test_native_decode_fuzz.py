"""Fuzzing the native connection decoder through its Python boundary (atheris, coverage-guided, in a child process):
no crash, no exception but protocol errors, and the same actions as the Python decoder for every input (10^6 in
the long suite)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.reliability.harness import REPO, child_env, record_outcome


def _atheris_available() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import atheris, skewless_native"], capture_output=True,
                           check=False)
    return probe.returncode == 0


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("runs", [
    pytest.param(3_000, id="fast"),
    pytest.param(1_000_000, id="long", marks=pytest.mark.reliability_long),
])
def test_atheris_native_decoder_matches_the_python_one(runs: int) -> None:
    if not _atheris_available():
        pytest.skip("atheris or skewless_native is not installed for this Python")
    result = subprocess.run(
        [sys.executable, "-m", "tests.reliability.atheris_native_decode", f"-runs={runs}", "-seed=1",
         "-max_len=2048", "-print_final_stats=1"],
        capture_output=True, text=True, env=child_env(), cwd=str(REPO), timeout=3500, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    stats = {line.rpartition(":")[0]: line.rpartition(":")[2].strip() for line in result.stderr.splitlines()
             if line.startswith("stat::")}
    assert int(stats.get("stat::number_of_executed_units", "0")) >= runs
    record_outcome(
        f"Atheris native decoder ({runs:,} runs)", group="hostile",
        injected=f"{runs:,} coverage-guided connections (hello or not, framed and raw bytes, chunked reads)",
        checked="no crash or uncaught exception; the native decoder's actions, state and buffer equal the Python "
                "decoder's on every input",
        outcome={"executed": int(stats.get("stat::number_of_executed_units", "0")),
                 "exec_per_s": int(stats.get("stat::average_exec_per_sec", "0")),
                 "peak_rss_mb": int(stats.get("stat::peak_rss_mb", "0"))})
