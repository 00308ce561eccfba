"""The consumer-group chaos workload (`scripts/chaos.py --workload groups`).

Producers publish to the partitioned queue's base name (`queue`), and the machine routes each
message: most carry a partition key (`publish(..., group=key)`, a seeded pick from a small key
space shared by every producer, recorded as the publish's `key`) and go to
`partition_of(key, P)`; the rest have none and go round robin. After a publish with an unknown
outcome a producer resends the same message (same enqueuer, seq, body and key) from a fresh
client, up to `resend_max` times, so the machine's publisher dedup over the whole partitioned
queue is exercised: the message must be stored at most once, even when round robin would pick
another partition for the resend. Then it retires the enqueuer and goes on with a fresh one.

Members of one group consume a partitioned queue (`queue.0` .. `queue.{P-1}`), recording every
delivery with the partition as `queue` and the member incarnation as `process`, and the
`assigned` / `revoked` notices they see. Now and then (seeded) one member crashes: between two
messages it records `crash` and drops its connection without leaving or settling (the machine
ends it on connection down and returns its messages), then comes back as a new member. The
report adds the group checks of `cluster.chaos.groups` (double ownership, per-partition order,
routing by key, per-key order, duplicates after dedup, crash-to-recovery time).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import cast

from cluster import protocol
from cluster.chaos.history import EventType, Recorder
from cluster.chaos.workload import Acker, ClientFactory, Producer, Worker, WorkloadParams
from cluster.client import Client, Publisher
from cluster.client._wire import encode_enqueue
from cluster.client.consumer import Consumer
from cluster.client.errors import ClusterError
from cluster.client.groups import GroupConsumer, declare_partitioned_queue, join_group
from cluster.client.sansio import UNCERTAIN
from fifo.codec import decode
from fifo.commands import QueueConfig
from fifo.replies import Error, NotEnqueued, Ok

GROUPS_MACHINE_VERSION = 3
RETRY_PAUSE_S = 0.2
REJOIN_PAUSE_S = 1.0


@dataclass(frozen=True, slots=True)
class GroupParams:
    """Bounds of the group workload."""

    group: str = "chaos-group"
    queue: str = "chaos-orders"
    partitions: int = 8
    members: int = 3
    member_crash_every_s: float = 10.0  # a member crashes this often (0: never)
    prefetch: int = 10
    keys: int = 32  # the key space every producer picks partition keys from
    keyless_fraction: float = 0.2  # this share of publishes has no key (round robin)
    resend_max: int = 3  # resends of one message after unknown outcomes, then a new enqueuer

    def __post_init__(self) -> None:
        if not 1 <= self.partitions <= 64:
            raise ValueError(f"partitions must be 1..64, not {self.partitions}")
        if not 1 <= self.keys <= 100_000:
            raise ValueError(f"keys must be 1..100000, not {self.keys}")
        if not 0.0 <= self.keyless_fraction <= 1.0:
            raise ValueError(f"keyless_fraction must be 0..1, not {self.keyless_fraction}")
        if not 0 <= self.resend_max <= 100:
            raise ValueError(f"resend_max must be 0..100, not {self.resend_max}")

    def partition_queues(self) -> tuple[str, ...]:
        """The member queues of the partitioned queue."""
        return tuple(f"{self.queue}.{i}" for i in range(self.partitions))


def unavailable_reason() -> str | None:
    """Why the group workload cannot run with this code, or None when it can."""
    import fifo.commands

    if not hasattr(fifo.commands, "JoinGroup"):
        return "the state machine has no consumer groups yet (machine v3's JoinGroup)"
    return None


def declare(
    client: Client,
    params: GroupParams,
    timeout_s: float = 30.0,
    disconnected_timeout_ms: int | None = None,
) -> None:
    """Create the partitioned queue, once the cluster runs machine v3 (a new cluster upgrades
    itself as soon as every node supports it); `disconnected_timeout_ms`: its partitions'."""
    deadline = time.monotonic() + timeout_s
    while int(str(client.machine().get("effective_version", 0))) < GROUPS_MACHINE_VERSION:
        if time.monotonic() > deadline:
            raise ClusterError(f"the machine did not reach v{GROUPS_MACHINE_VERSION}")
        time.sleep(0.2)
    config = None
    if disconnected_timeout_ms is not None:
        config = QueueConfig(
            single_active_consumer=True, disconnected_timeout_ms=disconnected_timeout_ms
        )
    declare_partitioned_queue(client, params.queue, params.partitions, config)


class GroupProducer(Producer):
    """A producer to the base name, keyed or not (a seeded pick), that resends a message after
    an unknown outcome (see the module doc)."""

    def __init__(
        self,
        index: int,
        factory: ClientFactory,
        recorder: Recorder,
        stop: threading.Event,
        groups: GroupParams,
        workload: WorkloadParams,
        run_id: str,
        seed: int,
    ) -> None:
        super().__init__(index, groups.queue, factory, recorder, stop, workload, run_id)
        self.groups = groups
        self.rng = random.Random(f"{seed}-{index}")
        self.resends = 0

    def _key(self) -> str | None:
        if self.rng.random() < self.groups.keyless_fraction:
            return None
        return f"key-{self.rng.randrange(self.groups.keys)}"

    def _send(
        self, publisher: Publisher, process: str, enqueuer: str, seq: int, value: str
    ) -> EventType:
        key = self._key()
        outcome = self._publish_one(publisher, process, enqueuer, seq, value, key)
        if outcome == "info":
            self._resend(process, enqueuer, seq, value, key)
        return outcome

    def _resend(self, process: str, enqueuer: str, seq: int, value: str, key: str | None) -> None:
        """Send the same (enqueuer, seq, body, key) again from fresh clients until an outcome
        is known or `resend_max` attempts are spent; dedup must store it at most once."""
        command = encode_enqueue(self.queue, value.encode(), enqueuer, seq, None, key)
        for attempt in range(1, self.groups.resend_max + 1):
            if self.stop_event.is_set():
                return
            client = self.connect(self.factory, f"chaos-{process}-resend")
            if client is None:
                continue
            self.resends += 1
            op = self.recorder.invoke(
                "publish", process, queue=self.queue, value=value, enqueuer=enqueuer,
                seq=seq, key=key, detail=f"resend {attempt}",
            )  # fmt: skip
            try:
                answer = client.call(protocol.command(0, command), self.params.confirm_timeout_s)
                outcome, detail = _resend_outcome(answer)
            except (ClusterError, OSError) as err:
                outcome, detail = "info", f"{type(err).__name__}: {err}"
            finally:
                client.close()
            self.recorder.complete(op, outcome, "publish", process, value=value, detail=detail)
            self._count(outcome, detail)
            if outcome != "info":
                return
            self.stop_event.wait(RETRY_PAUSE_S)


def _resend_outcome(answer: dict[str, object]) -> tuple[EventType, str | None]:
    """ok for Ok (stored now, or a duplicate of a stored copy: stored nowhere); unknown for a
    gap (`NotEnqueued`: the dedup state may have been evicted) or an error answering a resend;
    fail for another error reply (nothing was applied)."""
    raw = answer.get("reply")
    if not isinstance(raw, bytes):
        return "info", f"no reply bytes in {sorted(answer)}"
    reply = decode(raw)
    if isinstance(reply, Ok):
        return "ok", None
    if isinstance(reply, NotEnqueued):
        return "info", repr(reply)
    if isinstance(reply, Error):
        return ("info" if answer.get(UNCERTAIN) else "fail"), repr(reply)
    return "info", f"unexpected reply {reply!r}"


class GroupMember(Worker):
    """One member slot: joins, consumes and settles; crashes when asked and comes back."""

    def __init__(
        self,
        index: int,
        factory: ClientFactory,
        recorder: Recorder,
        stop: threading.Event,
        params: GroupParams,
        workload: WorkloadParams,
    ) -> None:
        super().__init__(f"member-{index}", recorder, stop)
        self.factory = factory
        self.params = params
        self.acker = Acker(recorder, workload.ack_timeout_s)
        self.crash_requested = threading.Event()
        self.incarnation = 0
        self.crashes = 0

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.incarnation += 1
            process = f"{self.name}.{self.incarnation}"
            client = self.connect(self.factory, f"chaos-{process}")
            if client is None:
                continue
            try:
                self._consume(client, process)
            except (ClusterError, OSError) as err:
                self._note(f"member: {type(err).__name__}: {err}")
                self.stop_event.wait(RETRY_PAUSE_S)
            finally:
                self.acker.wait()
                client.close()

    def _consume(self, client: Client, process: str) -> None:
        recorder = self.recorder

        def notice(kind: str) -> object:
            def hook(partitions: list[str]) -> None:
                for partition in partitions:
                    recorder.observe(kind, process, queue=partition)  # type: ignore[arg-type]

            return hook

        op = recorder.invoke("join", process, detail=self.params.group)
        member = join_group(
            client, self.params.group, self.params.queue, member=process,
            prefetch=self.params.prefetch, on_assign=notice("assigned"),  # type: ignore[arg-type]
            on_revoke=notice("revoked"),  # type: ignore[arg-type]
        )  # fmt: skip
        recorder.complete(op, "ok", "join", process, detail=self.params.group)
        while not self.stop_event.is_set():
            if self.crash_requested.is_set():
                self.crash_requested.clear()
                self.crashes += 1
                recorder.observe("crash", process)
                client.close()  # no LeaveGroup, nothing settled: the machine ends us
                self.stop_event.wait(REJOIN_PAUSE_S)
                return
            message = member.get(timeout_s=0.2)
            if message is not None:
                self.acker.settle(client, cast(Consumer, _Tagged(member)), message, process)
        self._leave(member, process)

    def _leave(self, member: GroupConsumer, process: str) -> None:
        self.acker.wait()
        op = self.recorder.invoke("leave", process, detail=self.params.group)
        try:
            member.leave()
            self.recorder.complete(op, "ok", "leave", process)
        except (ClusterError, OSError) as err:
            self.recorder.complete(op, "info", "leave", process, detail=str(err))


class _Tagged:
    """What `Acker.settle` reads of a consumer: its tag."""

    def __init__(self, member: GroupConsumer) -> None:
        self.tag = member.tag


class MemberCrasher(threading.Thread):
    """Asks a seeded random member to crash every `member_crash_every_s` seconds."""

    def __init__(
        self, members: list[GroupMember], params: GroupParams, seed: int, stop: threading.Event
    ) -> None:
        super().__init__(name="member-crasher", daemon=True)
        self.members = members
        self.every_s = params.member_crash_every_s
        self.rng = random.Random(seed)
        self.stop_event = stop

    def run(self) -> None:
        if self.every_s <= 0 or not self.members:
            return
        while not self.stop_event.wait(self.every_s):
            self.rng.choice(self.members).crash_requested.set()
