"""Consumer-group bookkeeping for machine v3: members, epochs, target assignment, hand-over.

Pure and deterministic (standard library and `sticky` only, no set or foreign-dict iteration),
written to move into `fifo/v3/` unchanged. The machine owns the partition queues and their
consumers; this module decides who should own which partition and in what order ownership may
change, as a list of actions the machine carries out:

- `Revoke(member, partition)`: stop delivering that partition to that member at once. The
  machine calls `released` when the member has no checked-out message of the partition left
  (settled, or returned because the member left or its connection went down).
- `Grant(member, partition)`: the member becomes the partition's only active consumer.

A partition is granted only when nobody holds it (revoke, then release, then grant), so no two
members are ever active on one partition. The target assignment is `sticky.assign` over the
members in join order, recomputed on every membership change and unchanged otherwise.
Each membership gets an epoch (the group's epoch when it joined, increasing): a command naming
an older incarnation of a member is stale and fenced.
"""

from __future__ import annotations

from dataclasses import dataclass

from .sticky import assign, moves


@dataclass(frozen=True, slots=True)
class Revoke:
    """Stop delivering `partition` to `member` now; call `released` once it holds none."""

    member: str
    partition: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Grant:
    """`member` becomes the only active consumer of `partition`."""

    member: str
    partition: str
    epoch: int


Action = Revoke | Grant


class Membership:
    """One member: its join position, the epoch of this incarnation, its connection and the
    checkout spec (prefetch or credit) of its consumers."""

    __slots__ = ("connection", "epoch", "join_seq", "member", "spec")

    def __init__(
        self, member: str, join_seq: int, epoch: int, connection: object, spec: object = None
    ) -> None:
        self.member = member
        self.join_seq = join_seq
        self.epoch = epoch
        self.connection = connection
        self.spec = spec


class ConsumerGroup:
    """A consumer group over the partitions of one partitioned queue."""

    __slots__ = (
        "epoch",
        "holder",
        "last_moves",
        "last_reassigned",
        "last_rebalance_index",
        "members",
        "name",
        "next_join_seq",
        "partitions",
        "queue",
        "revoking",
        "target",
    )

    def __init__(self, name: str, queue: str, partitions: tuple[str, ...]) -> None:
        self.name = name
        self.queue = queue
        self.partitions = partitions
        self.members: dict[str, Membership] = {}  # insertion order = join order
        self.next_join_seq = 0
        self.epoch = 0  # bumped by every rebalance that changes the target, and every join
        self.target: dict[str, str] = {}  # partition -> member it should go to
        self.holder: dict[str, str] = {}  # partition -> member active or draining on it
        self.revoking: dict[str, str] = {}  # partition -> its holder, told to stop (draining)
        self.last_rebalance_index = 0
        self.last_moves = 0  # partitions taken from a member still in the group
        self.last_reassigned = 0  # partitions whose member changed (the departed's included)

    def member_order(self) -> list[str]:
        """Member ids in join order."""
        return list(self.members)

    def assignment(self) -> dict[str, tuple[str, ...]]:
        """The target as member -> partitions (in partition order), members in join order (a
        member that left since the last rebalance comes last)."""
        out: dict[str, list[str]] = {member: [] for member in self.members}
        for partition in self.partitions:
            member = self.target.get(partition)
            if member is not None:
                out.setdefault(member, []).append(partition)
        return {member: tuple(held) for member, held in out.items()}

    def held_by(self, member: str) -> tuple[str, ...]:
        """The partitions `member` is active or draining on, in partition order."""
        return tuple(p for p in self.partitions if self.holder.get(p) == member)

    def pending(self) -> tuple[str, ...]:
        """Partitions whose holder is not (yet) their target: a hand-over is under way."""
        return tuple(p for p in self.partitions if self.holder.get(p) != self.target.get(p))

    def is_stale(self, member: str, epoch: int) -> bool:
        """True when (member, epoch) is not the member's current incarnation."""
        current = self.members.get(member)
        return current is None or current.epoch != epoch


def join(
    group: ConsumerGroup, member: str, connection: object, spec: object, index: int
) -> tuple[int, list[Action]]:
    """Add a member (last in join order) and rebalance; returns its epoch and the actions.

    The caller checks that `member` is not already in the group.
    """
    if member in group.members:
        raise ValueError(f"{member!r} is already a member of {group.name!r}")
    group.epoch += 1
    group.members[member] = Membership(member, group.next_join_seq, group.epoch, connection, spec)
    group.next_join_seq += 1
    return group.epoch, rebalance(group, index)


def leave(group: ConsumerGroup, member: str, index: int) -> list[Action]:
    """Remove a member (leave, connection or node down, timeout) and rebalance.

    Its partitions are revoked; they go to their new member once `released`.
    """
    del group.members[member]
    return rebalance(group, index)


def rebalance(group: ConsumerGroup, index: int) -> list[Action]:
    """Recompute the target from the current one; revoke what moves, grant what is free.

    A partition already revoked (still draining) is not revoked twice; if the new target gives
    it back to its draining holder, the holder is granted it again.
    """
    previous = group.assignment()
    new = assign(group.partitions, group.member_order(), previous) if group.members else {}
    target = {partition: member for member, held in new.items() for partition in held}
    if new != previous:
        group.last_moves = moves(previous, new)
        group.last_reassigned = sum(
            1 for partition, member in group.target.items() if target.get(partition) != member
        )
        group.last_rebalance_index = index
        group.epoch += 1
    group.target = target
    actions: list[Action] = []
    for partition in group.partitions:
        holder = group.holder.get(partition)
        if holder is None:
            continue
        wanted = group.target.get(partition)
        if holder != wanted and partition not in group.revoking:
            group.revoking[partition] = holder
            actions.append(Revoke(holder, partition, group.epoch))
        elif holder == wanted and partition in group.revoking:
            del group.revoking[partition]
            actions.append(Grant(holder, partition, group.members[holder].epoch))
    actions += _grant_free(group)
    return actions


def released(group: ConsumerGroup, partition: str) -> list[Action]:
    """The draining holder of `partition` holds no message of it any more: hand it over."""
    if partition not in group.revoking:
        raise ValueError(f"{partition!r} is not being revoked")
    del group.revoking[partition]
    del group.holder[partition]
    return _grant_free(group)


def _grant_free(group: ConsumerGroup) -> list[Action]:
    actions: list[Action] = []
    for partition in group.partitions:
        member = group.target.get(partition)
        if member is not None and partition not in group.holder:
            group.holder[partition] = member
            actions.append(Grant(member, partition, group.members[member].epoch))
    return actions
