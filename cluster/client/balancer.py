"""The leaderless client-side balancer: spread a group of SAC queues over the apps consuming it.

Every app subscribes to every queue of the group; the machine makes one consumer per queue active.
Each app periodically reads who is active where (a `consumers` query), computes its ideal count
with `cluster.balance.decision` (the rule the model checker verified) and releases the queues
above it, one per poll: cancel, then subscribe again at the back of the waiting list. No leader,
no broker feature: the apps only need to agree on the rule. See the README for when it converges.

Example:
    with Client.from_data_dir(Path("D")) as client:
        balancer = LeaderlessBalancer(client, "orders", ["o1", "o2", "o3"], on_message=handle)
        balancer.start()
        ...
        balancer.close()
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence

from cluster.balance.decision import (
    ConsumerRow,
    View,
    choose_release,
    consumer_tag,
    ideal_number,
    view_from_consumers,
)
from cluster.client._log import get_logger
from cluster.client.client import Client
from cluster.client.consumer import Consumer, Message
from cluster.client.errors import ClusterError

log = get_logger("quorumq.balancer")
QUEUES_MAX = 1024
POLL_S_MIN = 0.05


class _GroupConsumer(Consumer):
    """A consumer whose tag names its group and app, so every app can read the group's view."""

    def __init__(self, client: Client, queue: str, tag: str, prefetch: int) -> None:
        super().__init__(client, queue, prefetch=prefetch, tag=tag)


def new_app_id() -> str:
    """An app id that sorts in start order (ms since the epoch), made unique by a random suffix."""
    return f"{time.time_ns() // 1_000_000:013d}-{uuid.uuid4().hex[:8]}"


class LeaderlessBalancer:
    """Balances single-active-consumer queues over the apps of a group, from the client side."""

    def __init__(
        self,
        client: Client,
        group: str,
        queues: Sequence[str],
        *,
        app_id: str | None = None,
        prefetch: int = 100,
        poll_s: float = 1.0,
        on_message: Callable[[Message], None] | None = None,
        on_change: Callable[[list[str]], None] | None = None,
    ) -> None:
        if not queues or len(queues) > QUEUES_MAX or len(set(queues)) != len(queues):
            raise ValueError(f"queues must be 1..{QUEUES_MAX} distinct names")
        if poll_s < POLL_S_MIN:
            raise ValueError(f"poll_s must be at least {POLL_S_MIN}")
        self.client = client
        self.group = group
        self.queues = tuple(sorted(queues))
        self.app_id = app_id or new_app_id()
        consumer_tag(group, self.app_id, 0)  # validates the names before anything is sent
        self.prefetch = prefetch
        self.poll_s = poll_s
        self.on_message = on_message
        self.on_change = on_change
        self.releases = 0
        self._consumers: dict[str, Consumer] = {}
        self._subscriptions = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_active: list[str] = []

    def start(self) -> None:
        """Subscribe to every queue of the group, then balance in a background thread."""
        with self._lock:
            for q in self.queues:
                self._subscribe(q)
        self._thread = threading.Thread(
            target=self._run, name=f"qq-balancer-{self.group}", daemon=True
        )
        self._thread.start()

    def _subscribe(self, queue: str) -> None:
        self._subscriptions += 1
        tag = consumer_tag(self.group, self.app_id, self._subscriptions)
        consumer = _GroupConsumer(self.client, queue, tag, self.prefetch)
        consumer.start(self.on_message)
        self._consumers[queue] = consumer

    def active_queues(self) -> list[str]:
        """The queues this app is active on, as the machine's notices say."""
        return [q for q, c in self._consumers.items() if c.active and not c.cancelled]

    def view(self) -> View:
        """Who is active on each queue of the group, and the apps with a live consumer."""
        result = self.client.consumers()
        rows: dict[str, list[ConsumerRow]] = {}
        for q in self.queues:
            rows[q] = [(r.tag, r.status, r.active) for r in result.get(q, [])]
        return view_from_consumers(self.group, self.queues, rows)

    def step(self) -> str | None:
        """Read the view and release at most one queue; returns the queue released, if any."""
        view = self.view()
        queue = choose_release(view, self.app_id)
        with self._lock:
            if self._stop.is_set() or queue is None or queue not in self.active_queues():
                return None
            self._release(queue)
        log.info(
            "queue_released",
            group=self.group,
            app=self.app_id,
            queue=queue,
            ideal=ideal_number(view, self.app_id),
        )
        return queue

    def _release(self, queue: str) -> None:
        consumer = self._consumers[queue]
        consumer.cancel()
        extra = consumer.take_buffered()
        if extra:
            consumer.nack(extra, requeue=True)
        self.releases += 1
        self._subscribe(queue)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.step()
            except ClusterError as error:  # a leader change or a timeout: try at the next poll
                log.warning("balance_step_failed", group=self.group, error=str(error))
            active = self.active_queues()
            if active != self._last_active:
                self._last_active = active
                if self.on_change is not None:
                    self.on_change(active)

    def close(self) -> None:
        """Stop balancing, cancel every subscription and give back what was not handed out."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.poll_s + 10)
        with self._lock:
            for consumer in self._consumers.values():
                try:
                    consumer.cancel()
                    extra = consumer.take_buffered()
                    if extra:
                        consumer.nack(extra, requeue=True)
                    consumer.wait_settled(timeout_s=5)
                except ClusterError as error:
                    log.warning("balance_cancel_failed", queue=consumer.queue, error=str(error))

    def __enter__(self) -> LeaderlessBalancer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
