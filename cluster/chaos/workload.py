"""The chaos workload: producers (confirmed publishes) and consumers (manual acks) as threads.

Every worker runs in the harness process and records into one Recorder, so the history has
one clock. A producer publishes one message at a time (window 1) so each publish has its own
outcome; after an unknown outcome it retires its enqueuer and process name and continues with
fresh ones, as Jepsen does, because the old operation may still complete. Consumers settle each
message with its own Settle command, so each ack has its own outcome too.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from cluster import protocol
from cluster.chaos.history import EventType, Recorder
from cluster.client import Client, Consumer, Message, Publisher
from cluster.client.errors import ClusterError, CommandRefused
from cluster.client.sansio import UNCERTAIN
from fifo.codec import decode, encode
from fifo.commands import Settle
from fifo.replies import Error

log = structlog.get_logger(__name__)

ClientFactory = Callable[[str], Client]  # name -> a connected client
RETRY_PAUSE_S = 0.2
CREDIT = 10
IDLE_REGRANT_S = 1.0


@dataclass(frozen=True, slots=True)
class WorkloadParams:
    """Bounds of the workload."""

    producers: int = 3
    consumers: int = 3
    queues: tuple[str, ...] = ("chaos-1", "chaos-2")
    rate_per_s: float = 40.0  # total publish rate over every producer
    confirm_timeout_s: float = 5.0
    ack_timeout_s: float = 5.0
    prefetch: int = 10


class Worker(threading.Thread):
    """A workload thread that stops when `stop` is set; errors end up in `errors`."""

    def __init__(self, name: str, recorder: Recorder, stop: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self.recorder = recorder
        self.stop_event = stop
        self.errors: list[str] = []
        self.clients_made = 0

    def connect(self, factory: ClientFactory, name: str) -> Client | None:
        """A new client, or None (after a short pause) when no node answers."""
        try:
            client = factory(name)
        except (ClusterError, OSError) as err:
            self._note(f"connect: {err}")
            self.stop_event.wait(RETRY_PAUSE_S)
            return None
        self.clients_made += 1
        return client

    def _note(self, error: str) -> None:
        if len(self.errors) < 100:  # bounded: a long outage must not eat memory
            self.errors.append(error)


class Producer(Worker):
    """Publishes unique bodies `p<i>-<generation>-<n>` to one queue at a bounded rate."""

    def __init__(
        self,
        index: int,
        queue: str,
        factory: ClientFactory,
        recorder: Recorder,
        stop: threading.Event,
        params: WorkloadParams,
        run_id: str,
    ) -> None:
        super().__init__(f"producer-{index}", recorder, stop)
        self.index = index
        self.queue = queue
        self.factory = factory
        self.params = params
        self.run_id = run_id
        self.interval_s = params.producers / params.rate_per_s
        self.generation = 0
        self.published = 0

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            client = self.connect(self.factory, f"chaos-{self.name}")
            if client is None:
                continue
            try:
                next_at = self._publish_until_unknown(client, next_at)
            finally:
                client.close()

    def _publish_until_unknown(self, client: Client, next_at: float) -> float:
        """Publish with one enqueuer until an outcome is not ok; returns the next send time."""
        self.generation += 1
        process = f"{self.name}.{self.generation}"
        enqueuer = f"{self.run_id}-p{self.index}-g{self.generation}"
        publisher = client.publisher(self.queue, window=1, enqueuer=enqueuer)
        try:
            for seq in range(1, 1 << 62):
                next_at = max(next_at + self.interval_s, time.monotonic())
                if self.stop_event.wait(max(0.0, next_at - time.monotonic())):
                    return next_at
                value = f"p{self.index}-g{self.generation}-{seq}"
                if self._send(publisher, process, enqueuer, seq, value) != "ok":
                    return next_at
        finally:
            publisher.close()
        return next_at

    def _send(
        self, publisher: Publisher, process: str, enqueuer: str, seq: int, value: str
    ) -> EventType:
        """Publish message `seq`; its outcome (anything but ok ends this enqueuer)."""
        return self._publish_one(publisher, process, enqueuer, seq, value)

    def _publish_one(
        self, publisher: Publisher, process: str, enqueuer: str, seq: int, value: str,
        key: str | None = None,
    ) -> EventType:  # fmt: skip
        op = self.recorder.invoke(
            "publish", process, queue=self.queue, value=value, enqueuer=enqueuer, seq=seq, key=key
        )
        outcome: EventType = "ok"
        detail = None
        timeout_s = self.params.confirm_timeout_s
        try:
            publisher.publish(value.encode(), group=key, timeout_s=timeout_s)
            publisher.wait_for_confirms(timeout_s)
        except CommandRefused as err:
            outcome, detail = "fail", str(err)  # an error reply: nothing was applied
        except (ClusterError, OSError) as err:
            outcome, detail = "info", f"{type(err).__name__}: {err}"
        self.recorder.complete(op, outcome, "publish", process, value=value, detail=detail)
        self._count(outcome, detail)
        return outcome

    def _count(self, outcome: EventType, detail: str | None) -> None:
        if outcome == "ok":
            self.published += 1
        else:
            self._note(detail or outcome)


class QueueConsumer(Worker):
    """Consumes one queue with prefetch or credit and settles each message with its own ack."""

    def __init__(
        self,
        index: int,
        queue: str,
        factory: ClientFactory,
        recorder: Recorder,
        stop: threading.Event,
        params: WorkloadParams,
        credited: bool,
    ) -> None:
        super().__init__(f"consumer-{index}", recorder, stop)
        self.queue = queue
        self.factory = factory
        self.params = params
        self.credited = credited
        self.acker = Acker(recorder, params.ack_timeout_s)

    def run(self) -> None:
        while not self.stop_event.is_set():
            client = self.connect(self.factory, f"chaos-{self.name}")
            if client is None:
                continue
            try:
                self._consume_with(client)
            except (ClusterError, OSError) as err:
                self._note(f"consume: {type(err).__name__}: {err}")
                self.stop_event.wait(RETRY_PAUSE_S)
            finally:
                self.acker.wait()
                client.close()

    def _consume_with(self, client: Client) -> None:
        consumer = client.consume(self.queue, prefetch=self.params.prefetch, credited=self.credited)
        if self.credited:
            consumer.grant(CREDIT)
        idle_since = time.monotonic()
        since_grant = 0
        while not self.stop_event.is_set():
            message = consumer.get(timeout_s=0.2)
            if message is None:
                if consumer.cancelled:
                    return
                if self.credited and time.monotonic() - idle_since >= IDLE_REGRANT_S:
                    consumer.grant(CREDIT)  # credit may have been reset by a re-attach
                    idle_since = time.monotonic()
                continue
            idle_since = time.monotonic()
            self.acker.settle(client, consumer, message, self.name)
            since_grant += 1
            if self.credited and since_grant >= CREDIT // 2:
                consumer.grant(CREDIT)
                since_grant = 0


class Acker:
    """Settles messages with one Settle command each, recording the delivery and the ack."""

    def __init__(self, recorder: Recorder, ack_timeout_s: float) -> None:
        self.recorder = recorder
        self.ack_timeout_s = ack_timeout_s
        self.consumed = 0  # acks that completed ok or unknown
        self._in_flight = 0
        self._cond = threading.Condition()

    def settle(self, client: Client, consumer: Consumer, message: Message, process: str) -> None:
        """Record the delivery, send its Settle, record the ack's outcome when it comes."""
        value = message.body.decode(errors="replace")
        delivery = self.recorder.observe(
            "deliver",
            process,
            queue=message.queue,
            value=value,
            redelivered=message.redelivered,
            detail=consumer.tag,
        )
        op = self.recorder.invoke(
            "ack", process, queue=message.queue, value=value, delivery=delivery
        )
        command = Settle(message.queue, message.consumer_key, (message.msg_id,))

        def on_answer(answer: dict[str, object] | None, error: BaseException | None) -> None:
            outcome, detail = _ack_outcome(answer, error)
            self.recorder.complete(op, outcome, "ack", process, value=value, detail=detail)
            with self._cond:
                self._in_flight -= 1
                self.consumed += outcome != "fail"
                self._cond.notify_all()

        with self._cond:
            self._in_flight += 1
        try:
            frame = protocol.command(0, encode(command))
            client.submit([frame], [on_answer], timeout_s=self.ack_timeout_s)
        except (ClusterError, OSError) as err:
            on_answer(None, err)

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait until every ack sent has an outcome (or the timeout passes)."""
        timeout = self.ack_timeout_s if timeout_s is None else timeout_s
        with self._cond:
            self._cond.wait_for(lambda: self._in_flight <= 0, timeout=timeout)


def _ack_outcome(
    answer: dict[str, object] | None, error: BaseException | None
) -> tuple[EventType, str | None]:
    """ok for an Ok reply; fail for an error reply (nothing settled); info when unknown (also
    an error answering a resend whose earlier attempt may have settled it)."""
    if answer is not None:
        reply = decode(answer["reply"])  # type: ignore[arg-type]
        if isinstance(reply, Error):
            return ("info" if answer.get(UNCERTAIN) else "fail"), repr(reply)
        return "ok", None
    if isinstance(error, CommandRefused):
        return "fail", str(error)
    return "info", f"{type(error).__name__}: {error}" if error is not None else None


class Drainer:
    """Drains queues through one node after the faults, recording like a consumer."""

    def __init__(self, node: str, recorder: Recorder, params: WorkloadParams) -> None:
        self.node = node
        self.params = params
        self.acker = Acker(recorder, params.ack_timeout_s)

    def drain(self, client: Client, queue: str, idle_s: float, deadline: float) -> int:
        """Consume and settle `queue` until nothing arrives for `idle_s`; returns the count."""
        process = f"drain-{self.node}"
        consumer = client.consume(queue, prefetch=max(self.params.prefetch, 50))
        count = 0
        try:
            while time.monotonic() < deadline:
                message = consumer.get(timeout_s=idle_s)
                if message is None:
                    break
                self.acker.settle(client, consumer, message, process)
                count += 1
        finally:
            self.acker.wait()
            with contextlib.suppress(ClusterError, OSError):
                consumer.cancel()
        return count
