"""The gateway's choice of per-event cores (gateway.native): which cores a setting gives, and that a gateway built
with the native ones runs the Rust decoder in its sessions and the Rust reorderers in its pipeline."""

from __future__ import annotations

import sys

import pytest
import skewless_native

from contract.wire.frames import encode_frame
from contract.wire.messages import IncomingEvent
from gateway.config import ConfigError, build_config
from gateway.native import NativeCoreMissing, NativeGatewaySession, resolve_core, with_core
from gateway.server import Gateway, GatewayConfig
from gateway.session import EventsReceived, GatewaySession, SourceRegistered
from reorder.pipeline import IngestPipeline, PipelineConfig, PublishRecord
from reorder.sequence import SequenceReorderer
from timesync.clocks import IdentityMapping


def test_auto_is_native_when_built_and_python_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_core("auto") == "native"
    assert resolve_core("python") == "python"
    monkeypatch.setitem(sys.modules, "skewless_native", None)  # as on an install that did not build it
    assert resolve_core("auto") == "python"
    with pytest.raises(NativeCoreMissing, match=r"not built: run `make native`"):
        resolve_core("native")


def test_the_core_setting_is_checked_when_the_config_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    assert build_config({}).core == "auto"
    assert build_config({"core": "python"}).core == "python"
    with pytest.raises(ConfigError, match=r"^core: core must be one of 'auto', 'native', 'python', got 'rust'$"):
        build_config({"core": "rust"})
    monkeypatch.setitem(sys.modules, "skewless_native", None)
    with pytest.raises(ConfigError, match=r"^core: the native core \(skewless_native\) is not built"):
        build_config({"core": "native"})


@pytest.mark.parametrize(("core", "session_type", "reorderer_type"), [
    ("native", NativeGatewaySession, skewless_native.SequenceReorderer),
    ("python", GatewaySession, SequenceReorderer),
])
def test_a_gateway_runs_the_cores_its_setting_names(core: str, session_type: type, reorderer_type: type) -> None:
    gateway = Gateway(GatewayConfig(port=0, core=core))
    assert gateway.core_name == core
    assert type(gateway._new_connection().session) is session_type
    pipeline = IngestPipeline(IdentityMapping(), gateway._ingest_config.pipeline)
    pipeline.register("a", ("s",), 0)
    out = pipeline.push("a", IncomingEvent("s", 0, 10, {"v": 1}), 5)
    assert type(pipeline._streams["s"].reorderers["a"]) is reorderer_type
    assert [(o.record.seq, o.record.ref_ts_us) for o in out if isinstance(o, PublishRecord)] == [(0, 10)]


def test_the_native_session_decodes_what_the_python_one_does() -> None:
    frames = (encode_frame({"type": "hello", "version": 1, "source_id": "src", "streams": ["s"]})
              + encode_frame({"type": "events", "events": [{"stream": "s", "seq": 0, "source_ts_us": 7,
                                                            "payload": {"k": [1, 2.5, None]}}]}))
    results = []
    for session in (GatewaySession(), NativeGatewaySession()):
        actions = session.receive_data(frames[:9], 1) + session.receive_data(frames[9:], 2)
        assert [type(a) for a in actions] == [SourceRegistered, EventsReceived]
        results.append((actions[1], session.state, session.buffered_bytes))
    assert results[0] == results[1]


def test_with_core_python_leaves_the_pipeline_as_it_is() -> None:
    config = PipelineConfig()
    assert with_core(config, "python") is config
    native = with_core(config, "native")
    assert native.reorderer_factory is not config.reorderer_factory
    assert native.merger_factory is not config.merger_factory


def test_direct_produce_is_a_setting_on_by_default() -> None:
    assert build_config({}).direct_produce is True
    assert build_config({"direct_produce": False}).direct_produce is False


@pytest.mark.parametrize("direct", [True, False])
def test_a_native_transactional_shard_hands_its_plain_records_to_the_clients_handle_when_asked(direct: bool) -> None:
    from broker.client import KafkaClientConfig
    from contract.topics import TopicNames
    from gateway.ingest import IngestConfig
    from gateway.native import native_direct_producer, native_produce_loop
    from gateway.shard import ShardRuntime, ShardSettings
    from timesync.store import SourceInfoStore

    settings = ShardSettings(shard=0, topics=TopicNames(), kafka_client=KafkaClientConfig.of("127.0.0.1:9"),
                             producer_config={"log_level": 0}, ingest=IngestConfig(), transactional=True,
                             produce_loop=native_produce_loop,
                             direct_produce=native_direct_producer if direct else None)
    runtime = ShardRuntime(settings, IdentityMapping(), SourceInfoStore(), None, lambda: 0)  # type: ignore[arg-type]
    assert type(runtime._direct) is (skewless_native.DirectProducer if direct else type(None))
    runtime._direct = None
    runtime._publisher.close()
