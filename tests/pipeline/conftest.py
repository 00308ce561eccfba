"""One real local-mode SparkSession for every pipeline test: Spark start-up costs ~10 s."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipeline.spark import create_session

ROOT = Path(__file__).resolve().parents[2]  # the checkout


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local[2] session, stopped at the end of the test session.

    The checkout goes on PYTHONPATH before Spark starts (its Python workers inherit it), so
    executors import test-only modules such as `tests.pipeline.planted`."""
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    session = create_session("local[2]", app_name="quorumq-pipeline-tests")
    yield session
    session.stop()
