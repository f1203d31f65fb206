"""One SparkSession (one JVM) for the whole test session, shared by the integration and reliability suites: two
session fixtures would each stop the same JVM at the end."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from spark_jobs.session import create_spark_session, stop_spark

    session = create_spark_session("skewless-tests")
    try:
        yield session
    finally:
        stop_spark(session)
