"""gateway.launch: the ready lines the CLI writes are the ones the launcher reads; failures to start are reported."""

from __future__ import annotations

import sys

import pytest

from gateway.launch import (
    GatewayAddresses,
    GatewayLaunchError,
    ReadyLineParser,
    gateway_command,
    ready_lines,
    spawn_gateway,
    spawn_gateway_async,
)

FULL = GatewayAddresses("127.0.0.1", 7700, "0.0.0.0", 7452, "127.0.0.1", 9100)


def parse(lines: list[str]) -> GatewayAddresses | None:
    parser = ReadyLineParser()
    results = [parser.feed(line) for line in lines]
    assert all(r is None for r in results[:-1])  # only the last line, the ready line, completes them
    return results[-1]


@pytest.mark.parametrize("addresses", [FULL, GatewayAddresses("::1", 7700), GatewayAddresses("h", 1, "h", 2)])
def test_what_the_cli_prints_is_what_the_launcher_reads(addresses: GatewayAddresses):
    assert parse(ready_lines(addresses)) == addresses


def test_the_ready_line_comes_last():
    assert ready_lines(FULL) == ["timesync udp 0.0.0.0:7452", "metrics http://127.0.0.1:9100/metrics",
                                 "listening 127.0.0.1:7700"]


def test_the_command_runs_the_skewless_cli_through_an_optional_wrapper():
    assert gateway_command(["--port", "0"], wrapper=["ip", "netns", "exec", "lab"], python="py") == [
        "ip", "netns", "exec", "lab", "py", "-m", "skewless", "gateway", "--port", "0", "--metrics-port", "0"]


def test_a_spawned_gateway_serves_metrics_on_a_free_port_unless_told_otherwise():
    # Several gateways of the demo, tests and benchmarks share a host: the default metrics port 7780 would clash.
    assert gateway_command([], python="py")[-2:] == ["--metrics-port", "0"]
    assert gateway_command(["--metrics-port", "7781"], python="py")[-2:] == ["--metrics-port", "7781"]
    assert gateway_command(["--metrics-port=7781"], python="py")[-1] == "--metrics-port=7781"
    assert gateway_command(["--no-metrics"], python="py")[-1] == "--no-metrics"


def fake_gateway(code: str) -> list[str]:
    """A wrapper that runs `code` instead of the gateway it is given as arguments."""
    return [sys.executable, "-c", code]


def test_spawn_returns_the_process_and_the_addresses_of_the_ready_lines():
    lines = "\\n".join(ready_lines(FULL))
    process, addresses = spawn_gateway([], wrapper=fake_gateway(f"print('starting'); print('{lines}')"))
    assert addresses == FULL
    assert process.wait(10) == 0
    assert process.stdout is not None
    process.stdout.close()  # the caller owns the pipe


def test_a_gateway_that_exits_before_its_ready_line_is_an_error():
    with pytest.raises(GatewayLaunchError, match=r"exited before its ready line; saw \['oops'\]"):
        spawn_gateway([], wrapper=fake_gateway("print('oops')"))


def test_a_silent_gateway_is_killed_at_the_timeout():
    with pytest.raises(GatewayLaunchError, match=r"no ready line within 0\.5 s"):
        spawn_gateway([], wrapper=fake_gateway("import time; time.sleep(30)"), timeout_s=0.5)


async def test_spawn_async_reads_the_same_lines():
    lines = "\\n".join(ready_lines(FULL))
    process, addresses = await spawn_gateway_async([], wrapper=fake_gateway(f"print('{lines}')"))
    assert addresses == FULL
    assert await process.wait() == 0
    with pytest.raises(GatewayLaunchError, match=r"no ready line within 0\.5 s"):
        await spawn_gateway_async([], wrapper=fake_gateway("import time; time.sleep(30)"), timeout_s=0.5)
