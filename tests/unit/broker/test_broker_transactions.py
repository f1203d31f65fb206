"""How confluent-kafka's transaction errors map to ours (no broker: the errors are built as librdkafka reports them)."""

import pytest
from confluent_kafka import KafkaError, KafkaException

from broker.transactions import ProducerFenced, TransactionAbortable, TransactionRetriable, classify


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
