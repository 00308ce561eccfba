"""The consumer-group chaos workload (`scripts/chaos.py --workload groups`).

Members of one group consume a partitioned queue (`queue.0` .. `queue.{P-1}`), recording every
delivery with the partition as `queue` and the member incarnation as `process`, and the
`assigned` / `revoked` notices they see. Now and then (seeded) one member crashes: between two
messages it records `crash` and drops its connection without leaving or settling (the machine
ends it on connection down and returns its messages), then comes back as a new member. The
report adds the group checks of `cluster.chaos.groups` (double ownership, per-partition order,
crash-to-recovery time).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import cast

from cluster.chaos.history import Recorder
from cluster.chaos.workload import Acker, ClientFactory, Worker, WorkloadParams
from cluster.client import Client
from cluster.client.consumer import Consumer
from cluster.client.errors import ClusterError
from cluster.client.groups import GroupConsumer, declare_partitioned_queue, join_group

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

    def partition_queues(self) -> tuple[str, ...]:
        """The member queues of the partitioned queue."""
        return tuple(f"{self.queue}.{i}" for i in range(self.partitions))


def unavailable_reason() -> str | None:
    """Why the group workload cannot run with this code, or None when it can."""
    import fifo.commands

    if not hasattr(fifo.commands, "JoinGroup"):
        return "the state machine has no consumer groups yet (machine v3's JoinGroup)"
    return None


def declare(client: Client, params: GroupParams, timeout_s: float = 30.0) -> None:
    """Create the partitioned queue, once the cluster runs machine v3 (a new cluster upgrades
    itself as soon as every node supports it)."""
    deadline = time.monotonic() + timeout_s
    while int(str(client.machine().get("effective_version", 0))) < GROUPS_MACHINE_VERSION:
        if time.monotonic() > deadline:
            raise ClusterError(f"the machine did not reach v{GROUPS_MACHINE_VERSION}")
        time.sleep(0.2)
    declare_partitioned_queue(client, params.queue, params.partitions)


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
