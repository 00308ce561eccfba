"""The server-side sticky assignment: balanced, minimal moves (checked by brute force), stable."""

from __future__ import annotations

import itertools
import random

import pytest

from cluster.balance.sticky import assign, moves


def balanced(a: dict[str, tuple[str, ...]]) -> bool:
    sizes = [len(v) for v in a.values()]
    return max(sizes) - min(sizes) <= 1


def brute_force_min_moves(queues: list[str], members: list[str], prev: dict[str, list[str]]) -> int:
    best = None
    for owners in itertools.product(members, repeat=len(queues)):
        cand = {m: tuple(q for q, o in zip(queues, owners, strict=True) if o == m) for m in members}
        if balanced(cand):
            n = moves(prev, cand)
            best = n if best is None else min(best, n)
    assert best is not None
    return best


def test_every_queue_is_assigned_once_and_counts_differ_by_at_most_one() -> None:
    """7 queues over 3 members: 3/2/2, each queue exactly once."""
    queues = [f"q{i}" for i in range(7)]
    out = assign(queues, ["m1", "m2", "m3"])
    assert sorted(q for qs in out.values() for q in qs) == sorted(queues)
    assert sorted(len(v) for v in out.values()) == [2, 2, 3]


@pytest.mark.parametrize("seed", range(60))
def test_moves_are_the_brute_force_minimum_on_small_cases(seed: int) -> None:
    """Random previous assignments over up to 6 queues and 3 members, with joins and leaves."""
    rng = random.Random(seed)
    queues = [f"q{i}" for i in range(rng.randint(1, 6))]
    old = [f"m{i}" for i in range(rng.randint(1, 3))]
    prev = {m: list(v) for m, v in assign(queues, old).items()}
    for q in queues:  # scramble ownership into an unbalanced previous assignment
        if rng.random() < 0.5:
            for v in prev.values():
                if q in v:
                    v.remove(q)
            prev[rng.choice(old)].append(q)
    members = [m for m in old if rng.random() < 0.8] + [f"n{i}" for i in range(rng.randint(0, 2))]
    if not members:
        members = ["n9"]
    out = assign(queues, members, prev)
    assert balanced(out)
    assert moves(prev, out) == brute_force_min_moves(queues, members, prev)


def test_an_already_balanced_assignment_is_returned_unchanged() -> None:
    """No change in membership: no moves, even when the +1 sits with a later member."""
    prev = {"m1": ("q1",), "m2": ("q2", "q3"), "m3": ("q4",)}
    assert assign(["q1", "q2", "q3", "q4"], ["m1", "m2", "m3"], prev) == prev


def test_ties_are_broken_by_join_order_not_by_name() -> None:
    """With nothing owned, the first-joined member gets the extra queue."""
    out = assign(["q1", "q2", "q3"], ["zed", "abe"])
    assert out == {"zed": ("q1", "q2"), "abe": ("q3",)}


def test_a_queue_claimed_twice_stays_with_the_earlier_member() -> None:
    """Conflicting previous claims resolve deterministically."""
    out = assign(["q1", "q2"], ["m1", "m2"], {"m2": ["q1"], "m1": ["q1"]})
    assert out == {"m1": ("q1",), "m2": ("q2",)}


def test_duplicate_members_are_refused() -> None:
    """A caller bug, not a state to assign."""
    with pytest.raises(ValueError):
        assign(["q1"], ["m1", "m1"])
