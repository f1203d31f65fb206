"""The compiled cores (native/, ``skewless_native``) in the gateway: the connection decoder in each session, the
sequence reorderer in each (source, stream) and the merger of each stream of the ordering pipeline, and the builder
of the Kafka record bytes.

The Python cores stay the executable specification: the native ones are driven side by side with them by the
differential tests (tests/unit/native/: test_native_decode.py, test_native_sequence.py, test_native_merger.py),
and ``core = "python"`` runs them.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

from contract.wire.errors import RemoteProtocolError
from contract.wire.messages import Bye, EventBatch, Heartbeat, RejectedPayload
from gateway.acks import EventDigestsCore, digest_body
from gateway.ingest import GIVEN_UP_LATE_REASONS, DeliveryRef, DeliveryRunsCore, Produce, RecordBuilderCore
from gateway.session import (
    DrainRequested,
    EventsReceived,
    GatewaySession,
    HeartbeatReceived,
    SessionAction,
    SessionState,
)
from reorder.merger import MergerConfig
from reorder.pipeline import MergerCore, PipelineConfig, PipelineCores, PublishRecord, SequenceCore
from reorder.records import GapSkipped, Late, Merged, Punctuation, Released, SourceEvent, SourceTimedOut
from reorder.sequence import SequenceConfig
from timesync.clocks import EstimateMapping, FixedOffsetMapping, IdentityMapping, ReferenceMapping
from timesync.estimator import ClockEstimate
from timesync.store import SourceInfo, SourceInfoStore

if TYPE_CHECKING:  # gateway.shard imports the Kafka client, which this module's other users do not need
    from gateway.shard import ProduceLoopCore

log = logging.getLogger(__name__)

Core = Literal["native", "python"]
CORES: tuple[Core, ...] = ("native", "python")


class NativeCoreMissing(RuntimeError):
    """``core = "native"`` on an install whose extension module was not built."""


def native_available() -> bool:
    try:
        import skewless_native  # noqa: F401  (only whether it imports)
    except ModuleNotFoundError:
        return False
    return True


def resolve_core(core: str) -> Core:
    """"auto": native when the extension is built, else python. "native" on an install without it is refused."""
    if core == "auto":
        return "native" if native_available() else "python"
    if core == "native":
        if not native_available():
            raise NativeCoreMissing("the native core (skewless_native) is not built: run `make native`, or set "
                                    "core = \"python\" to run the Python cores")
        return "native"
    if core == "python":
        return "python"
    raise ValueError(f"core must be one of 'auto', 'native', 'python', got {core!r}")


def native_sequence_reorderer(source_id: str, stream: str, config: SequenceConfig) -> SequenceCore:
    """The Rust reorderer of (source_id, stream), with the Python core's API and output records."""
    import skewless_native

    return skewless_native.SequenceReorderer(source_id, stream, config, records=(Released, Late, GapSkipped))


def native_merger(stream: str, clock: ReferenceMapping, config: MergerConfig,
                  timeout_for: Callable[[str, int], int]) -> MergerCore:
    """The Rust merger of a stream, with the Python core's API and output records."""
    import skewless_native

    return cast(MergerCore, skewless_native.MultiSourceMerger(
        stream, clock, config, timeout_for, records=(Merged, Punctuation, SourceTimedOut, Late)))


def native_record_builder() -> RecordBuilderCore:
    """The Rust builder of rule 7's record bytes (key, value, timestamp, headers), one call per batch, and of the
    Produce actions of a batch's plain event records (``IngestCore._publish``) and of a run's plain releases
    (``IngestPipeline._push_run``: no EventRecord or PublishRecord in between)."""
    import skewless_native

    return cast(RecordBuilderCore, skewless_native.RecordBuilder(
        produce=(PublishRecord, RejectedPayload, Produce, DeliveryRef, GIVEN_UP_LATE_REASONS, Merged, SourceEvent)))


def native_event_digests() -> EventDigestsCore:
    """The Rust digests of the delivery tracker (the same verdicts as gateway.acks.event_digest, other values) and
    ``admit_frame``'s inline path for a run of a frame's events in one call."""
    import skewless_native

    return cast(EventDigestsCore, skewless_native.EventDigests(digest_body))


def native_delivery_runs() -> DeliveryRunsCore:
    """The Rust per-record loops of ``IngestCore.on_committed`` (native/src/deliveries.rs): the delivery latencies,
    the groups per (source, stream) with their progress observations, and their runs of consecutive seqs."""
    import skewless_native

    return cast(DeliveryRunsCore, skewless_native.DeliveryRuns(DeliveryRef))


def native_produce_loop() -> ProduceLoopCore:
    """The Rust loop of a transactional shard's plain records (native/src/produce_loop.rs): ``_produce_from``'s
    calls to the client's produce, the deliveries kept for the commit, and ``_wanted_reports``' pass over a batch."""
    import skewless_native

    return cast("ProduceLoopCore", skewless_native.ProduceLoop(Produce, DeliveryRef))


def native_direct_producer(producer: object) -> object | None:
    """``producer``'s librdkafka handle for the native produce loop (native/src/direct_produce.rs: a plain record
    goes to ``rd_kafka_produceva`` with the arguments ``Producer.produce`` gives it, without the call), or None
    where it cannot be had: the loop then calls ``produce`` per record. Said once per process at INFO."""
    import confluent_kafka
    import skewless_native

    path = loaded_librdkafka()
    if path is None:
        _direct_refused_once("no librdkafka is mapped into this process")
        return None
    try:
        return skewless_native.DirectProducer.open(producer, path, confluent_kafka.libversion()[1])
    except ValueError as exc:
        _direct_refused_once(str(exc))
        return None


def _direct_refused_once(reason: str) -> None:
    if not _direct_refused:
        _direct_refused.append(reason)
        log.info("records go through confluent-kafka's Producer.produce one call each: %s", reason)


_direct_refused: list[str] = []


@functools.cache
def loaded_librdkafka() -> str | None:
    """The path of the librdkafka shared library mapped into this process (confluent-kafka's: its wheel ships one
    beside its module, a source build links the system's), or None."""
    import confluent_kafka  # noqa: F401  (loads it)

    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # address, perms, offset, device, inode, path (when a file is mapped)
        if len(fields) == 6 and fields[5].startswith("/"):
            name = Path(fields[5]).name
            if name.startswith("librdkafka") and ".so" in name:
                return fields[5]
    return None


def native_reference_mapping(mapping: ReferenceMapping) -> ReferenceMapping:
    """The Rust mapping that stands for ``mapping`` (native/src/clocks.rs: the same results, computed without a
    Python call per event) where it knows the mapping: an IdentityMapping, a FixedOffsetMapping, or an
    EstimateMapping whose lookup is a SourceInfoStore's ``get`` or a dict's (the gateway's, with time sync on),
    which it reads live. Any other mapping is returned as it is: the native cores then call its ``to_reference``.
    What it does not compute itself (an estimate of another class, a result beyond 64 bits) it asks ``mapping``."""
    import skewless_native

    kind = type(mapping)
    if kind is IdentityMapping:
        return skewless_native.ReferenceClocks.identity(mapping)
    if kind is FixedOffsetMapping:
        fixed = cast(FixedOffsetMapping, mapping)
        return skewless_native.ReferenceClocks.fixed_offsets(mapping, fixed.offsets_us, fixed.error_bound_us)
    if kind is EstimateMapping:
        entries = _live_entries(cast(EstimateMapping, mapping).lookup)
        if entries is not None:
            return skewless_native.ReferenceClocks.estimates(mapping, entries, SourceInfo, ClockEstimate)
    return mapping


def _live_entries(lookup: Callable[[str], object]) -> dict[str, object] | None:
    """The dict ``lookup`` reads, when it is a SourceInfoStore's ``get`` or a dict's ``get``."""
    owner = getattr(lookup, "__self__", None)
    if type(owner) is SourceInfoStore and getattr(lookup, "__func__", None) is SourceInfoStore.get:
        entries: Mapping[str, object] = owner.live_entries()
        return entries if type(entries) is dict else None
    if type(owner) is dict and getattr(lookup, "__name__", None) == "get":
        return cast(dict[str, object], owner)
    return None


NATIVE_PIPELINE_CORES = PipelineCores(native_sequence_reorderer, native_merger)


def with_core(pipeline: PipelineConfig, core: Core) -> PipelineConfig:
    """The pipeline config whose reorderers and mergers are the given core's."""
    if core == "native":
        return NATIVE_PIPELINE_CORES.apply(pipeline)
    return pipeline


class NativeGatewaySession(GatewaySession):
    """GatewaySession with the native decoder in its receive_data loop: frame split, msgpack decode and the
    validation of events, heartbeats and byes (the same errors, codes and limits). Hellos still go through the
    session's own ``_handle`` (parse_hello, auth, limits), then the decoder is told the declared streams."""

    def _open_decoder(self) -> None:
        import skewless_native

        self.native = skewless_native.ConnectionDecoder(self._decoder.max_frame_bytes, self._max_events_per_batch)

    @property
    def buffered_bytes(self) -> int:
        return int(self.native.buffered_bytes)

    def receive_data(self, data: bytes, now_us: int = 0) -> list[SessionAction]:
        if self.state in (SessionState.CLOSED, SessionState.ERROR):
            return []
        actions: list[SessionAction] = []
        items = self.native.receive_data(data)
        index = 0
        try:
            while index < len(items):
                item = items[index]
                index += 1
                if not isinstance(item, RemoteProtocolError) or item.code not in ("frame_too_large",
                                                                                   "malformed_frame"):
                    self._last_activity_us = now_us  # as the Python loop: once a frame decoded
                if isinstance(item, RemoteProtocolError):
                    raise item
                if type(item) is dict:
                    try:
                        actions.extend(self._handle(item, now_us))
                    except RemoteProtocolError:
                        self.native.fail()
                        raise
                    self.native.accept_hello(sorted(self.streams))
                    items, index = self.native.decode(), 0
                elif type(item) is EventBatch:
                    assert self.source_id is not None
                    actions.append(EventsReceived(self.source_id, item.events))
                elif type(item) is Heartbeat:
                    assert self.source_id is not None
                    actions.append(HeartbeatReceived(self.source_id, item))
                else:
                    assert type(item) is Bye
                    actions.append(DrainRequested())
                    self.state = SessionState.DRAINING
        except RemoteProtocolError as exc:
            actions.extend(self._fail(exc))
        self._note_partial_frame(now_us)
        return actions
