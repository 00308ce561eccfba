"""Issue 24: a node that applies entries late (paused, cut off) must not deliver what later
committed entries took away from its consumers. One test per path, each driven step by step:
the fault, the committed entries that supersede the lagging node's deliveries (waited for), the
heal, then a barrier: a marker message delivered on the same client connection after the node is
current again. Every delivery on that connection before the marker has arrived by then."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cluster.client import Client
from cluster.client.consumer import Consumer, Message
from cluster.client.errors import CommandRefused
from cluster.client.groups import declare_partitioned_queue, join_group, partition_of
from cluster.launcher import LocalCluster, start_cluster, wait_until
from fifo.commands import QueueConfig, Settle
from tests.background import Background
from tests.cluster.proxied import cluster_behind_proxies

pytestmark = pytest.mark.cluster

MESSAGES = 20
SILENCE_S = 60.0  # the clients must outlive every fault of these tests on their connection
WAIT_S = 30.0


@dataclass
class Acker:
    """A consumer that acks everything it gets and remembers what was acked ok, and which of
    those it got as a redelivery (taken back from the consumer that held it first)."""

    consumer: Consumer
    acked: set[str] = field(default_factory=set)
    redelivered: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        """Ack on a thread until the consumer's client is closed (`get` then answers None)."""
        threading.Thread(target=self._run, name="late-deliveries-acker", daemon=True).start()

    def _run(self) -> None:
        while (message := self.consumer.get(timeout_s=None)) is not None:
            message.ack()
            self.consumer.flush_acks()
            with self.lock:
                self.acked.add(message.body.decode())
                if taken_back(message):
                    self.redelivered.add(message.body.decode())

    def has_acked(self, values: set[str]) -> bool:
        with self.lock:
            return values <= self.acked

    def acked_now(self) -> set[str]:
        with self.lock:
            return set(self.acked)

    def redelivered_now(self) -> set[str]:
        with self.lock:
            return set(self.redelivered)


def taken_back(message: Message) -> bool:
    """Whether `message` was delivered before (to another consumer, which lost it)."""
    return message.redelivered or message.delivery_count > 0


def assert_held_by_the_lagging_consumer(redelivered: set[str], values: set[str]) -> None:
    """The scenario happened: some of `values` were first delivered to the lagging node's
    consumer (its node down or paused), taken back, and redelivered to the other one; without
    that, "nothing late" would check nothing."""
    assert redelivered & values, (
        "no message was held by the lagging consumer and taken back: the scenario did not happen"
    )


def wait_for_consumers(client: Client, queue: str, count: int) -> None:
    """Wait until `client`'s node lists `count` consumers of `queue` (each gets a share)."""
    wait_until(lambda: len(client.consumers(queue).get(queue, [])) >= count, WAIT_S,
               f"{count} consumers of {queue}")  # fmt: skip


@dataclass
class Recorder:
    """Records every message handed to the application (never acks)."""

    got: list[str] = field(default_factory=list)

    def __call__(self, message: Message) -> None:
        self.got.append(message.body.decode())


def client_on(cluster: LocalCluster, node: str, name: str) -> Client:
    """A client of `node` alone, patient enough to wait out a fault on its node."""
    return cluster.client(node, only=True, name=name, silence_timeout_s=SILENCE_S,
                          request_timeout_s=WAIT_S)  # fmt: skip


def publish_all(client: Client, queue: str, values: list[str], group: str | None = None) -> None:
    """Publish every value (pipelined) and wait for the confirms."""
    with client.publisher(queue, window=len(values)) as publisher:
        for value in values:
            publisher.publish(value.encode(), group=group)
        publisher.wait_for_confirms(WAIT_S)


def marker_barrier(lagging_client: Client, publisher: Client) -> None:
    """A marker reaches `lagging_client`: its node is current and every frame it sent the
    client before has arrived."""
    marker = lagging_client.consume("marker", prefetch=1)
    publish_all(publisher, "marker", ["marker"])
    message = marker.get(timeout_s=WAIT_S)
    assert message is not None and message.body == b"marker"


def assert_nothing_late(
    lagging_client: Client,
    publisher: Client,
    delivered: Callable[[], int],
    before: int,
    acked: set[str],
) -> None:
    """The barrier (`marker_barrier`); by then the lagging consumer got nothing new
    (`delivered()` still `before`): everything it held was taken back and acked by another
    consumer."""
    marker_barrier(lagging_client, publisher)
    late = delivered() - before
    assert late == 0, f"{late} deliveries of messages another consumer acked ({len(acked)})"


@pytest.fixture
def cluster3_paused(tmp_path: Path) -> Iterator[LocalCluster]:
    """A 3-node cluster; every node is resumed (SIGCONT) before it is stopped."""
    cluster = start_cluster(tmp_path / "D", nodes=3)
    try:
        yield cluster
    finally:
        for node in cluster.config.node_ids():
            with contextlib.suppress(Exception):  # a node that is gone needs no resume
                cluster.kill(node, signal.SIGCONT)
        cluster.stop()


def paused_follower_scenario(
    cluster: LocalCluster, config: QueueConfig, consumer_timeout_ms: int | None
) -> None:
    """A consumer on a follower that is paused while messages are assigned to it; the leader
    takes them back (consumer timeout or disconnected timeout) and another consumer acks them;
    the follower is resumed and catches up: its consumer must get none of them."""
    leader = cluster.leader()
    follower = next(n for n in cluster.config.node_ids() if n != leader)
    with client_on(cluster, leader, "admin") as admin:
        admin.declare_queue("late", config)
        admin.declare_queue("marker")
    with client_on(cluster, follower, "lagging") as lagging, \
            client_on(cluster, leader, "current") as current:  # fmt: skip
        recorder = Recorder()
        lagging_consumer = lagging.consume(
            "late", prefetch=MESSAGES, timeout_ms=consumer_timeout_ms, on_message=recorder
        )
        acker = Acker(current.consume("late", prefetch=MESSAGES * 2))
        acker.start()
        wait_for_consumers(current, "late", 2)  # the leader shares the messages out to both
        values = [f"m{i}" for i in range(MESSAGES)]
        cluster.kill(follower, signal.SIGSTOP)
        publish_all(current, "late", values)  # about half are assigned to the paused consumer
        wait_until(lambda: acker.has_acked(set(values)), WAIT_S, "every message acked")
        assert_held_by_the_lagging_consumer(acker.redelivered_now(), set(values))
        cluster.kill(follower, signal.SIGCONT)
        assert_nothing_late(lagging, current, lambda: lagging_consumer.delivered, 0, set(values))
        assert recorder.got == []


def test_a_paused_follower_does_not_deliver_what_a_consumer_timeout_took_back(
    cluster3_paused: LocalCluster,
) -> None:
    """Follower paused, its consumer's messages taken back by the consumer timeout and acked
    elsewhere; resumed, it applies the entries that had assigned them: nothing is delivered."""
    paused_follower_scenario(cluster3_paused, QueueConfig(), consumer_timeout_ms=300)


def test_a_short_disconnected_timeout_does_not_let_a_paused_follower_deliver_stale(
    cluster3_paused: LocalCluster,
) -> None:
    """Plain queue, disconnected timeout 500 ms (shorter than a client's silence timeout): the
    paused follower's consumer is suspected, its messages returned and acked elsewhere; after
    the resume none of them reaches it (issue 24's stale_queue.py)."""
    config = QueueConfig(disconnected_timeout_ms=500)
    paused_follower_scenario(cluster3_paused, config, consumer_timeout_ms=None)


def test_a_former_leader_cut_off_then_healed_delivers_nothing_stale(tmp_path: Path) -> None:
    """The leader appends publishes its followers hold, but their acks never reach it (link
    proxies), then it is cut off: the majority commits them, marks the old leader's node down,
    hands its consumer's share to another consumer which acks it. Healed, the former leader
    learns they were committed and applies them: its consumer must get none of them.

    How many of the publishes reach the followers before the cut is not the test's to choose
    (the old leader appends at most a few entries without a commit, and a loaded host may see
    an election before the last): what is checked is that none the majority committed and the
    other consumer acked reaches the former leader's consumer (any the old leader still held
    are published after the heal, new messages anyone may get)."""
    with cluster_behind_proxies(tmp_path / "D") as (cluster, mesh):
        old = cluster.leader()
        others = [n for n in cluster.config.node_ids() if n != old]
        with client_on(cluster, old, "admin") as admin:
            admin.declare_queue("late", QueueConfig(disconnected_timeout_ms=500))
            admin.declare_queue("marker")
        with client_on(cluster, old, "lagging") as lagging, \
                client_on(cluster, others[0], "current") as current:  # fmt: skip
            recorder = Recorder()
            lagging_consumer = lagging.consume("late", prefetch=MESSAGES, on_message=recorder)
            acker = Acker(current.consume("late", prefetch=MESSAGES * 2))
            acker.start()
            for other in others:
                mesh.cut(other, old)  # the old leader's entries flow out, the acks never back
            values = [f"m{i}" for i in range(MESSAGES)]
            start = int((cluster.statuses()[old] or {})["log_len"])
            publishing = threading.Thread(
                target=lambda: _publish_quietly(lagging, values), daemon=True
            )
            publishing.start()
            wait_until(lambda: _followers_hold_leader_log(cluster, old, others, start), WAIT_S,
                       "the publishes in the followers' logs")  # fmt: skip
            mesh.isolate(old)
            wait_until(lambda: acker.acked_now() and _drained(current, "late"), WAIT_S,
                       "every message the majority committed acked")  # fmt: skip
            acked = acker.acked_now()
            mesh.heal()
            marker_barrier(lagging, current)
            wait_until(lambda: len(recorder.got) == lagging_consumer.delivered, WAIT_S,
                       "every delivery handed to the recorder")  # fmt: skip
            late = sorted(set(recorder.got) & acked)
            assert late == [], f"{len(late)} deliveries of messages another consumer acked"
            publishing.join(WAIT_S)


def _drained(client: Client, queue: str) -> bool:
    """Whether `queue` holds no message (ready, returned or checked out) on `client`'s node."""
    overview = client.overview(queue)
    return overview is not None and overview.total == 0


def _publish_quietly(client: Client, values: list[str]) -> None:
    """Publish from the soon cut-off leader: the confirms come only after the heal, if ever."""
    with contextlib.suppress(Exception):  # the outcome does not matter, the entries do
        publish_all(client, "late", values)


def _followers_hold_leader_log(
    cluster: LocalCluster, leader: str, others: list[str], start: int
) -> bool:
    """The leader appended past `start` and every other node holds as much of the log."""
    statuses = cluster.statuses()
    lead = statuses.get(leader)
    if lead is None or int(lead["log_len"]) <= start:
        return False
    needed = int(lead["log_len"])
    return all((s := statuses.get(n)) is not None and int(s["log_len"]) >= needed for n in others)


def test_a_group_member_on_a_paused_node_gets_nothing_of_a_partition_it_lost(
    cluster3_paused: LocalCluster,
) -> None:
    """Consumer groups (issue 24's c107 run): a member on a paused follower is assigned
    messages; the machine ends it (node down, disconnected timeout) and gives its partition to
    the other member, which acks them. Resumed, the paused node must not deliver them."""
    cluster = cluster3_paused
    leader = cluster.leader()
    follower = next(n for n in cluster.config.node_ids() if n != leader)
    with client_on(cluster, leader, "admin") as admin:
        deadline = time.monotonic() + WAIT_S  # a new cluster upgrades to machine v3 by itself
        while int(str(admin.machine()["effective_version"])) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        config = QueueConfig(single_active_consumer=True, disconnected_timeout_ms=500)
        declare_partitioned_queue(admin, "orders", 2, config)
        admin.declare_queue("marker")
    with client_on(cluster, follower, "lagging") as lagging, \
            client_on(cluster, leader, "current") as current:  # fmt: skip
        first = join_group(lagging, "g", "orders", member="lagging", prefetch=MESSAGES)
        wait_until(lambda: first.get(timeout_s=0.1) is None and len(first._assigned) == 2,
                   WAIT_S, "both partitions on the lagging member")  # fmt: skip
        second = join_group(current, "g", "orders", member="current", prefetch=MESSAGES)
        acked: set[str] = set()
        redelivered: set[str] = set()
        with Background("group-acker") as acking:
            acking.start(lambda: _ack_all(second, acked, redelivered, acking.stop), "ack")
            wait_until(lambda: first.get(timeout_s=0.1) is None and len(first._assigned) == 1,
                       WAIT_S, "one partition each")  # fmt: skip
            kept = first._assigned[0]
            key = next(f"k{i}" for i in range(100) if f"orders.{partition_of(f'k{i}', 2)}" == kept)
            values = [f"m{i}" for i in range(MESSAGES)]
            before = _delivered(first)
            cluster.kill(follower, signal.SIGSTOP)
            publish_all(current, "orders", values, group=key)  # all to the lagging member's share
            wait_until(lambda: set(values) <= acked, WAIT_S, "every message acked by the other")
            assert_held_by_the_lagging_consumer(set(redelivered), set(values))
            cluster.kill(follower, signal.SIGCONT)
            assert_nothing_late(lagging, current, lambda: _delivered(first), before, set(values))
        assert not acking.errors, acking.errors


def _delivered(member: object) -> int:
    consumers = getattr(member, "_consumers", {})
    return sum(int(consumer.delivered) for consumer in consumers.values())


def _ack_all(member: object, acked: set[str], redelivered: set[str], stop: threading.Event) -> None:
    """Ack what `member` gets until `stop`, or until it is closed (`get` then answers None at
    once: polling it would spin)."""
    while not stop.is_set():
        message = member.get(timeout_s=0.2)  # type: ignore[attr-defined]
        if message is None:
            if member.closed:  # type: ignore[attr-defined]
                return
            continue
        message.ack()
        message.consumer.flush_acks()
        if taken_back(message):
            redelivered.add(message.body.decode())
        acked.add(message.body.decode())


def test_a_settle_of_a_message_taken_back_and_acked_elsewhere_is_not_answered_ok(
    cluster3_paused: LocalCluster,
) -> None:
    """The ack side: a consumer on a paused follower holds a message; the machine takes it back
    (node down, disconnected timeout) and another consumer acks it. Resumed, the first
    consumer's settle of it settles nothing: it is refused (`fenced`), no longer `ok`."""
    cluster = cluster3_paused
    leader = cluster.leader()
    follower = next(n for n in cluster.config.node_ids() if n != leader)
    with client_on(cluster, leader, "admin") as admin:
        admin.declare_queue("late", QueueConfig(disconnected_timeout_ms=500))
    with client_on(cluster, follower, "slow") as slow, \
            client_on(cluster, leader, "fast") as fast:  # fmt: skip
        slow_consumer = slow.consume("late", prefetch=1)
        publish_all(fast, "late", ["m0"])
        taken = slow_consumer.get(timeout_s=WAIT_S)
        assert taken is not None and taken.consumer_key is not None
        acker = Acker(fast.consume("late", prefetch=1))
        acker.start()
        cluster.kill(follower, signal.SIGSTOP)
        wait_until(lambda: acker.has_acked({"m0"}), WAIT_S, "acked by the other consumer")
        cluster.kill(follower, signal.SIGCONT)
        with pytest.raises(CommandRefused) as refused:  # answered Ok before: nothing settled
            slow.command(Settle("late", taken.consumer_key, (taken.msg_id,)))
        assert refused.value.code == "fenced" and "not settled" in str(refused.value)
