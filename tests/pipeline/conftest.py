"""One real local-mode SparkSession for every pipeline test: Spark start-up costs ~10 s."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from pipeline.spark import create_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local[2] session, stopped at the end of the test session."""
    session = create_session("local[2]", app_name="quorumq-pipeline-tests")
    yield session
    session.stop()
