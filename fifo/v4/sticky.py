"""The server-side sticky assignment: balanced, minimal moves, deterministic (ties by join order).

A pure function of (partitions, members in join order, previous assignment), standard library
only, iterating no set and no dict it did not build in a fixed order, so every replica computes
the same result: machine v4's consumer groups run it on every membership change (copied from v3).
Rules: counts differ by at most one; the `+1` slots go first to members that already hold more
than the floor (most first, then join order), then by join order; each member keeps its previous
partitions up to its cap (in partition order); freed and new partitions go, in partition order,
to members under their cap in join order. This keeps the most partitions possible among balanced
assignments (`tests/balance/test_sticky.py` checks it against a brute-force optimum), and an
assignment that is already balanced comes back unchanged.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

Partition = TypeVar("Partition", bound=Hashable)
Member = TypeVar("Member", bound=Hashable)


def assign(
    partitions: Sequence[Partition],
    members: Sequence[Member],
    previous: Mapping[Member, Sequence[Partition]] | None = None,
) -> dict[Member, tuple[Partition, ...]]:
    """Every partition to one member: `members` in join order, `partitions` in a stable order.

    `previous` may name members that left and partitions that no longer exist (both ignored).
    """
    if len(set(members)) != len(members):
        raise ValueError("members must be distinct")
    if len(set(partitions)) != len(partitions):
        raise ValueError("partitions must be distinct")
    if not members:
        return {}
    owned = _still_owned(partitions, members, previous or {})
    caps = _caps(len(partitions), members, owned)
    kept = {member: owned[member][: caps[member]] for member in members}
    taken = {partition for held in kept.values() for partition in held}
    free = iter([partition for partition in partitions if partition not in taken])
    for member in members:
        held = kept[member]
        while len(held) < caps[member]:
            held.append(next(free))
    position = {partition: index for index, partition in enumerate(partitions)}
    return {member: tuple(sorted(kept[member], key=position.__getitem__)) for member in members}


def _still_owned(
    partitions: Sequence[Partition],
    members: Sequence[Member],
    previous: Mapping[Member, Sequence[Partition]],
) -> dict[Member, list[Partition]]:
    """Each member's previous partitions that still exist, in partition order; a partition
    claimed twice stays with the earlier-joined member."""
    claimed: dict[Partition, Member] = {}
    for member in members:
        for partition in previous.get(member, ()):
            claimed.setdefault(partition, member)
    owned: dict[Member, list[Partition]] = {member: [] for member in members}
    for partition in partitions:
        holder = claimed.get(partition)
        if holder is not None:
            owned[holder].append(partition)
    return owned


def _caps(
    partition_count: int, members: Sequence[Member], owned: Mapping[Member, list[Partition]]
) -> dict[Member, int]:
    """Floor for all; the `partition_count % len(members)` extra slots first to members that
    would keep one more with it (each such slot keeps exactly one more), then by join order."""
    floor, extra = divmod(partition_count, len(members))
    caps = dict.fromkeys(members, floor)
    join = {member: index for index, member in enumerate(members)}
    for member in sorted(members, key=lambda member: (-len(owned[member]), join[member])):
        if extra and len(owned[member]) > floor:
            caps[member] += 1
            extra -= 1
    for member in members:
        if extra and caps[member] == floor:
            caps[member] += 1
            extra -= 1
    return caps


def moves(
    previous: Mapping[Member, Sequence[Partition]], current: Mapping[Member, Sequence[Partition]]
) -> int:
    """Partitions whose previous owner is still a member and no longer owns them."""
    owner = {partition: member for member, held in current.items() for partition in held}
    return sum(
        1
        for member, held in previous.items()
        if member in current
        for partition in held
        if partition in owner and owner[partition] != member
    )


def moves_lower_bound(
    partitions: Sequence[Partition],
    members: Sequence[Member],
    previous: Mapping[Member, Sequence[Partition]],
) -> int:
    """The fewest moves any balanced assignment needs: partitions still held by a remaining
    member, minus the most of them a balanced assignment can leave in place."""
    if not members:
        return 0
    owned = _still_owned(partitions, members, previous)
    floor, extra = divmod(len(partitions), len(members))
    holding = sum(len(held) for held in owned.values())
    keep = sum(min(len(held), floor) for held in owned.values())
    keep += min(extra, sum(1 for held in owned.values() if len(held) > floor))
    return holding - keep
