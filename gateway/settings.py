"""Every gateway setting, written once: its name, kind of value, default, meaning and flag.

gateway/config.py derives from :data:`SETTINGS` the keys a `[gateway]` table may hold, their checks and the
environment variables; `skewless gateway` (skewless/cli_gateway.py) its flags and their help; docs/operations.md
its settings table (:func:`with_settings_table`, written by scripts/settings_doc.py, checked by a unit test).
A new setting is one entry here and the GatewayConfig field it sets (plus its conversion in build_config when it
is not copied unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass

# Kinds of value; durations (SECONDS, MICROS) are numbers in that unit or strings with a unit ("250ms", "2m").
PORT, POSITIVE, COUNT, FRACTION = "port", "positive int", "count", "fraction"  # count: an int >= 0
STR, PATH, BOOL, TABLE, LIST = "str", "path", "bool", "table", "list"
SECONDS, MICROS, DURATION_TEXT = "seconds", "micros", "duration text"

ENV_PREFIX = "SKEWLESS_GATEWAY_"
# The names every command shares (one name per concept): the same variables configure `skewless kafka topics`,
# `skewless spark ...` and `skewless source replay`.
BOOTSTRAP_ENV = "SKEWLESS_BOOTSTRAP"
HMAC_SECRET_ENV = "SKEWLESS_HMAC_SECRET"
# The master secret per-source keys are derived from (gateway.auth): the gateway keeps it, sources get their own key.
HMAC_MASTER_ENV = "SKEWLESS_HMAC_MASTER"
# Earlier spellings, still read (one release) so existing files and deployments keep working.
DEPRECATED_ALIASES = {"bootstrap_servers": "bootstrap", "auth_hmac_secret": "hmac_secret"}


@dataclass(frozen=True, slots=True)
class Setting:
    name: str
    kind: str
    group: str
    # One sentence: the flag's help and the start of the docs' meaning.
    help: str
    # The value a file may write for the default (a test checks that writing it changes nothing); None: unset.
    default: object = None
    # How docs and --help show the default when the value alone would not say it (or what unset means).
    shown: str = ""
    # `skewless gateway`'s flag ("--port", "--metrics/--no-metrics"); None: the file and the environment only.
    flag: str | None = None
    # A variable every command reads; it wins over SKEWLESS_GATEWAY_<NAME>.
    shared_env: str | None = None
    # The GatewayConfig field the value is copied to unchanged; None: build_config converts or checks it.
    config_field: str | None = None
    # More for the docs table, after `help`.
    details: str = ""

    @property
    def environment(self) -> tuple[str, ...]:
        """The variables that set it, the winning one first; none for a table (a file only)."""
        if self.kind == TABLE:
            return ()
        own = ENV_PREFIX + self.name.upper()
        return (self.shared_env, own) if self.shared_env else (own,)

    @property
    def default_text(self) -> str:
        if self.shown:
            return self.shown
        if isinstance(self.default, bool):
            return "true" if self.default else "false"
        return "" if self.default is None else str(self.default)

    @property
    def flag_name(self) -> str | None:
        """The flag's first spelling ("--metrics" of "--metrics/--no-metrics")."""
        return self.flag.split("/")[0] if self.flag else None


_NET, _METRICS, _AUTH, _SYNC = "Listening and Kafka", "Metrics", "TLS and authentication", "Time sync and clocks"
_CLUSTER, _ORDER, _LIMITS = "The cluster", "Ordering and the per-event cores", "Sessions and limits"

SETTINGS: tuple[Setting, ...] = (
    Setting("host", STR, _NET, "TCP listen address", "127.0.0.1", flag="--host", config_field="host"),
    Setting("port", PORT, _NET, "TCP listen port, 0 = any free port", 7700, flag="--port", config_field="port"),
    Setting("bootstrap", STR, _NET, "Kafka bootstrap servers", "127.0.0.1:9092", flag="--bootstrap",
            shared_env=BOOTSTRAP_ENV, config_field="bootstrap_servers"),
    Setting("kafka", TABLE, _NET, "librdkafka properties for every Kafka client of the gateway (producer, topic "
            "creation, recovery): `security.protocol`, `sasl.*`, `ssl.*`, `client.id`", flag="--kafka-property",
            details="The top-level `[kafka]` table (`[gateway.kafka]` is still read); each `--kafka-property "
                    "KEY=VALUE` adds one, winning over the file."),
    Setting("replication_factor", POSITIVE, _NET, "Replicas of every topic the gateway creates",
            shown="min(3, brokers in the cluster)", flag="--replication-factor", config_field="replication_factor",
            details="Partitions: `shards`."),
    Setting("topic_prefix", STR, _NET, "Topic prefix", "skewless", flag="--prefix", config_field="topic_prefix"),
    Setting("max_frame_bytes", POSITIVE, _NET, "Largest accepted frame body", 1_048_576, shown="1 MiB",
            flag="--max-frame-bytes", config_field="max_frame_bytes"),
    Setting("producer", TABLE, _NET, "librdkafka properties for the producer only (`[gateway.producer]`), on "
            "top of `[kafka]`",
            details="Both sit on the gateway's defaults: acks=all, idempotence, lz4, batches of up to 10,000 "
                    "records (broker/client.py), and `linger.ms` 100 with transactions (their records are visible "
                    "at the commit, whose flush sends what lingers; broker/transactions.py), 2 without (acks wait "
                    "for the delivery)."),
    Setting("metrics_port", PORT, _METRICS, "Serve /metrics and /healthz on this port, 0 = any free port", 7780,
            flag="--metrics-port", config_field="metrics_port",
            details="With `--workers N` worker `i` serves on this port + `i`."),
    Setting("metrics", BOOL, _METRICS, "Serve /metrics and /healthz", True, flag="--metrics/--no-metrics",
            details="false: no endpoint at all."),
    Setting("metrics_host", STR, _METRICS, "Address of the metrics endpoint", "127.0.0.1", flag="--metrics-host",
            config_field="metrics_host"),
    Setting("tls_cert", PATH, _AUTH, "PEM certificate: enables TLS", flag="--tls-cert",
            details="Goes with `tls_key`."),
    Setting("tls_key", PATH, _AUTH, "PEM private key for --tls-cert", flag="--tls-key"),
    Setting("hmac_secret", STR, _AUTH, "Require HMAC tokens made with this secret", flag="--hmac-secret",
            shared_env=HMAC_SECRET_ENV,
            details="One shared key for every source (the older scheme: any holder can sign as any source)."),
    Setting("hmac_master", STR, _AUTH, "Master secret: each source signs its hello with its own key derived from "
            "it", shared_env=HMAC_MASTER_ENV,
            details="See docs/wire-protocol.md, \"Authentication\"; `skewless keys derive --source ID` prints a "
                    "source's key."),
    Setting("source_keys", TABLE, _AUTH, "A key per source id (`[gateway.source_keys]`: source id = key)",
            details="Wins over `source_keys_file`, `hmac_master` and `hmac_secret`."),
    Setting("source_keys_file", PATH, _AUTH, "TOML file with a `[source_keys]` table (source id = key)",
            details="Read at start; `source_keys` entries win over it."),
    Setting("auth_tokens", TABLE, _AUTH, "A static token per source id (`[gateway.auth_tokens]`: source id = "
            "token)", details="A source with a token must present that token; the HMAC keys are for the others."),
    Setting("allowed_sources", LIST, _AUTH, "Only these source ids may say hello", shown="any",
            details="Checked whatever credentials are configured, or none."),
    Setting("timesync", BOOL, _SYNC, "Run the NTP-format time-sync server and map source clocks", True,
            flag="--timesync/--no-timesync", details="false: source times are trusted as reference times."),
    Setting("timesync_port", PORT, _SYNC, "UDP port of the time-sync server", 7452, flag="--timesync-port"),
    Setting("timesync_host", STR, _SYNC, "Address of the time-sync server", shown="`host`"),
    Setting("sync_keys", TABLE, _SYNC, "HMAC keys of the time-sync server by source id",
            details="When set, only a correctly MAC'ed request registers samples."),
    Setting("upstream_ntp", LIST, _SYNC, "NTP servers the reference clock is steered to", shown="none",
            details="Queried every 64 s; the clock takes their median offset."),
    Setting("clock_offset_us", MICROS, _SYNC, "Shift the gateway's reference clock by this much, e.g. 250ms or "
            "-1.5s (demos of a skewed reference)", 0, flag="--clock-offset-us"),
    Setting("max_future_s", SECONDS, _SYNC, "Quarantine events whose reference time is this far ahead of the "
            "gateway clock", "60s", flag="--max-future-s", details="They go to the late topic (`future_dated`)."),
    Setting("clock_step_hold_s", SECONDS, _SYNC, "A source held for a suspected clock step is asked to re-sync "
            "again this often until a sample comes", "5s",
            details="Only 30 s without any sample sends its held events late with `clock_step_unresolved`."),
    Setting("clock_step_max_held", POSITIVE, _SYNC, "Held events past which a source held for a clock step is "
            "paused (not read)", 10_000, config_field="clock_step_max_held"),
    Setting("shards", POSITIVE, _CLUSTER, "Shards of the deployment (S): fixed for its life; every stream's topics "
            "get S partitions", 1, flag="--shards", config_field="shards"),
    Setting("cluster", STR, _CLUSTER, "Name of the deployment; a second cluster on the same topic prefix is "
            "refused", "skewless", flag="--cluster", config_field="cluster"),
    Setting("gateway_id", STR, _CLUSTER, "This gateway's id in logs and redirects", shown="address+random",
            flag="--gateway-id", config_field="gateway_id",
            details="Unset: its advertised host:port and a random suffix."),
    Setting("advertised_host", STR, _CLUSTER, "Address sources are redirected to",
            shown="--host, or the host name for a wildcard --host", flag="--advertised-host",
            config_field="advertised_host"),
    Setting("instance_id", STR, _CLUSTER, "Kafka static membership id: a restart with the same id takes its shards "
            "back at once", flag="--instance-id", config_field="instance_id",
            details="Unset: the advertised host:port when the port is fixed, else dynamic membership."),
    Setting("session_timeout_s", SECONDS, _CLUSTER, "Kafka group session timeout: a gateway silent this long loses "
            "its shards to the others (the failover time); at least 1s and within the broker's "
            "group.min/max.session.timeout.ms", "6s", flag="--session-timeout-s",
            details="See docs/cluster.md, \"Measured\". Below the broker's "
                    "`group.min.session.timeout.ms` (6 s by default) Kafka refuses it; `skewless kafka start "
                    "--group-min-session-timeout 1s` lowers a local broker's."),
    Setting("reference_clock_error", DURATION_TEXT, _CLUSTER, "This host's clock error against common time, added "
            "to every event's uncertainty: a duration (2ms), or 'chrony' to read chronyd's bound", 0,
            shown="0: gateways share one host's clock", flag="--reference-clock-error"),
    Setting("commit_interval_s", SECONDS, _CLUSTER, "How often each shard's transaction commits; sources are acked "
            "at commits", "100ms", details="At least 1 ms."),
    Setting("takeover_grace_s", SECONDS, _CLUSTER, "After taking a shard over (or restarting), how long its "
            "merge holds each recovered stream for sources the checkpoint does not name", "2s",
            details="The sources its previous owner welcomed after its last committed checkpoint; nothing is "
                    "released or punctuated before the window ends, and a source that comes later has its older "
                    "events late (`after_punctuation`). 2 s: a dead owner's sources are back within about a second "
                    "of the new owner serving (held hellos redirected at once, the SDK's retries 0.5 s apart); "
                    "every failover's first ack waits for it. 0: no window. "
                    "See docs/cluster.md, \"Failover without late data\"."),
    Setting("transactions", BOOL, _CLUSTER, "Kafka transactions (fencing)", True,
            details="false: the idempotent producer only, safe with one gateway and no failover."),
    Setting("reorder_mode", STR, _ORDER, "The reorderer: 'sequence' (adaptive) or 'thesis' (Eq. 3.11's gap "
            "timeout and the thesis' merge)", "sequence", flag="--reorder-mode",
            details="`thesis` runs them as `skewless replay --approach thesis` does; its threshold is 500 ms unless "
                    "`gap_timeout_max_s` sets it."),
    Setting("pass_late", BOOL, _ORDER, "Publish late events on the events topic flagged late, instead of the late "
            "topic only", False, flag="--pass-late/--drop-late",
            details="Query 4.3's 7th parameter; an event older than a punctuation already emitted still goes to the "
                    "late topic."),
    Setting("core", STR, _ORDER, "The per-event cores: 'native' (Rust: connection decoder, sequence reorderers, "
            "record bytes), 'python' (their specification) or 'auto' (native when built)", "auto", flag="--core",
            details="`native` is refused with one line when the extension module is not built (docs/native.md)."),
    Setting("direct_produce", BOOL, _ORDER, "With the native core: hand plain records to librdkafka's C API on the "
            "producer's own client instead of calling Producer.produce per record", True,
            details="The handle is read from confluent-kafka's Producer object and accepted only after checks "
                    "(docs/native.md, \"Records to librdkafka\"); when they fail the gateway logs one line and calls "
                    "Producer.produce. false: always call it."),
    Setting("loop_slice_us", MICROS, _ORDER, "The scheduler slice the event loop's thread asks Linux for (EEVDF, "
            "6.12+): woken by a frame, it preempts longer-slice work on a busy host sooner; 0 = the kernel's "
            "default", "100us", config_field="loop_slice_us",
            details="Between 100 µs and 100 ms. Its CPU share is unchanged; unprivileged; threads it starts keep "
                    "the default, and a policy set with chrt is left alone (gateway/scheduling.py). The log's "
                    "start says what the thread got."),
    Setting("reorder_alpha", FRACTION, _ORDER, "Smoothing factor of Eq. 3.2-3.3", 0.6),
    Setting("reorder_beta", FRACTION, _ORDER, "Smoothing factor of Eq. 3.7-3.8", 0.6),
    Setting("gap_timeout_min_s", SECONDS, _ORDER, "The shortest wait for a sequence gap", "200ms"),
    Setting("gap_timeout_max_s", SECONDS, _ORDER, "The longest wait for a sequence gap until the source shows a "
            "long gap", "2s"),
    Setting("gap_timeout_learned_max_s", SECONDS, _ORDER, "Ceiling of the learned gap wait: once a source's gap "
            "closed after D, its gaps may be waited for up to 2 D, at most this", 0,
            details="0 (or anything up to `gap_timeout_max_s`): no learning, because the merge waits as long for "
                    "every source of the stream and a hostile source could lengthen it; the replay learns up to 60 s "
                    "(docs/reorder.md)."),
    Setting("merge_timeout_s", SECONDS, _ORDER, "How long the merge waits for a silent source", "500ms"),
    Setting("merge_wait_learned", BOOL, _ORDER, "The merge also waits for a silent source as long as its own past "
            "silences say, up to 2 s", True,
            details="A source whose uplink stalls is not given up on and its events are not sent to the late "
                    "topic (docs/reorder.md, \"The learned merge wait\"); false: the merge waits only as long as "
                    "its reorderer's gap wait."),
    Setting("join_grace_s", SECONDS, _ORDER, "How long the merge waits for a source that said hello and sent "
            "nothing yet", "2s"),
    Setting("reconnect_grace_s", SECONDS, _ORDER, "How long the merge waits for a source recovered after a "
            "restart", "5s"),
    Setting("idle_punctuation_lag_s", SECONDS, _ORDER, "A stream a shard holds nothing of is punctuated this far "
            "behind the reference clock", "5s", details="0 (or less): never."),
    Setting("source_retention_s", SECONDS, _ORDER, "Sources silent this long leave the progress checkpoints",
            "168h", shown="168h (7 days)"),
    Setting("handshake_timeout_s", SECONDS, _LIMITS, "A connection that has not said hello after this is closed",
            "10s", details="All three timeouts are judged every 0.5 s at the previous sweep's time, so they fire up "
                           "to 0.5 s late and never for bytes the gateway had not read yet (a gateway that lagged "
                           "does not cut off the peers it kept waiting)."),
    Setting("partial_frame_timeout_s", SECONDS, _LIMITS, "A frame not completed within this closes its "
            "connection", "30s", details="With the handshake and idle timeouts: a slowloris peer that trickles a "
                                         "frame byte by byte, or never says hello, is cut off."),
    Setting("idle_timeout_s", SECONDS, _LIMITS, "A connection silent this long is closed", "120s"),
    Setting("max_streams_per_source", POSITIVE, _LIMITS, "Streams one hello may name (1..64, the wire protocol's "
            "bound)", 64),
    Setting("max_streams", COUNT, _LIMITS, "Streams (two topics each) this gateway serves at most; 0: no cap",
            1000),
    Setting("allowed_streams", LIST, _LIMITS, "Only these streams may be named in a hello", shown="any valid name"),
    Setting("idle_source_retention_s", SECONDS, _LIMITS, "A source with no connection that holds nothing is freed "
            "after this", "60s"),
    Setting("write_buffer_max_bytes", POSITIVE, _LIMITS, "Bytes queued for a peer that does not read, beyond "
            "which its connection is closed", 4_194_304, shown="4194304 (4 MiB)",
            config_field="write_buffer_max_bytes"),
    Setting("slow_reader_timeout_s", SECONDS, _LIMITS, "A peer the gateway stopped reading (too much queued for "
            "it) that does not drain within this is closed", "60s"),
    Setting("max_seq_jump", POSITIVE, _LIMITS, "A seq more than this above everything accepted, given up or acked "
            "of its (source, stream) is refused with `seq_jump`", 1_000_000, config_field="max_seq_jump",
            details="The first seq of a (source, stream) is accepted whatever it is."),
)
BY_NAME = {setting.name: setting for setting in SETTINGS}

_VALUE = {PORT: "port", POSITIVE: "integer >= 1", COUNT: "integer >= 0", FRACTION: "number in (0, 1]",
          STR: "string", PATH: "path", BOOL: "true/false", TABLE: "table", LIST: "list of strings",
          SECONDS: "duration (bare number: s)", MICROS: "duration (bare number: µs)",
          DURATION_TEXT: "duration with a unit, or \"chrony\""}
TABLE_BEGIN, TABLE_END = "<!-- settings:begin -->", "<!-- settings:end -->"


def _row(setting: Setting) -> str:
    env = ", ".join(f"`{name}`" for name in setting.environment) or "(a file only)"
    flag = f"`{setting.flag}`" if setting.flag else ""
    default = setting.shown or (f"`{setting.default_text}`" if setting.default is not None else "")
    meaning = f"{setting.help}. {setting.details}".strip()
    return f"| `{setting.name}` | {_VALUE[setting.kind]} | {default} | {env} | {flag} | {meaning} |"


def settings_markdown() -> str:
    """The docs' settings tables, one per group, in :data:`SETTINGS` order."""
    lines: list[str] = []
    for group in dict.fromkeys(setting.group for setting in SETTINGS):
        lines += [f"### {group}", "", "| setting | value | default | environment | flag | meaning |",
                  "|---|---|---|---|---|---|"]
        lines += [_row(setting) for setting in SETTINGS if setting.group == group]
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def with_settings_table(document: str) -> str:
    """``document`` with what lies between its settings markers replaced by :func:`settings_markdown`."""
    head, begin, rest = document.partition(TABLE_BEGIN)
    _, end, tail = rest.partition(TABLE_END)
    if not begin or not end:
        raise ValueError(f"no {TABLE_BEGIN} ... {TABLE_END} markers in the document")
    return f"{head}{TABLE_BEGIN}\n{settings_markdown()}\n{TABLE_END}{tail}"
