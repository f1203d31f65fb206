"""Recovery right after topic creation: a partition without a leader yet is asked again, other errors are not."""

import pytest
from confluent_kafka import KafkaError, KafkaException

from broker.reader import end_offset


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
