"""Machine v3 consumer groups under the fuzzer: its invariants hold on seeded runs, each one is
shown to fail on a planted bug, and the shrunk counterexamples found so far stay fixed."""

from __future__ import annotations

from collections import Counter

import pytest

import fifo.fuzz
from fifo.fuzz.runner import Upgrade, run_with_log
from fifo.v3 import consumer_groups as cg
from fifo.v3 import partitioned, sticky


def violations(seeds: range, steps: int = 600) -> set[str]:
    found: set[str] = set()
    for seed in seeds:
        result = fifo.fuzz.run(seed, steps, 3)
        found |= {v.invariant for v in result.violations}
    return found


def test_seeded_v3_runs_join_leave_and_hold_every_invariant() -> None:
    """Runs that declare the partitioned queue, join and leave (with faults, settles, bad
    input and a snapshot replay) report no violation."""
    kinds: Counter[str] = Counter()
    for seed in range(100, 112):
        log, result = run_with_log(seed, 600, 3, snapshot_check=True)
        assert result.violations == [], (seed, result.violations[:3])
        kinds.update(type(entry[1]).__name__ for entry in log if not isinstance(entry, Upgrade))
    assert kinds["JoinGroup"] > 50 and kinds["LeaveGroup"] > 20, kinds


def test_fuzz_seed_24_a_draining_member_that_leaves_is_revoked_again() -> None:
    """Shrunk counterexample: a member leaves while draining a revoked partition; its messages
    came back but the partition stayed revoking, and the next member was granted it while the
    departed consumer still held messages (cgroup_two_holders). Fixed: revoked again."""
    assert fifo.fuzz.run(24, 600, 3).violations == []


def test_planted_bug_grant_before_release_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A revoke that releases at once (no waiting for the old member's settles) gives one
    partition's messages to two members."""
    original = partitioned.ConsumerGroups.revoke

    def revoke_without_waiting(self, ctx, group, q, action, gone):  # type: ignore[no-untyped-def]
        actions = original(self, ctx, group, q, action, gone)
        return actions if actions else cg.released(group, q.name)

    monkeypatch.setattr(partitioned.ConsumerGroups, "revoke", revoke_without_waiting)
    found = violations(range(0, 12))
    assert {"cgroup_two_holders", "cgroup_holder"} & found, found


def test_planted_bug_non_sticky_assignment_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """An assignment that ignores the previous one (balanced, not sticky) moves more than the
    balanced minimum."""
    original = sticky.assign  # (what consumer_groups imported as `assign`)
    monkeypatch.setattr(cg, "assign", lambda parts, members, previous: original(parts, members))
    assert "cgroup_moves" in violations(range(0, 12))


def test_planted_bug_unbalanced_assignment_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Everything to the first member: unbalanced targets."""

    def first_takes_all(parts, members, previous):  # type: ignore[no-untyped-def]
        return {member: tuple(parts) if i == 0 else () for i, member in enumerate(members)}

    monkeypatch.setattr(cg, "assign", first_takes_all)
    assert "cgroup_balance" in violations(range(0, 12))


def test_planted_bug_dropped_partition_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """An assignment that forgets the last partition leaves it without a live member."""
    original = sticky.assign  # (what consumer_groups imported as `assign`)
    monkeypatch.setattr(
        cg, "assign", lambda parts, members, previous: original(parts[:-1], members, previous)
    )
    assert "cgroup_unassigned" in violations(range(0, 12))
