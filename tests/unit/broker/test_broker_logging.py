"""librdkafka's "Failed to acquire transactional PID ... retrying" against a broker whose transaction coordinator is
still loading is no problem: one INFO line says what it means, the lines themselves go to DEBUG (issue 28 item 1)."""

from __future__ import annotations

import logging

from broker.client import librdkafka_logger

LINE = ("GETPID [rdkafka#producer-6] [thrd:main]: Failed to acquire transactional PID from broker "
        "127.0.0.1:50201/1: Broker: Coordinator load in progress: retrying")


def test_the_coordinator_load_retry_is_explained_once_and_its_lines_are_debug(caplog):
    logger = librdkafka_logger()
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            logger.warning("%s", LINE)
        logger.warning("FAIL [rdkafka#producer-6] [thrd:main]: 127.0.0.1:1/bootstrap: Connection refused")
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "librdkafka"] == [
        ("INFO", "Kafka's transaction coordinator is still loading (a broker that just started or moved a "
                 "coordinator): the producer retries until it answers; not an error (librdkafka's \"Failed to "
                 "acquire transactional PID\" retry lines are logged at DEBUG)"),
        ("WARNING", "FAIL [rdkafka#producer-6] [thrd:main]: 127.0.0.1:1/bootstrap: Connection refused")]
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        logger.warning("%s", LINE.replace("transactional", "idempotence"))
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("DEBUG", LINE.replace("transactional", "idempotence"))]
