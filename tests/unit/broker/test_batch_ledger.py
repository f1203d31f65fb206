"""The exactly-once batch sink's decisions (broker.batch_ledger), without Kafka or Spark: hand-computed cases, then
every crash point of a model of Spark's replay and Kafka's transactions, checked against each batch written once."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from broker.batch_ledger import (
    BatchDecision,
    BatchLedger,
    SinkFault,
    SinkStep,
    batch_id_of_offset,
    offset_of_batch_id,
    parse_sink_fault,
    sink_transactional_id,
)
from broker.batch_sink import SINK_FAULT_ENV, SINK_FAULT_EXIT_CODE, sink_fault_from_env


def test_the_transactional_id_is_the_topic_and_the_query_id() -> None:
    assert sink_transactional_id("skewless.results.window_count", "6f1c") == "skewless.results.window_count.sink.6f1c"
    assert sink_transactional_id("t.results.a", "q1") != sink_transactional_id("t.results.a", "q2")
    with pytest.raises(ValueError, match="query id"):
        sink_transactional_id("t.results.a", "")


def test_a_batch_id_is_recorded_as_the_next_offset() -> None:
    assert [offset_of_batch_id(b) for b in (0, 1, 41)] == [1, 2, 42]
    assert [batch_id_of_offset(o) for o in (1, 2, 42)] == [0, 1, 41]
    # Kafka's "no committed offset" (OFFSET_INVALID) and offset 0 (never written by the sink) are no record.
    assert batch_id_of_offset(-1001) is None
    assert batch_id_of_offset(0) is None
    with pytest.raises(ValueError, match="start at 0"):
        offset_of_batch_id(-1)


def test_a_fresh_sink_writes_its_first_batch_and_warns_for_a_later_one() -> None:
    ledger = BatchLedger.at_restart(-1001)
    assert ledger.last_committed_batch_id is None
    assert ledger.decide(0) is BatchDecision.WRITE
    assert ledger.decide(7) is BatchDecision.WRITE_UNRECORDED


def test_a_committed_batch_is_skipped_and_the_next_one_written() -> None:
    ledger = BatchLedger()
    ledger.committed(0)
    assert [ledger.decide(b) for b in (0, 1, 2)] == [BatchDecision.SKIP, BatchDecision.WRITE, BatchDecision.WRITE]
    ledger.committed(1)
    assert ledger.last_committed_batch_id == 1
    with pytest.raises(ValueError, match="batch 1 committed after batch 1"):
        ledger.committed(1)


def test_a_restart_reads_the_last_committed_batch_from_the_offset() -> None:
    ledger = BatchLedger.at_restart(offset_of_batch_id(4))
    # 4: Spark replays the batch it did not record; 3: a checkpoint restored from an older copy.
    assert [ledger.decide(b) for b in (3, 4, 5)] == [BatchDecision.SKIP, BatchDecision.SKIP, BatchDecision.WRITE]


def test_sink_faults_parse_or_are_refused() -> None:
    assert parse_sink_fault("committed@3") == SinkFault(SinkStep.COMMITTED, 3)
    assert parse_sink_fault(" mid_transaction@0 ") == SinkFault(SinkStep.MID_TRANSACTION, 0)
    assert parse_sink_fault("") is None
    for bad in ("committed", "commited@1", "committed@-1", "committed@x"):
        with pytest.raises(ValueError, match="expected <step>@<batch id>"):
            parse_sink_fault(bad)
    fault = SinkFault(SinkStep.COMMITTED, 2)
    assert [fault.fires(s, b) for s, b in ((SinkStep.COMMITTED, 2), (SinkStep.COMMITTED, 1),
                                           (SinkStep.MID_TRANSACTION, 2))] == [True, False, False]


def test_the_fault_hook_ends_the_process_at_its_step_only() -> None:
    assert sink_fault_from_env({}) is None
    hook = sink_fault_from_env({SINK_FAULT_ENV: "committed@1"})
    assert hook is not None
    hook(SinkStep.MID_TRANSACTION, 1)  # another step: nothing happens
    hook(SinkStep.COMMITTED, 0)
    code = ("from broker.batch_ledger import SinkStep; from broker.batch_sink import sink_fault_from_env;"
            f"sink_fault_from_env({{'{SINK_FAULT_ENV}': 'committed@1'}})(SinkStep.COMMITTED, 1); print('alive')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout) == (SINK_FAULT_EXIT_CODE, "")


# -- a model: Spark's checkpoint, Kafka's transactions, a driver that may die anywhere -------------------------

class Died(Exception):
    pass


@dataclass
class Kafka:
    """The committed log of the results topic and the sink group's committed offset (no record: -1001)."""

    committed_records: list[str] = field(default_factory=list)
    group_offset: int = -1001


@dataclass
class Checkpoint:
    """Spark's offsets log (the batches planned) and commits log (the batches it recorded as done)."""

    planned: int = -1
    recorded: int = -1


def run_driver(kafka: Kafka, checkpoint: Checkpoint, outputs: list[list[str]],
               dies_at: tuple[str, int] | None) -> None:
    """One driver run: Spark replays its last planned, unrecorded batch, then plans the next ones; each batch goes
    through the sink's decisions; a transaction's records reach the log only with its commit."""
    ledger = BatchLedger.at_restart(kafka.group_offset)  # after init_transactions aborted any open transaction
    batch_id = checkpoint.recorded + 1
    while batch_id < len(outputs):
        checkpoint.planned = max(checkpoint.planned, batch_id)
        if dies_at == ("planned", batch_id):
            raise Died
        if ledger.decide(batch_id) is not BatchDecision.SKIP:
            staged = list(outputs[batch_id])
            if dies_at == ("mid_transaction", batch_id):
                raise Died  # the staged records are aborted by the next run's init_transactions
            kafka.committed_records += staged
            kafka.group_offset = offset_of_batch_id(batch_id)
            ledger.committed(batch_id)
            if dies_at == ("committed", batch_id):
                raise Died
        checkpoint.recorded = batch_id
        batch_id += 1


OUTPUTS = [["a0", "a1"], [], ["c0"], ["d0", "d1", "d2"]]
CRASH_POINTS = [(step, b) for b in range(len(OUTPUTS)) for step in ("planned", "mid_transaction", "committed")]


@pytest.mark.parametrize("crashes", [[c] for c in CRASH_POINTS]
                         + [[a, b] for a in CRASH_POINTS for b in CRASH_POINTS if a <= b])
def test_every_batch_is_committed_once_whatever_the_driver_deaths(crashes: list[tuple[str, int]]) -> None:
    kafka, checkpoint = Kafka(), Checkpoint()
    for crash in [*crashes, None]:
        try:
            run_driver(kafka, checkpoint, OUTPUTS, crash)
        except Died:
            continue
    assert kafka.committed_records == [r for batch in OUTPUTS for r in batch]
    assert checkpoint.recorded == len(OUTPUTS) - 1


def test_the_model_without_the_ledger_duplicates_a_replayed_batch() -> None:
    """The model can fail: Spark's replay alone (at-least-once) writes batch 2 twice after a death at commit."""
    kafka, checkpoint = Kafka(), Checkpoint()
    with pytest.raises(Died):
        run_driver(kafka, checkpoint, OUTPUTS, ("committed", 2))
    kafka.group_offset = -1001  # the record lost: the next run cannot tell that batch 2 was written
    run_driver(kafka, checkpoint, OUTPUTS, None)
    assert kafka.committed_records.count("c0") == 2
