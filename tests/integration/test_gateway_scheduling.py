"""A real `skewless gateway` process asks for its event loop thread's scheduler slice at start (gateway/scheduling.py),
says what it got in its log, and leaves its other threads (librdkafka's) the kernel's default."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.scheduling import DEFAULT_LOOP_SLICE_US
from tests.reliability.harness import GatewayProcess
from tests.unit.gateway.test_scheduling import custom_slices


def thread_slices_ns(pid: int) -> dict[str, int]:
    """se.slice of each thread of ``pid`` by its name (the last of a name wins), the main thread as "main"."""
    slices = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "sched").read_text().splitlines():
            if line.startswith("se.slice"):
                name = "main" if task.name == str(pid) else (task / "comm").read_text().strip()
                slices[name] = int(line.split(":")[1])
    return slices


@pytest.mark.skipif(not custom_slices(), reason="custom EEVDF slices need Linux 6.12+")
async def test_the_gateways_event_loop_thread_runs_with_its_slice_and_says_so(kafka, topic_prefix, tmp_path):
    process = GatewayProcess(kafka.bootstrap_servers, topic_prefix, tmp_path)
    await process.start()
    try:
        assert process.process is not None
        slices = thread_slices_ns(process.process.pid)
        log = process.log()
    finally:
        await process.stop()
    assert f"event loop thread: {DEFAULT_LOOP_SLICE_US} us scheduler slice (EEVDF)" in log
    assert slices["main"] == DEFAULT_LOOP_SLICE_US * 1000
    # Only the loop's thread asked: librdkafka's threads and the executor's (named as the process is, which depends
    # on how Python was started) keep the kernel's default.
    others = {name: slice_ns for name, slice_ns in slices.items() if name != "main"}
    assert "rdk:main" in others
    assert any(not name.startswith(("rdk:", "libuv")) for name in others), others  # the executor's
    assert DEFAULT_LOOP_SLICE_US * 1000 not in others.values()
