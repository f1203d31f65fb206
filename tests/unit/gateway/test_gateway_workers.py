"""`--workers N`: each worker's command line (its own ports and ids, everything else passed on)."""

from __future__ import annotations

from gateway.config import build_config
from skewless.cli_gateway import worker_arguments


def test_each_worker_gets_its_own_ports_and_ids_and_the_rest_unchanged() -> None:
    config = build_config({"port": 7700, "timesync_port": 7452, "metrics_port": 9300, "gateway_id": "gw",
                           "instance_id": "host-a"})
    argv = ["--workers", "3", "--port", "7700", "--shards=6", "--metrics-port=9300", "--bootstrap", "k:9092",
            "--gateway-id", "gw", "--instance-id", "host-a"]
    assert worker_arguments(argv, 2, config) == [
        "--shards=6", "--bootstrap", "k:9092", "--port", "7702", "--timesync-port", "7454", "--metrics-port", "9302",
        "--gateway-id", "gw-2", "--instance-id", "host-a-2"]


def test_port_zero_stays_zero_and_absent_services_stay_absent() -> None:
    config = build_config({"port": 0, "timesync": False, "metrics_port": 0})
    assert worker_arguments(["--workers=2", "--no-timesync", "--port", "0", "--metrics-port", "0"], 1, config) == [
        "--no-timesync", "--port", "0", "--metrics-port", "0"]


def test_the_default_metrics_port_is_shared_out_like_the_others() -> None:
    config = build_config({"port": 0, "timesync": False})
    assert worker_arguments(["--workers=2", "--no-timesync", "--port", "0"], 1, config) == [
        "--no-timesync", "--port", "0", "--metrics-port", "7781"]
