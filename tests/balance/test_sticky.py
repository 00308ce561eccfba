"""The server-side sticky assignment: balanced, minimal moves (against a brute-force optimum over
every previous assignment up to 6 partitions x 4 members), ties by join order, order-free."""

from __future__ import annotations

import ast
import functools
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from fifo.v3 import sticky
from fifo.v3.sticky import assign, moves, moves_lower_bound

STICKY_PATH = Path(sticky.__file__)
UNOWNED = -1  # in an owner tuple: a new partition (even index) or one whose owner left (odd)
GONE = "left"  # a member that left the group: it still appears in the previous assignment


def balanced(assignment: dict[str, tuple[str, ...]]) -> bool:
    sizes = [len(held) for held in assignment.values()]
    return max(sizes) - min(sizes) <= 1


@functools.cache
def balanced_candidates(partitions: int, members: int) -> tuple[tuple[int, ...], ...]:
    """Every owner tuple (partition i -> member index) whose member counts differ by <= 1."""
    out = []
    for owners in itertools.product(range(members), repeat=partitions):
        counts = [owners.count(member) for member in range(members)]
        if max(counts) - min(counts) <= 1:
            out.append(owners)
    return tuple(out)


@functools.cache
def brute_force_min_moves(previous: tuple[int, ...], members: int) -> int:
    """The fewest partitions any balanced assignment takes from a remaining previous owner.

    Memoised on the sorted owner tuple: renaming partitions maps balanced assignments onto
    balanced assignments with the same number of moves, so the optimum depends on it only.
    """
    return min(
        sum(1 for was, now in zip(previous, owners, strict=True) if was != UNOWNED and was != now)
        for owners in balanced_candidates(len(previous), members)
    )


def previous_assignment(owners: Sequence[int], names: Sequence[str]) -> dict[str, list[str]]:
    """An owner tuple as a previous assignment: an UNOWNED partition of odd index stays listed
    under a departed member (the function must ignore it), one of even index is new."""
    out: dict[str, list[str]] = {}
    for index, owner in enumerate(owners):
        if owner != UNOWNED:
            out.setdefault(names[owner], []).append(f"p{index}")
        elif index % 2:
            out.setdefault(GONE, []).append(f"p{index}")
    return out


def every_case() -> Iterator[tuple[int, int, tuple[int, ...]]]:
    """(partitions, members, previous owner per partition) for every size up to 6 x 4."""
    for partition_count in range(7):
        for member_count in range(1, 5):
            values = [*range(member_count), UNOWNED]
            for owners in itertools.product(values, repeat=partition_count):
                yield partition_count, member_count, owners


def test_every_small_case_is_balanced_complete_and_has_the_brute_force_minimum_of_moves() -> None:
    """All previous assignments of <= 6 partitions over <= 4 remaining members, with new
    partitions, departed owners and new (empty) members: each partition assigned once, counts
    within one, moves equal to the brute-force optimum and to `moves_lower_bound`."""
    checked = 0
    for partition_count, member_count, owners in every_case():
        partitions = [f"p{i}" for i in range(partition_count)]
        names = [f"m{i}" for i in range(member_count)]
        previous = previous_assignment(owners, names)
        out = assign(partitions, names, previous)
        assert list(out) == names
        assert sorted(p for held in out.values() for p in held) == sorted(partitions)
        assert balanced(out)
        canonical = tuple(sorted(owners))
        best = brute_force_min_moves(canonical, member_count)
        assert moves(previous, out) == best, (partitions, names, previous, out)
        assert moves_lower_bound(partitions, names, previous) == best
        checked += 1
    assert checked == sum(
        (members + 1) ** partitions for partitions in range(7) for members in range(1, 5)
    )


def test_an_already_balanced_assignment_of_the_same_members_comes_back_unchanged() -> None:
    """Every complete balanced assignment up to 6 x 4 is a fixed point (no moves at all), even
    when the `+1` partitions sit with the last-joined members (KAFKA-18688's bug)."""
    for partition_count in range(7):
        for member_count in range(1, 5):
            partitions = [f"p{i}" for i in range(partition_count)]
            names = [f"m{i}" for i in range(member_count)]
            for owners in balanced_candidates(partition_count, member_count):
                previous = previous_assignment(owners, names)
                expected = {name: tuple(previous.get(name, ())) for name in names}
                assert assign(partitions, names, previous) == expected


def test_ties_are_broken_by_join_order_not_by_name() -> None:
    """Renaming members (reverse alphabetical order) changes nothing but the names: the result
    depends on join position only. With nothing owned, the first-joined gets the extra."""
    assert assign(["q1", "q2", "q3"], ["zed", "abe"]) == {"zed": ("q1", "q2"), "abe": ("q3",)}
    for partition_count, member_count, owners in itertools.islice(every_case(), 0, None, 7):
        partitions = [f"p{i}" for i in range(partition_count)]
        plain = [f"m{i}" for i in range(member_count)]
        renamed = [f"z{9 - i}" for i in range(member_count)]
        out = assign(partitions, plain, previous_assignment(owners, plain))
        out_renamed = assign(partitions, renamed, previous_assignment(owners, renamed))
        assert list(out.values()) == list(out_renamed.values())


def test_the_order_of_the_previous_mapping_and_its_lists_does_not_matter() -> None:
    """Reversed insertion order of `previous` and reversed partition lists: same answer."""
    for partition_count, member_count, owners in itertools.islice(every_case(), 0, None, 5):
        partitions = [f"p{i}" for i in range(partition_count)]
        names = [f"m{i}" for i in range(member_count)]
        previous = previous_assignment(owners, names)
        shuffled = {member: held[::-1] for member, held in reversed(previous.items())}
        assert assign(partitions, names, previous) == assign(partitions, names, shuffled)


ORDER_PROBE = """
import itertools, json
from fifo.v3.sticky import assign
out = []
for n in range(1, 6):
    members = [f"member-{i}" for i in range(n)]
    parts = [f"orders.{i}" for i in range(11)]
    previous = {}
    for step, member in enumerate(itertools.cycle(members)):
        if step > 20:
            break
        previous = assign(parts, members[: 1 + step % n], previous)
        out.append({m: list(v) for m, v in previous.items()})
print(json.dumps(out))
"""


def test_the_same_inputs_give_the_same_assignment_under_any_hash_seed() -> None:
    """Two processes with different PYTHONHASHSEED compute identical assignment sequences."""
    results = []
    for seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", ORDER_PROBE], env=env, capture_output=True, text=True, check=True
        )
        results.append(json.loads(done.stdout))
    assert results[0] == results[1] and len(results[0]) > 50


def test_the_module_is_pure_enough_to_move_into_fifo() -> None:
    """It imports only what fifo's purity test allows (the module moves into fifo/v3 as is)."""
    from tests.fifo.test_purity import impure_imports

    assert impure_imports(STICKY_PATH.read_text(), STICKY_PATH) == []
    tree = ast.parse(STICKY_PATH.read_text())
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert not names & {"hash", "id", "random", "time"}


def test_a_partition_claimed_twice_stays_with_the_earlier_member() -> None:
    """Conflicting previous claims resolve deterministically."""
    out = assign(["q1", "q2"], ["m1", "m2"], {"m2": ["q1"], "m1": ["q1"]})
    assert out == {"m1": ("q1",), "m2": ("q2",)}


def test_duplicate_members_or_partitions_are_refused() -> None:
    """A caller bug, not a state to assign."""
    with pytest.raises(ValueError):
        assign(["q1"], ["m1", "m1"])
    with pytest.raises(ValueError):
        assign(["q1", "q1"], ["m1"])
