"""The consumer-group chaos workload (`scripts/chaos.py --workload groups`): its parameters and
whether the cluster's machine can run it.

Members of one group consume a partitioned queue (`queue.0` .. `queue.{P-1}`), recording every
delivery with the partition as `queue` and the member as `process`, and the `assigned` /
`revoked` notices they see; a member-crash actor kills members (no LeaveGroup: the machine
ends them on connection down) and starts replacements. The run's report adds the group checks
of `cluster.chaos.groups` (double ownership, per-partition order, crash-to-recovery time).
"""

from __future__ import annotations

from dataclasses import dataclass

import fifo.commands


@dataclass(frozen=True, slots=True)
class GroupParams:
    """Bounds of the group workload."""

    group: str = "chaos-group"
    queue: str = "chaos-orders"
    partitions: int = 8
    members: int = 3
    member_crash_every_s: float = 10.0  # a member is killed this often (0: never)
    prefetch: int = 10

    def partition_queues(self) -> tuple[str, ...]:
        """The member queues of the partitioned queue."""
        return tuple(f"{self.queue}.{i}" for i in range(self.partitions))


def unavailable_reason() -> str | None:
    """Why the group workload cannot run with this code, or None when it can."""
    if not hasattr(fifo.commands, "JoinGroup"):
        return "the state machine has no consumer groups yet (machine v3's JoinGroup)"
    return None
