"""The Celery app of the Celery test (`celery -A celery_app worker`): configured by environment.

QQ_BROKER is the quorumq:// URL; QQ_RAN is a file each task run appends a line to.
"""

from __future__ import annotations

import os
import time

from celery import Celery

import cluster.integrations.kombu_transport  # noqa: F401 - registers quorumq://

app = Celery("qqtest", broker=os.environ["QQ_BROKER"], backend="rpc://")
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="qqtest.double")  # type: ignore[untyped-decorator]  # celery is untyped here
def double(number: int) -> int:
    """Record the run (an O_APPEND write of one line is atomic), then answer."""
    with open(os.environ["QQ_RAN"], "a", encoding="ascii") as ran:
        ran.write(f"{os.getpid()} {number}\n")
    time.sleep(float(os.environ.get("QQ_TASK_S", "0.005")))
    return number * 2
