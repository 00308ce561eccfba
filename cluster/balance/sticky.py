"""The server-side sticky assignment: balanced, minimal moves, deterministic (ties by join order).

A pure function of (queues, members in join order, previous assignment): no hashing, no set
iteration, so every replica computes the same result. It is meant to move unchanged into machine
v3's consumer groups. Rules: counts differ by at most one; the `+1` slots go first to members that
already hold more than the floor (most first), then by join order; each member keeps the queues it
owned up to its cap (in queue order); freed and new queues go, in queue order, to members under
their cap in join order. This keeps the most queues possible among balanced assignments, and an
assignment that is already balanced is returned unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Assignment = dict[str, tuple[str, ...]]


def assign(
    queues: Sequence[str],
    members: Sequence[str],
    previous: Mapping[str, Sequence[str]] | None = None,
) -> Assignment:
    """Assign every queue to one member; `members` in join order, `queues` in a stable order."""
    if len(set(members)) != len(members):
        raise ValueError("members must be distinct")
    if len(set(queues)) != len(queues):
        raise ValueError("queues must be distinct")
    if not members:
        return {}
    owned = _still_owned(queues, members, previous or {})
    caps = _caps(len(queues), members, owned)
    out: dict[str, list[str]] = {m: owned[m][: caps[m]] for m in members}
    taken = {q for kept in out.values() for q in kept}
    free = iter([q for q in queues if q not in taken])
    for m in members:
        while len(out[m]) < caps[m]:
            out[m].append(next(free))
    index = {q: i for i, q in enumerate(queues)}
    return {m: tuple(sorted(out[m], key=index.__getitem__)) for m in members}


def _still_owned(
    queues: Sequence[str], members: Sequence[str], previous: Mapping[str, Sequence[str]]
) -> dict[str, list[str]]:
    """Each member's previous queues that still exist, in queue order; a queue claimed twice
    stays with the earlier-joined member."""
    claimed: dict[str, str] = {}
    for m in members:
        for q in previous.get(m, ()):
            claimed.setdefault(q, m)
    owned: dict[str, list[str]] = {m: [] for m in members}
    for q in queues:
        holder = claimed.get(q)
        if holder is not None:
            owned[holder].append(q)
    return owned


def _caps(
    queue_count: int, members: Sequence[str], owned: Mapping[str, list[str]]
) -> dict[str, int]:
    floor, extra = divmod(queue_count, len(members))
    caps = dict.fromkeys(members, floor)
    join = {m: i for i, m in enumerate(members)}
    for m in sorted(members, key=lambda m: (-len(owned[m]), join[m])):
        if extra and len(owned[m]) > floor:
            caps[m] += 1
            extra -= 1
    for m in members:
        if extra and caps[m] == floor:
            caps[m] += 1
            extra -= 1
    return caps


def moves(previous: Mapping[str, Sequence[str]], current: Mapping[str, Sequence[str]]) -> int:
    """Queues whose previous owner is still a member and now owns it no longer."""
    owner = {q: m for m, qs in current.items() for q in qs}
    return sum(1 for m, qs in previous.items() if m in current for q in qs if owner.get(q, m) != m)
