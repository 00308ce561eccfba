"""Consumer-group bookkeeping for machine v4 (copied from v3): members, epochs, target
assignment, hand-over.

Pure and deterministic (no set or foreign-dict iteration); the state classes (`ConsumerGroup`,
`Membership`) live in `fifo.state`. The machine (`fifo.v4.partitioned`) owns the partition
queues and their consumers; this module decides who should own which partition and in what
order ownership may change, as a list of actions the machine carries out:

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

from fifo.commands import ConnectionId, Credited, SimplePrefetch
from fifo.state import ConsumerGroup, Membership
from fifo.v4.sticky import assign, moves


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


def join(
    group: ConsumerGroup,
    member: str,
    connection: ConnectionId | None,
    spec: SimplePrefetch | Credited | None,
    index: int,
    tag: str = "",
) -> tuple[int, list[Action]]:
    """Add a member (last in join order) and rebalance; returns its epoch and the actions.

    The caller checks that `member` is not already in the group.
    """
    if member in group.members:
        raise ValueError(f"{member!r} is already a member of {group.name!r}")
    group.epoch += 1
    group.members[member] = Membership(
        member, group.next_join_seq, group.epoch, connection, spec, tag
    )
    group.next_join_seq += 1
    return group.epoch, rebalance(group, index)


def leave(group: ConsumerGroup, member: str, index: int) -> list[Action]:
    """Remove a member (leave, connection or node down) and rebalance.

    Its partitions are revoked; they go to their new member once `released`.
    """
    return leave_all(group, [member], index)


def leave_all(group: ConsumerGroup, members: list[str], index: int) -> list[Action]:
    """Remove several members at once (a node down) and rebalance once."""
    for member in members:
        del group.members[member]
    return rebalance(group, index)


def rebalance(group: ConsumerGroup, index: int) -> list[Action]:
    """Recompute the target from the current one; revoke what moves, grant what is free.

    A partition already revoked (still draining) is not revoked twice, unless its holder has
    just left (then its messages come back at once); if the new target gives it back to its
    draining holder, the holder is granted it again.
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
        departed = holder not in group.members  # its messages come back at once: revoke now
        if holder != wanted and (partition not in group.revoking or departed):
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
    # every other targeted partition already has a holder (granted when it became free)
    member = group.target.get(partition)
    if member is None:
        return []
    group.holder[partition] = member
    return [Grant(member, partition, group.members[member].epoch)]


def _grant_free(group: ConsumerGroup) -> list[Action]:
    actions: list[Action] = []
    for partition in group.partitions:
        member = group.target.get(partition)
        if member is not None and partition not in group.holder:
            group.holder[partition] = member
            actions.append(Grant(member, partition, group.members[member].epoch))
    return actions
