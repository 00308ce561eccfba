"""Consumer-group bookkeeping: hand-over without overlap, balance, minimal moves, determinism.

A small model of the machine drives `cluster.balance.groups`: it delivers messages of a
partition only to its active holder, returns a leaving member's messages at once, and reports
`released` when a draining holder's last message of a partition is settled. Invariants are
checked after every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fifo.state import ConsumerGroup
from fifo.v3 import consumer_groups as groups
from fifo.v3.consumer_groups import Grant, Revoke
from fifo.v3.sticky import moves_lower_bound


@dataclass
class Model:
    """The machine's side: checked-out messages per (member, partition), active consumers."""

    group: ConsumerGroup
    checked_out: dict[tuple[str, str], int] = field(default_factory=dict)
    active: dict[str, str] = field(default_factory=dict)  # partition -> member delivering
    log: list[object] = field(default_factory=list)
    index: int = 0
    names: int = 0

    def carry_out(self, actions: list[groups.Action]) -> None:
        """Apply actions: a revoke stops delivery at once and releases what holds nothing."""
        queue = list(actions)
        while queue:
            action = queue.pop(0)
            self.log.append(action)
            if isinstance(action, Grant):
                assert action.partition not in self.active, "granted while someone is active"
                assert all(
                    n == 0 for (member, p), n in self.checked_out.items()
                    if p == action.partition and member != action.member
                ), "granted while another member still holds messages of the partition"  # fmt: skip
                self.active[action.partition] = action.member
            else:
                if self.active.get(action.partition) == action.member:
                    del self.active[action.partition]
                else:  # revoked again: it was draining it and has just left
                    assert action.member not in self.group.members, action
                if action.member not in self.group.members:  # left: its messages come back
                    self.checked_out.pop((action.member, action.partition), None)
                if self.checked_out.get((action.member, action.partition), 0) == 0:
                    queue += groups.released(self.group, action.partition)

    def join(self) -> None:
        self.index += 1
        self.names += 1
        member = f"member-{self.names}"
        bound = self.bound([*self.group.member_order(), member])
        _, actions = groups.join(self.group, member, None, None, self.index)
        self.check_moves_then(bound, actions)

    def leave(self, pick: int) -> None:
        if not self.group.members:
            return
        self.index += 1
        member = self.group.member_order()[pick % len(self.group.members)]
        bound = self.bound([m for m in self.group.member_order() if m != member])
        self.check_moves_then(bound, groups.leave(self.group, member, self.index))
        # the machine returns everything a departed member held: it can settle nothing more
        for key in [key for key in self.checked_out if key[0] == member]:
            del self.checked_out[key]

    def bound(self, members: list[str]) -> int:
        """The fewest moves any balanced assignment over `members` needs from the target."""
        return moves_lower_bound(self.group.partitions, members, self.group.assignment())

    def check_moves_then(self, bound: int, actions: list[groups.Action]) -> None:
        if self.group.last_rebalance_index == self.index:
            assert self.group.last_moves == bound
        self.carry_out(actions)

    def deliver(self, pick: int) -> None:
        partitions = sorted(self.active)
        if partitions:
            partition = partitions[pick % len(partitions)]
            key = (self.active[partition], partition)
            self.checked_out[key] = self.checked_out.get(key, 0) + 1

    def settle(self, pick: int) -> None:
        held = sorted(key for key, n in self.checked_out.items() if n > 0)
        if not held:
            return
        member, partition = held[pick % len(held)]
        self.checked_out[(member, partition)] -= 1
        draining = self.group.revoking.get(partition) == member
        if draining and self.checked_out[(member, partition)] == 0:
            self.carry_out(groups.released(self.group, partition))

    def check_invariants(self) -> None:
        group = self.group
        for partition in group.partitions:  # at most one member with messages of a partition
            holding = [m for (m, p), n in self.checked_out.items() if p == partition and n > 0]
            assert len(holding) <= 1
            if holding:
                assert group.holder.get(partition) == holding[0]
            if partition in self.active:
                assert group.holder[partition] == self.active[partition]
                assert partition not in group.revoking
        if group.members:  # every partition has a live target
            assert sorted(group.target) == sorted(group.partitions)
            assert all(member in group.members for member in group.target.values())
            sizes = [len(held) for held in group.assignment().values()]
            assert max(sizes) - min(sizes) <= 1
        else:
            assert group.target == {}
        if not group.pending():
            sizes = [len(group.held_by(member)) for member in group.members]
            assert not sizes or max(sizes) - min(sizes) <= 1
            assert sorted(self.active) == sorted(group.target)


STEPS = st.lists(
    st.tuples(st.sampled_from(["join", "leave", "deliver", "settle"]), st.integers(0, 99)),
    max_size=60,
)


def run(partition_count: int, steps: list[tuple[str, int]]) -> Model:
    model = Model(
        ConsumerGroup("g", "orders", tuple(f"orders.{i}" for i in range(partition_count)))
    )
    for kind, pick in steps:
        if kind == "join":
            model.join()
        elif kind == "leave":
            model.leave(pick)
        elif kind == "deliver":
            model.deliver(pick)
        else:
            model.settle(pick)
        model.check_invariants()
    return model


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 9), STEPS)
def test_invariants_hold_after_every_step(
    partition_count: int, steps: list[tuple[str, int]]
) -> None:
    """Never two members with messages of one partition, a grant only once the old holder
    holds nothing, every partition targeted at a live member, balanced targets with the
    minimal moves, and balanced holders once no hand-over is pending."""
    run(partition_count, steps)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), STEPS)
def test_settling_everything_finishes_every_hand_over(
    partition_count: int, steps: list[tuple[str, int]]
) -> None:
    """Liveness: once every checked-out message is settled, nothing is pending."""
    model = run(partition_count, steps)
    while any(n > 0 for n in model.checked_out.values()):
        model.settle(0)
        model.check_invariants()
    assert model.group.pending() == ()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9), STEPS)
def test_the_same_steps_give_the_same_actions(
    partition_count: int, steps: list[tuple[str, int]]
) -> None:
    """Determinism: two replays emit identical actions and end in identical groups."""
    first, second = run(partition_count, steps), run(partition_count, steps)
    assert first.log == second.log
    assert first.group.assignment() == second.group.assignment()
    assert (first.group.epoch, first.group.holder) == (second.group.epoch, second.group.holder)


def test_eight_partitions_three_members_then_a_crash_is_four_four_with_three_moves() -> None:
    """Acceptance 1's arithmetic: 3/3/2, then one member of three goes: 4/4, 3 partitions move,
    each granted only after its holder released it."""
    model = Model(ConsumerGroup("g", "orders", tuple(f"orders.{i}" for i in range(8))))
    for _ in range(3):
        model.join()
    assert [len(held) for held in model.group.assignment().values()] == [3, 3, 2]
    model.log.clear()
    model.leave(1)
    assert [len(held) for held in model.group.assignment().values()] == [4, 4]
    assert model.group.last_moves == 0  # the departed member's partitions are not moves
    assert model.group.last_reassigned == 3
    revoked = [a for a in model.log if isinstance(a, Revoke)]
    granted = [a for a in model.log if isinstance(a, Grant)]
    assert len(revoked) == len(granted) == 3 and model.group.pending() == ()


def test_a_moved_partition_waits_for_the_old_holders_messages() -> None:
    """A join takes partitions from members with messages out: the grant waits for the settle."""
    model = Model(ConsumerGroup("g", "orders", ("orders.0", "orders.1")))
    model.join()
    model.deliver(0)
    model.deliver(1)
    model.log.clear()
    model.join()  # orders.1 moves to member-2
    assert model.log == [Revoke("member-1", "orders.1", model.group.epoch)]
    assert model.group.pending() == ("orders.1",)
    model.settle(0)  # member-1's message of orders.0: still owner of it, nothing happens
    assert model.group.pending() == ("orders.1",)
    model.settle(0)
    assert model.log[-1] == Grant("member-2", "orders.1", model.group.members["member-2"].epoch)
    assert model.group.pending() == ()


def test_a_member_leaving_while_draining_a_revoked_partition_releases_it() -> None:
    """Fuzzer seed 24 (shrunk): B joins and takes orders.1 from A, which still holds a message
    of it (draining); then A leaves. Its message comes back at once, so orders.1 must be
    revoked again (a departed holder) and released to B, not left pending forever."""
    model = Model(ConsumerGroup("g", "orders", ("orders.0", "orders.1")))
    model.join()
    model.deliver(1)  # member-1 holds a message of orders.1
    model.join()  # orders.1 moves to member-2: revoked, draining
    assert model.group.pending() == ("orders.1",)
    model.leave(0)  # member-1 leaves while draining
    model.check_invariants()
    assert model.group.pending() == ()
    assert model.group.holder == {"orders.0": "member-2", "orders.1": "member-2"}


def test_stale_epochs_are_fenced() -> None:
    """A member that left and joined again: its old epoch is stale, its new one is not."""
    group = ConsumerGroup("g", "orders", ("orders.0",))
    old, _ = groups.join(group, "a", None, None, 1)
    groups.leave(group, "a", 2)
    assert group.is_stale("a", old)
    new, _ = groups.join(group, "a", None, None, 3)
    assert new > old and group.is_stale("a", old) and not group.is_stale("a", new)


def test_joining_twice_is_a_caller_error() -> None:
    """The machine checks membership before calling join."""
    group = ConsumerGroup("g", "orders", ("orders.0",))
    groups.join(group, "a", None, None, 1)
    with pytest.raises(ValueError):
        groups.join(group, "a", None, None, 2)


def test_the_module_is_pure_enough_to_move_into_fifo() -> None:
    """Only pure imports (a relative one for `sticky`): it moves into fifo/v3 as is."""
    from pathlib import Path

    from tests.fifo.test_purity import impure_imports

    path = Path(groups.__file__)
    assert impure_imports(path.read_text(), path) == []
