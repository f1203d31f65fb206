"""How confluent-kafka's transaction errors map to ours (no broker: the errors are built as librdkafka reports them),
and how the publisher hands delivery reports to their callbacks."""

from typing import cast

import pytest
from confluent_kafka import KafkaError, KafkaException, Message

from broker.transactions import (
    ProducerFenced,
    TransactionAbortable,
    TransactionalPublisher,
    TransactionRetriable,
    classify,
)


@pytest.mark.parametrize("error", [
    KafkaError(KafkaError._FENCED, fatal=True),
    KafkaError(KafkaError.PRODUCER_FENCED),
    KafkaError(KafkaError.INVALID_PRODUCER_EPOCH, fatal=True),
])
def test_fencing_in_any_of_its_codes_is_producer_fenced(error: KafkaError) -> None:
    assert isinstance(classify(KafkaException(error)), ProducerFenced)


def test_the_generic_fatal_code_is_fencing_only_when_the_fatal_error_was() -> None:
    after_fatal = KafkaException(KafkaError(KafkaError._FATAL, fatal=True))
    assert isinstance(classify(after_fatal, KafkaError(KafkaError._FENCED, fatal=True)), ProducerFenced)
    other = classify(after_fatal, KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, fatal=True))
    assert other is after_fatal


def test_abortable_retriable_and_fatal_errors() -> None:
    abortable = KafkaException(KafkaError(KafkaError.TRANSACTION_ABORTABLE, txn_requires_abort=True))
    assert isinstance(classify(abortable), TransactionAbortable)
    retriable = KafkaException(KafkaError(KafkaError._TIMED_OUT, retriable=True))
    assert isinstance(classify(retriable), TransactionRetriable)
    # Fatal wins over the other flags: a fatal producer can neither abort nor retry.
    fatal = KafkaException(KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, fatal=True, retriable=True))
    assert classify(fatal) is fatal
    plain = KafkaException(KafkaError(KafkaError.INVALID_CONFIG))
    assert classify(plain) is plain


def test_poll_runs_at_most_max_callbacks_in_order_and_keeps_the_rest() -> None:
    # No broker: librdkafka's producer is made (it connects lazily) and its poll serves nothing; the reports are
    # queued as the delivery callbacks of the records would queue them.
    publisher = TransactionalPublisher("127.0.0.1:9", "poll-steps")
    try:
        ran: list[int] = []
        for index in range(5):
            publisher.report_to(lambda _error, _message, index=index: ran.append(index))(None, cast(Message, None))
        assert publisher.reports_waiting == 5
        assert publisher.poll(0, max_callbacks=2) == 2
        assert (ran, publisher.reports_waiting) == ([0, 1], 3)
        assert publisher.poll(0) == 3
        assert (ran, publisher.reports_waiting) == ([0, 1, 2, 3, 4], 0)
        assert publisher.poll(0, max_callbacks=2) == 0
    finally:
        publisher.close()
