"""The event loop thread's scheduler slice (gateway/scheduling.py): the request's bytes, and on this Linux what a
thread gets, what threads it starts later get, and that an operator's policy and nice value are kept. Each check runs
in a thread of its own, so the test process's threads keep their scheduling."""

from __future__ import annotations

import os
import platform
import struct
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.config import ConfigError, build_config, load_settings
from gateway.scheduling import DEFAULT_LOOP_SLICE_US, request_loop_slice, sched_attr_bytes


def test_the_request_is_a_fair_class_slice_at_the_threads_nice_not_inherited() -> None:
    assert sched_attr_bytes(100_000, 3) == struct.pack("=IIQiIQQQ", 48, 0, 1, 3, 0, 100_000, 0, 0)
    assert len(sched_attr_bytes(1, -2)) == 48  # SCHED_ATTR_SIZE_VER0


def kernel_slice_ns() -> int | None:
    """se.slice of the calling thread, None where the kernel does not show one."""
    path = Path("/proc/thread-self/sched")
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        if line.startswith("se.slice"):
            return int(line.split(":")[1])
    return None


def custom_slices() -> bool:
    if platform.system() != "Linux" or kernel_slice_ns() is None:
        return False
    major, minor = (int(part) for part in platform.release().split(".")[:2])
    return (major, minor) >= (6, 12)


needs_custom_slices = pytest.mark.skipif(not custom_slices(), reason="custom EEVDF slices need Linux 6.12+")


def in_a_thread(work: Callable[[], object]) -> object:
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(work()))
    thread.start()
    thread.join(10)
    assert result, "the thread did not finish"
    return result[0]


@needs_custom_slices
def test_the_thread_gets_its_slice_and_the_threads_it_starts_later_do_not() -> None:
    def work() -> tuple[int | None, str, int | None, int | None]:
        default_ns = kernel_slice_ns()
        line = request_loop_slice(250)
        started_later = in_a_thread(kernel_slice_ns)
        assert started_later is None or isinstance(started_later, int)
        return kernel_slice_ns(), line, started_later, default_ns

    slice_ns, line, started_later_ns, default_ns = in_a_thread(work)  # type: ignore[misc]
    assert slice_ns == 250_000
    assert line == "event loop thread: 250 us scheduler slice (EEVDF)"
    assert started_later_ns == default_ns != 250_000


@needs_custom_slices
def test_the_threads_nice_value_is_kept() -> None:
    def work() -> tuple[int, int | None]:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 3)  # a thread's own nice (Linux)
        request_loop_slice(DEFAULT_LOOP_SLICE_US)
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), kernel_slice_ns()

    assert in_a_thread(work) == (3, DEFAULT_LOOP_SLICE_US * 1000)


@needs_custom_slices
def test_a_policy_set_from_outside_is_left_alone() -> None:
    def work() -> tuple[str, int, int | None, int | None]:
        before_ns = kernel_slice_ns()
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        line = request_loop_slice(DEFAULT_LOOP_SLICE_US)
        return line, os.sched_getscheduler(0), kernel_slice_ns(), before_ns

    line, policy, slice_ns, before_ns = in_a_thread(work)  # type: ignore[misc]
    assert line == f"event loop thread: scheduling policy {os.SCHED_BATCH} set from outside; its slice left as it is"
    assert policy == os.SCHED_BATCH
    assert slice_ns == before_ns


def test_zero_leaves_the_kernels_default() -> None:
    def work() -> tuple[str, int | None, int | None]:
        before_ns = kernel_slice_ns()
        return request_loop_slice(0), kernel_slice_ns(), before_ns

    line, after_ns, before_ns = in_a_thread(work)  # type: ignore[misc]
    assert line == "event loop thread: the kernel's default scheduler slice (loop_slice_us = 0)"
    assert after_ns == before_ns


def configured(value: str) -> int:
    return build_config(load_settings(None, env={"SKEWLESS_GATEWAY_LOOP_SLICE_US": value})).loop_slice_us


@pytest.mark.parametrize(("value", "expected_us"), [("100us", 100), ("250", 250), ("2ms", 2000), ("0", 0)])
def test_the_setting_takes_a_duration_in_the_kernels_range_or_zero(value: str, expected_us: int) -> None:
    assert configured(value) == expected_us


def test_the_default_is_the_shortest_slice_the_kernel_takes() -> None:
    assert build_config({}).loop_slice_us == DEFAULT_LOOP_SLICE_US == 100


@pytest.mark.parametrize("value", ["50", "200ms", "-100us"])
def test_a_slice_outside_the_kernels_range_is_refused_with_one_line(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^loop_slice_us must be 0 \(the kernel's default\) or 100us\.\.100ms"):
        configured(value)
