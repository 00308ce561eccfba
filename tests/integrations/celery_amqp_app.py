"""The Celery app of the Celery-over-AMQP test (`celery -A celery_amqp_app worker`): Celery's
own amqp:// transport (py-amqp) against quorumq's AMQP listener, configured by environment.

QQ_AMQP_URL is the amqp:// URL; QQ_RAN is a file each task run appends a line to. Every queue
quorumq has is a durable quorum queue (as RabbitMQ's quorum queues: no auto-delete, exclusive
or x-expires), so the control, event and result queues are asked for durable and non-exclusive,
without expiry; everything else is Celery's default.
"""

from __future__ import annotations

import os
import time

import kombu
from celery import Celery
from celery.backends.rpc import RPCBackend


class DurableRPCBackend(RPCBackend):  # type: ignore[misc]
    """Celery's RPC result backend with its reply queue durable (not auto-delete)."""

    @property
    def binding(self) -> kombu.Queue:
        """The queue this process's results come to (named after its thread oid)."""
        return self.Queue(self.oid, self.exchange, self.oid, durable=True, auto_delete=False)


app = Celery(
    "qqamqp",
    broker=os.environ["QQ_AMQP_URL"],
    backend="celery_amqp_app:DurableRPCBackend",
)
app.conf.update(
    broker_transport_options={"confirm_publish": True},
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    worker_send_task_events=True,
    result_expires=None,
    control_queue_durable=True,
    control_queue_exclusive=False,
    control_queue_expires=None,
    control_queue_ttl=None,
    event_queue_durable=True,
    event_queue_exclusive=False,
    event_queue_expires=None,
    event_queue_ttl=None,
)


@app.task(name="qqamqp.double")  # type: ignore[untyped-decorator]  # celery is untyped here
def double(number: int) -> int:
    """Record the run (an O_APPEND write of one line is atomic), then answer."""
    with open(os.environ["QQ_RAN"], "a", encoding="ascii") as ran:
        ran.write(f"{os.getpid()} {number}\n")
    time.sleep(float(os.environ.get("QQ_TASK_S", "0.002")))
    return number * 2
