"""Progress of running Spark stages on stderr, polled from the driver's status tracker."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from pyspark.sql import SparkSession

POLL_INTERVAL_S = 0.5


def _stage_progress(spark: SparkSession) -> tuple[int, int] | None:
    """Completed and total tasks over the active stages, or None when nothing runs."""
    tracker = spark.sparkContext.statusTracker()
    done = total = 0
    for stage_id in tracker.getActiveStageIds():
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            done += info.numCompletedTasks
            total += info.numTasks
    return (done, total) if total else None


@contextmanager
def report_progress(spark: SparkSession, label: str, stream: TextIO | None) -> Iterator[None]:
    """While the body runs, print `label: tasks D/T` on `stream` each time D or T changes."""
    if stream is None:
        yield
        return
    stop = threading.Event()

    def poll() -> None:
        last: tuple[int, int] | None = None
        while not stop.wait(POLL_INTERVAL_S):
            current = _stage_progress(spark)
            if current is not None and current != last:
                print(f"{label}: tasks {current[0]}/{current[1]}", file=stream, flush=True)
                last = current

    thread = threading.Thread(target=poll, name="spark-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
