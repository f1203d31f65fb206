"""Reading a topic: recovery right after topic creation asks a partition without a leader again; a settled read waits
for the last transaction's markers."""

import pytest
from confluent_kafka import KafkaError, KafkaException

from broker.reader import end_offset, settled_ends


class FlakyConsumer:
    def __init__(self, failures: list[int]) -> None:
        self.failures = failures
        self.calls = 0

    def get_watermark_offsets(self, _partition: object, timeout: float) -> tuple[int, int]:
        self.calls += 1
        if self.failures:
            raise KafkaException(KafkaError(self.failures.pop(0)))
        return 0, 5


def test_a_partition_without_a_leader_yet_is_asked_again() -> None:
    consumer = FlakyConsumer([KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE])
    assert end_offset(consumer, "t", timeout_s=5.0) == 5  # type: ignore[arg-type]
    assert consumer.calls == 3


def test_other_errors_are_raised_at_once() -> None:
    consumer = FlakyConsumer([KafkaError.TOPIC_AUTHORIZATION_FAILED])
    with pytest.raises(KafkaException):
        end_offset(consumer, "t", timeout_s=5.0)  # type: ignore[arg-type]
    assert consumer.calls == 1


class Ends:
    """A consumer whose partition 0 ends at each of ``ends`` in turn (the last one from then on)."""

    def __init__(self, ends: list[int]) -> None:
        self.ends = ends
        self.calls = 0

    def get_watermark_offsets(self, _partition: object, timeout: float) -> tuple[int, int]:
        self.calls += 1
        return 0, self.ends[min(self.calls, len(self.ends)) - 1]


def test_a_settled_read_waits_for_the_last_transactions_markers() -> None:
    # Committed records at 0-4, a transaction committed at 5-6 whose marker lands at 7 on the third look: until then
    # the last stable offset is 5 (a read_committed read would end before the transaction).
    stable, high = Ends([5, 5, 8]), Ends([8])
    pauses: list[float] = []
    assert settled_ends(stable, high, "t", [0], deadline=float("inf"),  # type: ignore[arg-type]
                        sleep=pauses.append) == {0: 8}
    assert (stable.calls, high.calls, pauses) == (3, 3, [0.01, 0.01])


def test_a_settled_read_that_never_settles_says_so() -> None:
    with pytest.raises(TimeoutError, match=r"last stable offsets \{0: 5\} stayed behind the high watermarks \{0: 8\}"):
        settled_ends(Ends([5]), Ends([8]), "t", [0], deadline=0.0)  # type: ignore[arg-type]
