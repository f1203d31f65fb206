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
    with pytest.raises(ConfigError, match="unknown gateway settings: \\['prot'\\]"):
        load_settings(toml, env={})


def test_tls_needs_cert_and_key():
    with pytest.raises(ConfigError, match="go together"):
        build_config({"tls_cert": "/x.pem"})


def test_hmac_and_allowed_sources_from_env():
    config = build_config(load_settings(None, env={"SKEWLESS_GATEWAY_AUTH_HMAC_SECRET": "s3cret",
                                                   "SKEWLESS_GATEWAY_ALLOWED_SOURCES": "a,b"}))
    assert config.authenticator.hmac_secret == b"s3cret"
    assert config.authenticator.allowed_sources == frozenset({"a", "b"})


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
