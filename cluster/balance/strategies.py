"""Client-side allocation strategies of RocketMQ 4 (average, average by circle, consistent hash)
and the server-side sticky one, behind one signature for the rebalance study.

Each strategy maps (queues, members in join order, previous assignment) to an assignment. The
RocketMQ ones sort the member ids, as every RocketMQ client does, and ignore the previous one.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence

from cluster.balance import sticky

Assignment = dict[str, tuple[str, ...]]
Strategy = Callable[[Sequence[str], Sequence[str], Mapping[str, Sequence[str]]], Assignment]
VIRTUAL_NODES = 10  # RocketMQ's default virtualNodeCnt


def average(
    queues: Sequence[str], members: Sequence[str], previous: Mapping[str, Sequence[str]]
) -> Assignment:
    """Contiguous blocks over sorted members; the first `Q % N` members get one more."""
    ordered = sorted(members)
    if not ordered:
        return {}
    size, extra = divmod(len(queues), len(ordered))
    out: Assignment = {}
    start = 0
    for i, m in enumerate(ordered):
        take = size + (1 if i < extra else 0)
        out[m] = tuple(queues[start : start + take])
        start += take
    return out


def average_by_circle(
    queues: Sequence[str], members: Sequence[str], previous: Mapping[str, Sequence[str]]
) -> Assignment:
    """Queue i goes to sorted member i mod N."""
    ordered = sorted(members)
    if not ordered:
        return {}
    return {m: tuple(queues[i :: len(ordered)]) for i, m in enumerate(ordered)}


def _ring_hash(key: str) -> int:
    return int.from_bytes(hashlib.md5(key.encode(), usedforsecurity=False).digest()[:4], "little")


def consistent_hash(
    queues: Sequence[str], members: Sequence[str], previous: Mapping[str, Sequence[str]]
) -> Assignment:
    """A ring of 10 MD5 virtual nodes per member; a queue goes to the next node clockwise."""
    if not members:
        return {}
    ring = sorted((_ring_hash(f"{m}-{i}"), m) for m in members for i in range(VIRTUAL_NODES))
    points = [h for h, _ in ring]
    out: dict[str, list[str]] = {m: [] for m in members}
    for q in queues:
        at = bisect_left(points, _ring_hash(q)) % len(ring)
        out[ring[at][1]].append(q)
    return {m: tuple(qs) for m, qs in out.items()}


def server_sticky(
    queues: Sequence[str], members: Sequence[str], previous: Mapping[str, Sequence[str]]
) -> Assignment:
    """The machine's sticky assignment (`cluster.balance.sticky`)."""
    return sticky.assign(queues, members, previous)


STRATEGIES: dict[str, Strategy] = {
    "sticky": server_sticky,
    "average": average,
    "average_by_circle": average_by_circle,
    "consistent_hash": consistent_hash,
}
"""The allocation strategies; "leaderless" is not one: it is simulated on the machine."""
