"""Prometheus metrics of one node, served at `http://BIND:PORT/metrics` (`--metrics-port`).

Off unless a port is configured (`--metrics-port`, or `metrics_port` of the node in
cluster.toml); bound to 127.0.0.1 unless `--metrics-bind` (or `[cluster] metrics_bind`) says
otherwise. Names follow Prometheus conventions and RabbitMQ's prometheus plugin
(`rabbitmq_queue_messages_ready` -> `quorumq_queue_messages_ready`).

What a node counts, and so what to sum or not across nodes:

- queue state gauges (`quorumq_queue_messages_ready`, `_unacked`, `_consumers`, ...) are read
  from this node's replica of the state machine at scrape time: every node shows the whole
  cluster (a follower possibly a little behind); take them from one node (e.g. the leader).
- `quorumq_queue_messages_published_total`, `_acked_total`, `_returned_total`,
  `_rejected_total` count the commands that clients connected to *this node* got accepted, and
  `_delivered_total` the messages delivered to them: sum them over nodes for cluster totals.
- `quorumq_queue_messages_dead_lettered_total` counts what this node applied: every node counts
  every dead-lettering of the cluster (since it started): do not sum it over nodes. Its part
  that reached no dead-letter queue is `quorumq_queue_messages_dropped_total` (same rule).
- raft gauges and histograms are this node's own.
- `quorumq_clock_steps_rejected_total{node}` counts, as applied on this node (every node counts
  every node's), the episodes in which `node`'s wall clock was more than the bound off the
  machine's time and was not followed (`raft.machine_clock`): do not sum it over nodes.

The number of queues labelled is capped (`QUEUES_LABELLED_MAX`); past it, new queues are not
given series of their own (their gauges are summed into `queue="_other"`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

import fifo
from cluster.node.listening import log_address, socket_address
from fifo.commands import UNBOUND_SETTLES, Checkout, Discard, Enqueue, Modify, Return, Settle
from fifo.effects import DeadLettered, Deliver, RefDeliver
from fifo.replies import DequeueOk, Ok
from raft.replica import Replica, ReplicaView
from raft.replicated import Outcome

if TYPE_CHECKING:  # prometheus-client is imported only when metrics are on (an extra)
    from prometheus_client import Counter
    from prometheus_client.core import GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector

Sink = Callable[[Any], None]
QUEUES_LABELLED_MAX = 1000
OTHER_QUEUE = "_other"
FSYNC_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
APPLY_BUCKETS = (0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# gauge -> (the server's status field it reads, scale, help): cluster/node/memory.py
NODE_GAUGES: dict[str, tuple[str, float, str]] = {
    "quorumq_memory_resident_bytes": (
        "memory_resident_bytes",
        1.0,
        "This node's resident set, as last sampled.",
    ),
    "quorumq_memory_high_watermark_bytes": (
        "memory_high_watermark_bytes",
        1.0,
        "Past this resident set the node refuses publishes.",
    ),
    "quorumq_memory_alarm": (
        "memory_alarm",
        1.0,
        "1 while the memory alarm is set (publishes refused: memory_alarm).",
    ),
    "quorumq_event_loop_stall_seconds_max": (
        "loop_stall_max_ms",
        0.001,
        "The longest event-loop stall since the node started.",
    ),
    "quorumq_event_loop_stall_recent_seconds_max": (
        "loop_stall_recent_max_ms",
        0.001,
        "The longest event-loop stall in the last 10 s.",
    ),
}


class MetricsUnavailable(Exception):
    """Metrics were asked for but cannot be served (library missing, port taken)."""


class NoMetrics:
    """What the node calls when metrics are off: nothing is counted."""

    def count(self, command: Any, sink: Sink) -> Sink:
        """The reply sink of `command`, wrapped to count it once accepted (here: as is)."""
        return sink

    def on_outcome(self, outcome: Outcome, mine: bool) -> None:
        """Inside a raft tick (the loop): an applied entry (deliveries, dead-letterings, batch
        size)."""

    def connection_opened(self) -> None:
        """A client connection was authenticated."""

    def start(self) -> None:
        """Serve /metrics."""

    def stop(self) -> None:
        """Stop serving."""


class NodeMetrics(NoMetrics):
    """The metrics of one node and the HTTP server exposing them."""

    def __init__(
        self,
        node_id: str,
        replica: Callable[[], Replica],
        connections: Callable[[], int],
        port: int | None,
        bind: str = "127.0.0.1",
        node_status: Callable[[], dict[str, Any]] = dict,
    ) -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter, Histogram
        except ImportError as err:
            raise MetricsUnavailable(
                "--metrics-port needs prometheus-client: pip install 'quorumq[metrics]'"
            ) from err
        self.node_id = node_id
        self.port = port
        self.bind = bind
        self._replica = replica
        self._connections = connections
        self._node_status = node_status  # the server's own status fields (memory, loop stalls)
        self._server: Any = None
        self._labelled: set[str] = set()
        self._labelled_lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry

        def counter(name: str, doc: str, labels: tuple[str, ...] = ("queue",)) -> Counter:
            return Counter(name, doc, labels, registry=r)

        self.published = counter(
            "quorumq_queue_messages_published",
            "Messages published to the queue by this node's clients (accepted enqueues).",
        )
        self.delivered = counter(
            "quorumq_queue_messages_delivered",
            "Messages delivered to this node's consumers (pushed or got).",
        )
        self.acked = counter(
            "quorumq_queue_messages_acked", "Messages settled by this node's clients."
        )
        self.returned = counter(
            "quorumq_queue_messages_returned",
            "Messages returned to the queue by this node's clients (nack with requeue).",
        )
        self.rejected = counter(
            "quorumq_queue_messages_rejected",
            "Messages discarded by this node's clients (reject; dead-lettered if configured).",
        )
        self.dead_lettered = counter(
            "quorumq_queue_messages_dead_lettered",
            "Messages dead-lettered (or dropped) by the queue, as applied on this node.",
            ("queue", "reason"),
        )
        self.dropped = counter(
            "quorumq_queue_messages_dropped",
            "Messages that left the queue (expired, rejected, over a limit) without reaching a "
            "dead-letter queue (none configured, or it does not exist), as applied on this node.",
            ("queue", "reason"),
        )
        self.connections_opened = Counter(
            "quorumq_client_connections_opened",
            "Client connections authenticated by this node.",
            registry=r,
        )
        self.fsync_seconds = Histogram(
            "quorumq_raft_fsync_seconds",
            "Time of one journal fsync (msync + fsync) on this node.",
            buckets=FSYNC_BUCKETS,
            registry=r,
        )
        self.apply_seconds = Histogram(
            "quorumq_raft_apply_seconds",
            "Time to apply one log entry to the state machine on this node.",
            buckets=APPLY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "quorumq_group_commit_batch_size",
            "Commands per log entry submitted by this node (group commit batches).",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        r.register(cast("Collector", _StateCollector(self)))

    # --- hooks ----------------------------------------------------------------------------

    def label(self, queue: str) -> str:
        """`queue`, or `_other` once QUEUES_LABELLED_MAX queues have series."""
        if queue in self._labelled:
            return queue
        with self._labelled_lock:
            if len(self._labelled) >= QUEUES_LABELLED_MAX:
                return OTHER_QUEUE
            self._labelled.add(queue)
        return queue

    def count(self, command: Any, sink: Sink) -> Sink:
        kind = type(command)
        kind = UNBOUND_SETTLES.get(kind, kind)  # a BoundSettle counts as a Settle (issue 31)
        if kind is Enqueue:
            counter, amount = self.published, 1
        elif kind is Settle:
            counter, amount = self.acked, len(command.msg_ids)
        elif kind is Return:
            counter, amount = self.returned, len(command.msg_ids)
        elif kind is Discard:
            counter, amount = self.rejected, len(command.msg_ids)
        elif kind is Modify:
            counter = self.rejected if command.undeliverable_here else self.returned
            amount = len(command.msg_ids)
        elif kind is Checkout and type(command.spec).__name__ == "Dequeue":
            return self._count_dequeue(command.queue, sink)
        else:
            return sink
        series = counter.labels(self.label(command.queue))

        def counted(reply: Any) -> None:
            if type(reply) is Ok:
                series.inc(amount)
            sink(reply)

        return counted

    def _count_dequeue(self, queue: str, sink: Sink) -> Sink:
        series = self.delivered.labels(self.label(queue))

        def counted(reply: Any) -> None:
            if isinstance(reply, DequeueOk) and reply.message is not None:
                series.inc()
            sink(reply)

        return counted

    def on_outcome(self, outcome: Outcome, mine: bool) -> None:
        for effect in outcome.effects:
            if type(effect) is Deliver or type(effect) is RefDeliver:  # v4: by reference
                if effect.connection.node == self.node_id:
                    self.delivered.labels(self.label(effect.queue)).inc(len(effect.messages))
            elif type(effect) is DeadLettered:
                queue = self.label(effect.queue)
                self.dead_lettered.labels(queue, effect.reason).inc(effect.count)
                if effect.target is None:
                    self.dropped.labels(queue, effect.reason).inc(effect.count)
        if mine and outcome.replies:
            self.batch_size.observe(len(outcome.replies))

    def connection_opened(self) -> None:
        self.connections_opened.inc()

    def observe_fsync(self, seconds: float) -> None:
        """Raft hook: one journal fsync took `seconds`."""
        self.fsync_seconds.observe(seconds)

    def observe_apply(self, seconds: float) -> None:
        """Raft hook: applying one entry took `seconds`."""
        self.apply_seconds.observe(seconds)

    # --- serving ----------------------------------------------------------------------------

    def start(self) -> None:
        from prometheus_client import start_http_server

        self._replica().observe_io(self.observe_fsync, self.observe_apply)
        if self.port is None:  # counted for the management API only, which serves /metrics
            return
        try:
            self._server, _thread = start_http_server(self.port, self.bind, self.registry)
        except OSError as err:
            raise MetricsUnavailable(
                f"cannot serve metrics on {self.bind}:{self.port}: {err}"
            ) from err
        log_address("metrics", socket_address(self._server.server_address), tls=False)

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


class _StateCollector:
    """Gauges read at scrape time: queues from the replica, raft status, connections (a
    prometheus-client collector by duck typing: it needs `collect`, and `describe`)."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return list(self._families().values())

    def collect(self) -> Iterator[Metric]:
        replica = self.metrics._replica()
        status = replica.status(with_digest=False)
        overviews = replica.read(_overviews)
        families = self._families()
        ready, returned, unacked, total, ready_bytes, unacked_bytes, consumers = (
            families[name]
            for name in (
                "quorumq_queue_messages_ready",
                "quorumq_queue_messages_returned_ready",
                "quorumq_queue_messages_unacked",
                "quorumq_queue_messages",
                "quorumq_queue_messages_ready_bytes",
                "quorumq_queue_messages_unacked_bytes",
                "quorumq_queue_consumers",
            )
        )
        sums: dict[str, list[int]] = {}
        for o in overviews:
            if o is None:
                continue
            row = [
                o.ready + o.returned,
                o.returned,
                o.checked_out,
                o.total,
                o.bytes,
                o.checked_out_bytes,
                o.consumers,
            ]
            label = self.metrics.label(o.name)
            previous = sums.get(label)
            sums[label] = (
                row if previous is None else [a + b for a, b in zip(previous, row, strict=True)]
            )
        for label, row in sums.items():
            for family, value in zip(
                (ready, returned, unacked, total, ready_bytes, unacked_bytes, consumers),
                row,
                strict=True,
            ):
                family.add_metric([label], value)
        families["quorumq_queues"].add_metric([], len(overviews))
        families["quorumq_raft_term"].add_metric([], status["term"])
        families["quorumq_raft_log_commit_index"].add_metric([], status["commit_index"])
        families["quorumq_raft_log_last_applied_index"].add_metric([], status["last_applied"])
        families["quorumq_raft_log_entries"].add_metric([], status["log_len"])
        families["quorumq_raft_is_leader"].add_metric([], int(status["role"] == "leader"))
        families["quorumq_raft_has_quorum"].add_metric([], int(bool(status["has_quorum"])))
        families["quorumq_raft_leader"].add_metric([str(status["leader"] or "")], 1)
        families["quorumq_machine_version"].add_metric([], status["effective_machine_version"])
        families["quorumq_client_connections"].add_metric([], self.metrics._connections())
        _add_node_gauges(families, self.metrics._node_status())
        yield from families.values()
        yield from _role_change_families(status.get("role_changes") or {})
        yield _clock_steps_family(replica.clock_steps_rejected())

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily]:
        from prometheus_client.core import GaugeMetricFamily

        queue_gauges = {
            "quorumq_queue_messages_ready": "Messages ready for delivery (returned ones included).",
            "quorumq_queue_messages_returned_ready": "Returned messages waiting (delivered first).",
            "quorumq_queue_messages_unacked": "Messages checked out to consumers, not settled.",
            "quorumq_queue_messages": "Messages in the queue: ready + checked out.",
            "quorumq_queue_messages_ready_bytes": "Body bytes of the ready messages.",
            "quorumq_queue_messages_unacked_bytes": "Body bytes of the checked-out messages.",
            "quorumq_queue_consumers": "Consumers attached to the queue.",
        }
        families = {
            name: GaugeMetricFamily(name, doc, labels=["queue"])
            for name, doc in queue_gauges.items()
        }
        plain = {
            "quorumq_queues": "Queues in the state machine.",
            "quorumq_raft_term": "This node's current Raft term.",
            "quorumq_raft_log_commit_index": "The highest log index known committed.",
            "quorumq_raft_log_last_applied_index": "The last log index applied to the machine.",
            "quorumq_raft_log_entries": "Entries in this node's Raft log (since the snapshot).",
            "quorumq_raft_is_leader": "1 if this node is the Raft leader.",
            "quorumq_raft_has_quorum": "1 if this node sees a quorum.",
            "quorumq_machine_version": "The effective state-machine version.",
            "quorumq_client_connections": "Client connections open on this node.",
            **{name: doc for name, (_field, _scale, doc) in NODE_GAUGES.items()},
        }
        families.update({name: GaugeMetricFamily(name, doc) for name, doc in plain.items()})
        families["quorumq_raft_leader"] = GaugeMetricFamily(
            "quorumq_raft_leader",
            "The leader this node knows (its id as label): 1.",
            labels=["leader"],
        )
        return families


def _add_node_gauges(families: dict[str, GaugeMetricFamily], status: dict[str, Any]) -> None:
    """The gauges read from the server's status fields (those it reports)."""
    for name, (status_field, scale, _doc) in NODE_GAUGES.items():
        value = status.get(status_field)
        if value is not None:
            families[name].add_metric([], float(value) * scale)


def _overviews(view: ReplicaView) -> list[Any]:
    """Every queue's overview (read under the replica's apply lock)."""
    return [fifo.overview(view.state, queue) for queue in fifo.list_queues(view.state)]


def _role_change_families(changes: dict[str, int]) -> list[Metric]:
    """This node's role changes by `from` and `to` (raft.roles), and the elections it started
    (its changes to candidate), as counters."""
    from prometheus_client.core import CounterMetricFamily

    by_change = CounterMetricFamily(
        "quorumq_raft_role_changes",
        "Role changes of this node since it started (each logged as role_changed with its cause).",
        labels=["from", "to"],
    )
    elections = CounterMetricFamily(
        "quorumq_raft_elections", "Elections this node started (its changes to candidate)."
    )
    for change, count in sorted(changes.items()):
        before, _, after = change.partition("->")
        by_change.add_metric([before, after], count)
    elections.add_metric([], sum(n for c, n in changes.items() if c.endswith("->candidate")))
    return [by_change, elections]


def _clock_steps_family(rejected: dict[str, int]) -> Metric:
    """The rejected wall-clock steps by the node whose clock stepped, as a counter."""
    from prometheus_client.core import CounterMetricFamily

    family = CounterMetricFamily(
        "quorumq_clock_steps_rejected",
        "Episodes of a node's wall clock off the machine's time by more than the bound, not "
        "followed (raft.machine_clock; each logged once as clock_step_rejected), as applied here.",
        labels=["node"],
    )
    for node, count in sorted(rejected.items()):
        family.add_metric([node], count)
    return family
