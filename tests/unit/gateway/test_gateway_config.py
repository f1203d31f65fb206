from pathlib import Path

import pytest

from gateway.config import ConfigError, build_config, load_settings


def test_file_then_env_then_flags(tmp_path: Path):
    toml = tmp_path / "gw.toml"
    toml.write_text('[gateway]\nport = 7001\ntopic_prefix = "file"\nidle_timeout_s = 7\n'
                    '[gateway.auth_tokens]\ns1 = "t1"\n[gateway.producer]\n"linger.ms" = 5\n')
    settings = load_settings(toml, env={"SKEWLESS_GATEWAY_PORT": "7002", "SKEWLESS_GATEWAY_TOPIC_PREFIX": "env",
                                        "UNRELATED": "x"},
                             overrides={"topic_prefix": "flag", "host": None})
    config = build_config(settings)
    assert config.port == 7002
    assert config.topic_prefix == "flag"
    assert config.host == "127.0.0.1"
    assert config.timeouts.idle_us == 7_000_000
    assert dict(config.authenticator.tokens) == {"s1": "t1"}
    assert config.producer_config == {"linger.ms": 5}
    assert config.ssl_context is None


def test_unknown_setting_is_an_error(tmp_path: Path):
    toml = tmp_path / "gw.toml"
    toml.write_text("[gateway]\nprot = 1\n")
    with pytest.raises(ConfigError, match=r"gw.toml \[gateway\] prot: unknown gateway setting 'prot'; did you mean "
                                          r"'port'\?"):
        load_settings(toml, env={})


def test_tls_needs_cert_and_key():
    with pytest.raises(ConfigError, match="go together"):
        build_config({"tls_cert": "/x.pem"})


def test_hmac_and_allowed_sources_from_env():
    config = build_config(load_settings(None, env={"SKEWLESS_HMAC_SECRET": "s3cret",
                                                   "SKEWLESS_GATEWAY_ALLOWED_SOURCES": "a,b"}))
    assert config.authenticator.hmac_secret == b"s3cret"
    assert config.authenticator.allowed_sources == frozenset({"a", "b"})


def test_the_earlier_spellings_still_work():
    settings = load_settings(None, env={"SKEWLESS_GATEWAY_AUTH_HMAC_SECRET": "old",
                                        "SKEWLESS_GATEWAY_BOOTSTRAP_SERVERS": "k:1"})
    assert settings == {"hmac_secret": "old", "bootstrap": "k:1"}
    config = build_config(settings)
    assert (config.authenticator.hmac_secret, config.bootstrap_servers) == (b"old", "k:1")


def test_bootstrap_and_kafka_properties_from_file_env_and_flags(tmp_path: Path):
    toml = tmp_path / "gw.toml"
    toml.write_text('[gateway]\nbootstrap = "file:9092"\nreplication_factor = 3\n'
                    '[kafka]\n"security.protocol" = "SASL_SSL"\n"client.id" = "file"\n')
    settings = load_settings(toml, env={"SKEWLESS_BOOTSTRAP": "env:9092"},
                             overrides={"kafka": {"client.id": "flag"}})
    config = build_config(settings)
    assert config.bootstrap_servers == "env:9092"
    assert config.kafka_client.settings == {"security.protocol": "SASL_SSL", "client.id": "flag"}
    assert config.replication_factor == 3


@pytest.mark.parametrize(("text", "env", "message"), [
    ("[gatway]\nport = 1\n", {}, r"gw.toml: unknown table \[gatway\]; did you mean \[gateway\]\?"),
    ("[gateway]\nport = 99999\n", {}, r"gw.toml \[gateway\] port: port must be a port in 0..65535"),
    ("[gateway]\nport = \"x\"\n", {}, r"gw.toml \[gateway\] port: port must be an integer, got 'x'"),
    ("", {"SKEWLESS_GATEWAY_PORT": "abc"}, r"^SKEWLESS_GATEWAY_PORT: port must be an integer, got 'abc'$"),
    ("", {"SKEWLESS_GATEWAY_SHARDS": "0"}, r"^SKEWLESS_GATEWAY_SHARDS: shards must be >= 1, got 0$"),
    ("", {"SKEWLESS_GATEWAY_TIMESYNC": "maybe"}, r"^SKEWLESS_GATEWAY_TIMESYNC: timesync must be true or false"),
    ("", {"SKEWLESS_GATEWAY_JOIN_GRACE_S": "soon"}, r"^SKEWLESS_GATEWAY_JOIN_GRACE_S: join_grace_s: not a duration"),
    ("[gateway]\nmetrics_port = true\n", {}, r"metrics_port must be an integer, got True"),
    ("[gateway\n", {}, r"gw.toml: malformed TOML: "),
    ("[kafka]\nsasl = { mechanism = \"PLAIN\" }\n", {}, r"\[kafka\] sasl: a librdkafka property takes a string"),
])
def test_bad_settings_name_where_they_came_from(tmp_path: Path, text: str, env: dict[str, str], message: str):
    toml = tmp_path / "gw.toml"
    toml.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_settings(toml, env=env)


def test_durations_take_units_and_bare_numbers_are_in_the_named_unit():
    settings = load_settings(None, env={"SKEWLESS_GATEWAY_JOIN_GRACE_S": "250ms",
                                        "SKEWLESS_GATEWAY_MERGE_TIMEOUT_S": "2",
                                        "SKEWLESS_GATEWAY_MAX_FUTURE_S": "2m",
                                        "SKEWLESS_GATEWAY_CLOCK_OFFSET_US": "-1.5s"})
    config = build_config(settings)
    assert config.pipeline.join_grace_us == 250_000
    assert config.pipeline.merger.default_timeout_us == 2_000_000
    assert config.pipeline.max_future_us == 120_000_000
    assert config.timesync is not None and config.timesync.clock_offset_us == -1_500_000


def test_a_missing_config_file_is_one_line(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"config file .*nope.toml does not exist \(--config\)"):
        load_settings(tmp_path / "nope.toml", env={})


def test_ordering_waits_from_file_and_env(tmp_path: Path):
    toml = tmp_path / "gw.toml"
    toml.write_text("[gateway]\ngap_timeout_min_s = 20\ngap_timeout_max_s = 25.5\nmerge_timeout_s = 20\n")
    settings = load_settings(toml, env={"SKEWLESS_GATEWAY_JOIN_GRACE_S": "0.25",
                                        "SKEWLESS_GATEWAY_RECONNECT_GRACE_S": "30"})
    pipeline = build_config(settings).pipeline
    assert pipeline.sequence.min_timeout_us == 20_000_000
    assert pipeline.sequence.latency_threshold_us == 25_500_000
    assert pipeline.merger.default_timeout_us == 20_000_000
    assert (pipeline.join_grace_us, pipeline.reconnect_grace_us) == (250_000, 30_000_000)


def test_the_learned_gap_timeout_is_off_unless_asked_and_one_source_buffers_100k() -> None:
    """The adaptive cap can learn twice the longest gap delay a source showed (reorder/sequence.py), up to
    gap_timeout_learned_max_s; a gateway does not by default (the merge would wait as long for every source of the
    stream). A gateway's reorder buffer stays 100,000 per (source, stream), the bound docs/operations.md gives,
    whatever the replay's default."""
    from reorder.sequence import SequenceReorderer

    default = build_config({}).pipeline.sequence
    assert (default.max_latency_threshold_us, default.max_buffered) == (0, 100_000)
    off = build_config({"gap_timeout_max_s": 2, "gap_timeout_learned_max_s": 0}).pipeline.sequence
    assert (off.latency_threshold_us, off.max_latency_threshold_us) == (2_000_000, 0)
    reorderer = SequenceReorderer("a", "s", off)
    reorderer._longest_gap_delay_us = 10_000_000  # a source that once closed a 10 s gap
    assert reorderer.effective_latency_threshold_us() == 2_000_000
    ten = build_config({"gap_timeout_learned_max_s": 10}).pipeline.sequence
    learning = SequenceReorderer("a", "s", ten)
    learning._longest_gap_delay_us = 10_000_000
    assert learning.effective_latency_threshold_us() == 10_000_000
    with pytest.raises(ConfigError, match="gap_timeout_learned_max_s must be >= 0"):
        build_config({"gap_timeout_learned_max_s": -1})


def test_ordering_waits_are_checked():
    with pytest.raises(ConfigError, match="gap_timeout_min_s must not exceed gap_timeout_max_s"):
        build_config({"gap_timeout_min_s": 5, "gap_timeout_max_s": 1})
    with pytest.raises(ConfigError, match="merge_timeout_s must be >= 0"):
        build_config({"merge_timeout_s": -1})


def test_clock_step_hold_settings_reach_the_gateway_config() -> None:
    config = build_config(load_settings(None, env={"SKEWLESS_GATEWAY_CLOCK_STEP_HOLD_S": "2.5",
                                                   "SKEWLESS_GATEWAY_CLOCK_STEP_MAX_HELD": "500"}))
    assert (config.clock_step_hold_us, config.clock_step_max_held) == (2_500_000, 500)
    with pytest.raises(ConfigError, match="clock_step_hold_s"):
        build_config({"clock_step_hold_s": -1})


def test_the_learned_merge_wait_is_on_unless_switched_off_by_file_or_env(tmp_path: Path) -> None:
    assert build_config({}).pipeline.merger.learn_wait is True
    toml = tmp_path / "gw.toml"
    toml.write_text("[gateway]\nmerge_wait_learned = false\n")
    assert build_config(load_settings(toml, env={})).pipeline.merger.learn_wait is False
    for raw, learned in (("false", False), ("0", False), ("off", False), ("true", True), ("1", True)):
        settings = load_settings(None, env={"SKEWLESS_GATEWAY_MERGE_WAIT_LEARNED": raw})
        assert build_config(settings).pipeline.merger.learn_wait is learned


def test_metrics_are_served_on_7780_unless_moved_or_switched_off():
    assert build_config({}).metrics_port == 7780
    assert build_config(load_settings(None, env={}, overrides={"metrics_port": 0})).metrics_port == 0
    assert build_config(load_settings(None, env={"SKEWLESS_GATEWAY_METRICS": "false"})).metrics_port is None
    assert build_config(load_settings(None, env={}, overrides={"metrics": False, "metrics_port": 9})).metrics_port \
        is None


# -- issue 24 items 4, 5, 8, 9 and issue 25 item 8 ------------------------------------------------------------------


def test_limits_reach_the_gateway_config(tmp_path: Path) -> None:
    defaults = build_config({})
    assert (defaults.max_streams_per_source, defaults.max_streams, defaults.allowed_streams) == (64, 1000, None)
    assert defaults.idle_source_retention_us == 60_000_000
    toml = tmp_path / "gw.toml"
    toml.write_text('[gateway]\nmax_streams_per_source = 8\nallowed_streams = ["orders", "doors"]\n'
                    'idle_source_retention_s = "2m"\nwrite_buffer_max_bytes = 1048576\nslow_reader_timeout_s = 5\n')
    config = build_config(load_settings(toml, env={"SKEWLESS_GATEWAY_MAX_STREAMS": "0"}))
    assert (config.max_streams_per_source, config.max_streams) == (8, None)  # 0: no cap
    assert config.allowed_streams == frozenset({"orders", "doors"})
    assert config.idle_source_retention_us == 120_000_000
    assert (config.write_buffer_max_bytes, config.slow_reader_timeout_us) == (1_048_576, 5_000_000)


def test_limits_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"max_streams_per_source must be in 1\.\.64"):
        build_config({"max_streams_per_source": 65})
    with pytest.raises(ConfigError, match="idle_source_retention_s must be > 0"):
        build_config({"idle_source_retention_s": 0})


def test_a_master_secret_and_a_key_table_reach_the_authenticator(tmp_path: Path) -> None:
    from gateway.auth import derive_source_key
    keys = tmp_path / "keys.toml"
    keys.write_text('[source_keys]\n"door-1" = "key-of-door-1-0123456789"\n')
    toml = tmp_path / "gw.toml"
    toml.write_text(f'[gateway]\nsource_keys_file = "{keys}"\n[gateway.source_keys]\n"door-2" = "key-2-0123456789"\n')
    config = build_config(load_settings(toml, env={"SKEWLESS_HMAC_MASTER": "m" * 32}))
    auth = config.authenticator
    assert auth.hmac_master == b"m" * 32
    assert dict(auth.source_keys) == {"door-1": "key-of-door-1-0123456789", "door-2": "key-2-0123456789"}
    assert auth.key_of("door-1") == b"key-of-door-1-0123456789"
    assert auth.key_of("other") == derive_source_key(b"m" * 32, "other").encode()


def test_a_bad_key_table_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"source_keys_file .* does not exist"):
        build_config({"source_keys_file": str(tmp_path / "missing.toml")})
    bad = tmp_path / "bad.toml"
    bad.write_text('[source_keys]\n"a" = 5\n')
    with pytest.raises(ConfigError, match=r"source_keys.*'a'.*string"):
        build_config({"source_keys_file": str(bad)})


def test_the_thesis_reorderer_is_reachable_from_the_configuration(tmp_path: Path) -> None:
    """Issue 25 item 8: Eq. 3.11 mode, alpha/beta and pass-late from the file, the environment and flags."""
    default = build_config({}).pipeline
    assert (default.sequence.mode, default.merger.mode, default.drop_late) != ("thesis", "thesis", False)
    toml = tmp_path / "gw.toml"
    toml.write_text('[gateway]\nreorder_mode = "thesis"\nreorder_alpha = 0.5\n')
    settings = load_settings(toml, env={"SKEWLESS_GATEWAY_REORDER_BETA": "0.75"}, overrides={"pass_late": True})
    pipeline = build_config(settings).pipeline
    assert (pipeline.sequence.mode, pipeline.merger.mode) == ("thesis", "thesis")
    assert pipeline.sequence.latency_threshold_us == 500_000  # Query 5.3's threshold unless gap_timeout_max_s says
    assert (pipeline.sequence.alpha, pipeline.sequence.beta, pipeline.drop_late) == (0.5, 0.75, False)
    pipeline = build_config({"reorder_mode": "thesis", "gap_timeout_max_s": 2}).pipeline
    assert pipeline.sequence.latency_threshold_us == 2_000_000
    with pytest.raises(ConfigError, match="reorder_mode must be one of 'sequence', 'thesis'"):
        build_config({"reorder_mode": "kslack"})
    with pytest.raises(ConfigError, match=r"reorder_alpha must be in \(0, 1\]"):
        build_config(load_settings(None, env={"SKEWLESS_GATEWAY_REORDER_ALPHA": "1.5"}))


def test_max_seq_jump_reaches_the_ingest_core(tmp_path: Path) -> None:
    from gateway.acks import DEFAULT_MAX_SEQ_JUMP
    from gateway.server import Gateway

    assert build_config({}).max_seq_jump == DEFAULT_MAX_SEQ_JUMP == 1_000_000
    toml = tmp_path / "gw.toml"
    toml.write_text("[gateway]\nmax_seq_jump = 5000\n")
    config = build_config(load_settings(toml, env={}))
    assert config.max_seq_jump == 5000
    assert build_config(load_settings(toml, env={"SKEWLESS_GATEWAY_MAX_SEQ_JUMP": "70"})).max_seq_jump == 70
    assert Gateway(config)._ingest_config.max_seq_jump == 5000
    toml.write_text("[gateway]\nmax_seq_jump = 0\n")
    with pytest.raises(ConfigError):
        build_config(load_settings(toml, env={}))


def test_a_gateway_core_runs_the_thesis_reorderer_it_is_configured_with() -> None:
    from contract.topics import TopicNames
    from contract.wire.messages import IncomingEvent
    from gateway.ingest import ConnectionId, IngestConfig, IngestCore, Produce
    from timesync.clocks import IdentityMapping

    pipeline = build_config(load_settings(None, env={}, overrides={"reorder_mode": "thesis"})).pipeline
    core = IngestCore(TopicNames("t"), IdentityMapping(), IngestConfig(pipeline=pipeline))
    core.stream_created("s")
    t0 = 1_700_000_000_000_000
    core.source_registered("a", ("s",), t0)
    assert core.pipeline.config.merger.mode == "thesis"
    out = core.events_received(ConnectionId(1), "a", (IncomingEvent("s", 1, t0 + 20, 1),), t0 + 30)
    out += core.events_received(ConnectionId(1), "a", (IncomingEvent("s", 0, t0 + 10, 0),), t0 + 40)
    out += core.advance(t0 + 1_000_000)
    assert [a.delivery.seq for a in out if isinstance(a, Produce) and a.delivery is not None] == [0, 1]
