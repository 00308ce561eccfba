"""Machine v3 message groups: behaviour, limits, snapshots, the fuzzer's grouped invariants (each
shown to fail on a planted bug) and determinism across hash seeds (issue 9, acceptance 3)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import fifo
import fifo.fuzz
from fifo import limits
from fifo.commands import (
    AnnotatedEnqueue,
    Cancel,
    Checkout,
    ConnectionId,
    ConsumerId,
    DeclareGroupedQueue,
    DeclareQueue,
    Enqueue,
    GroupConfig,
    Purge,
    PurgeGroup,
    QueueConfig,
    Remove,
    Return,
    Settle,
    SimplePrefetch,
)
from fifo.effects import Deliver, Effect
from fifo.fuzz.invariants import check_groups
from fifo.meta import Meta
from fifo.replies import Error, Reply
from fifo.state import Grouping
from fifo.v3 import groups as G
from fifo.v3.grouped import GroupedQueue
from tests.fifo.processes import run_pythons

CONN = ConnectionId("n1", 1, 1)


class Log:
    """A v3 state fed one command at a time; keeps the deliveries per consumer tag."""

    def __init__(self, version: int = 3) -> None:
        self.state = fifo.init_state(version)
        self.index = 0
        self.time = 1_000
        self.got: dict[str, list[tuple[int, bytes, bool]]] = {}

    def __call__(self, command: Any, advance: int = 1) -> tuple[Reply, list[Effect]]:
        self.index += 1
        self.time += advance
        reply, effects = fifo.apply(Meta(self.index, 1, self.time, self.state.version),
                                    command, self.state)  # fmt: skip
        for effect in effects:
            if isinstance(effect, Deliver):
                self.got.setdefault(effect.tag, []).extend(
                    (d.msg_id, d.body, d.redelivered) for d in effect.messages)
        return reply, effects

    def key(self, tag: str) -> int:
        for c in self.state.queues["q"].consumers.values():
            if c.tag == tag:
                assert isinstance(c.key, int)
                return c.key
        raise KeyError(tag)

    def bodies(self, tag: str) -> list[bytes]:
        return [body for _, body, _ in self.got.get(tag, [])]


def grouped(policy: str = "sequenced", rebalance: bool = False, **config: Any) -> Log:
    log = Log()
    reply, _ = log(DeclareGroupedQueue("q", QueueConfig(**config),
                                       GroupConfig("x-group-id", policy, rebalance)))  # type: ignore[arg-type]  # fmt: skip
    assert not isinstance(reply, Error), reply
    return log


def publish(log: Log, group: str | None, body: bytes) -> Reply:
    anns = () if group is None else (("x-group-id", group),)
    reply, _ = log(AnnotatedEnqueue("q", body, annotations=anns))
    return reply


def attach(log: Log, tag: str, prefetch: int) -> None:
    reply, _ = log(Checkout("q", ConsumerId(tag, CONN), SimplePrefetch(prefetch)))
    assert not isinstance(reply, Error), reply


def no_violations(log: Log) -> None:
    assert check_groups(log.state.queues["q"]) == []


# --- behaviour ----------------------------------------------------------------------------------


def test_sequenced_one_holder_per_group_and_order_within_it() -> None:
    """Two consumers, two groups: each group goes to one consumer at a time, in order."""
    log = grouped()
    for n in range(6):
        publish(log, f"g{n % 2}", b"m%d" % n)
    attach(log, "a", 5)
    attach(log, "b", 5)
    assert log.bodies("a") == [b"m0", b"m1", b"m2", b"m3", b"m4"]  # a takes both free groups
    assert log.bodies("b") == []  # m5 is g1's, held by a
    no_violations(log)
    log(Settle("q", log.key("a"), (0, 2, 4)))  # g0 done: free again, but nothing waits in it
    assert log.bodies("b") == []
    log(Settle("q", log.key("a"), (1, 3)))  # g1 free: its next message may go to anyone
    assert log.bodies("a")[5:] + log.bodies("b") == [b"m5"]
    no_violations(log)


def test_returned_messages_come_back_first_in_their_order_flagged() -> None:
    log = grouped()
    for n in range(4):
        publish(log, "g", b"m%d" % n)
    attach(log, "a", 2)
    log(Return("q", log.key("a"), (1, 0)))  # returned in reverse: they come back in order
    assert log.got["a"][2:] == [(2, b"m0", True), (3, b"m1", True)]
    no_violations(log)


def test_distinct_groups_never_block_and_oldest_head_goes_first() -> None:
    """A consumer with credit takes the oldest head among free groups, skipping held ones."""
    log = grouped()
    publish(log, "g1", b"a1")
    publish(log, "g2", b"b1")
    publish(log, "g1", b"a2")
    publish(log, "g3", b"c1")
    attach(log, "x", 1)  # gets a1: g1 is now held by x
    attach(log, "y", 3)  # g1 held: b1 (g2), then c1 (g3); a2 waits for g1
    assert log.bodies("x") == [b"a1"]
    assert log.bodies("y") == [b"b1", b"c1"]
    no_violations(log)


def test_exclusive_groups_stick_until_the_owner_goes() -> None:
    log = grouped("exclusive")
    publish(log, "g", b"m0")
    attach(log, "a", 1)
    attach(log, "b", 1)
    log(Settle("q", log.key("a"), (0,)))
    publish(log, "g", b"m1")  # a still owns g (nothing held): it gets it, b gets nothing
    assert log.bodies("a") == [b"m0", b"m1"] and log.bodies("b") == []
    publish(log, "g", b"m2")  # a is full: m2 waits for a, b stays idle
    assert log.bodies("b") == []
    log(Checkout("q", ConsumerId("a", CONN), Remove()))  # a goes: m1 back, g moves to b
    assert log.got["b"] == [(0, b"m1", True)]
    no_violations(log)


def test_exclusive_cancel_frees_idle_groups_at_once() -> None:
    log = grouped("exclusive")
    publish(log, "g1", b"x")
    publish(log, "g2", b"y")
    attach(log, "a", 2)
    attach(log, "b", 2)
    log(Settle("q", log.key("a"), (0,)))  # g1 idle but owned by a; a still holds y of g2
    log(Checkout("q", ConsumerId("a", CONN), Cancel()))
    publish(log, "g1", b"x2")
    assert log.bodies("b") == [b"x2"]  # g1 moved to b at the cancel
    publish(log, "g2", b"y2")  # g2 still held by the cancelled a: waits
    assert log.bodies("b") == [b"x2"]
    log(Settle("q", log.key("a"), (1,)))  # a done and gone: g2 moves
    assert log.bodies("b") == [b"x2", b"y2"]
    no_violations(log)


def test_rebalance_on_join_balances_idle_groups() -> None:
    log = grouped("exclusive", rebalance=True)
    attach(log, "a", 100)
    for n in range(9):
        publish(log, f"g{n}", b"m%d" % n)
    log(Settle("q", log.key("a"), tuple(range(9))))  # a owns 9 idle groups
    attach(log, "b", 100)
    attach(log, "c", 100)
    owners = [g.owner for g in log.state.queues["q"].grouping.groups.values()]  # type: ignore[union-attr]
    counts = sorted(owners.count(log.key(t)) for t in "abc")
    assert counts == [3, 3, 3]
    no_violations(log)


def test_rebalance_never_moves_groups_with_messages_out() -> None:
    log = grouped("exclusive", rebalance=True)
    attach(log, "a", 100)
    for n in range(4):
        publish(log, f"g{n}", b"m%d" % n)
    attach(log, "b", 100)  # a holds all four: nothing may move
    grouping = log.state.queues["q"].grouping
    assert grouping is not None
    assert {g.owner for g in grouping.groups.values()} == {log.key("a")}
    no_violations(log)


def test_default_group_and_another_group_key() -> None:
    log = Log()
    log(DeclareGroupedQueue("q", QueueConfig(), GroupConfig("customer")))
    log(Enqueue("q", b"plain"))  # no annotation: the default group
    log(AnnotatedEnqueue("q", b"c7", annotations=(("customer", 7),)))  # an int id: "7"
    log(AnnotatedEnqueue("q", b"other", annotations=(("x-group-id", "g"),)))  # not the key
    rows = {row.group: row.ready for row in fifo.groups(log.state, "q")}
    assert rows == {None: 2, "7": 1}


def test_group_limit_refuses_a_new_group_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "groups_per_queue_max", 2)
    log = grouped()
    assert publish(log, "a", b"1") == fifo.replies.Ok()
    assert publish(log, "b", b"2") == fifo.replies.Ok()
    reply = publish(log, "c", b"3")
    assert isinstance(reply, Error) and "groups_per_queue_max" in reply.message
    assert publish(log, "a", b"4") == fifo.replies.Ok()  # a tracked group is fine
    assert publish(log, None, b"5") == fifo.replies.Ok()  # the default group always is


def test_a_resent_publish_at_the_group_limit_is_a_duplicate_not_a_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pinned (found after the fifo hand-over of issue 9): the limit was checked before the
    enqueuer's dedup, so a resend of a stored message whose group had gone (settled) was refused
    with the group limit although its message was stored; the publisher then failed."""
    monkeypatch.setattr(limits, "groups_per_queue_max", 1)
    log = grouped()
    attach(log, "a", 10)
    sent = AnnotatedEnqueue("q", b"1", "p", 1, CONN, annotations=(("x-group-id", "g1"),))
    assert log(sent)[0] == fifo.replies.Ok()
    log(Settle("q", log.key("a"), (0,)))  # g1 is gone: nothing waiting or held
    assert publish(log, "g2", b"2") == fifo.replies.Ok()  # the one tracked group now
    assert log(sent)[0] == fifo.replies.Ok()  # the resend: a duplicate, nothing stored
    assert fifo.overview(log.state, "q").total == 1  # type: ignore[union-attr]
    fresh = AnnotatedEnqueue("q", b"3", "p", 2, CONN, annotations=(("x-group-id", "g3"),))
    reply = log(fresh)[0]
    assert isinstance(reply, Error) and "groups_per_queue_max" in reply.message
    gap = AnnotatedEnqueue("q", b"3", "p", 2, CONN, annotations=(("x-group-id", "g2"),))
    assert log(gap)[0] == fifo.replies.Ok()  # seq 2 was not consumed by the refusal


def test_exclusive_limit_evicts_the_longest_idle_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "groups_per_queue_max", 2)
    log = grouped("exclusive")
    attach(log, "a", 10)
    publish(log, "a1", b"1")
    publish(log, "a2", b"2")
    log(Settle("q", log.key("a"), (0, 1)))  # both idle, a1 first
    assert publish(log, "a3", b"3") == fifo.replies.Ok()
    assert [r.group for r in fifo.groups(log.state, "q")] == ["a2", "a3"]


def test_purge_and_purge_group() -> None:
    log = grouped()
    for n in range(6):
        publish(log, f"g{n % 3}", b"m%d" % n)
    reply, _ = log(PurgeGroup("q", "g1"))
    assert reply == fifo.replies.PurgeOk(2)
    assert fifo.overview(log.state, "q").ready == 4  # type: ignore[union-attr]
    reply, _ = log(Purge("q"))
    assert reply == fifo.replies.PurgeOk(4)
    assert fifo.groups(log.state, "q") == []
    reply, _ = log(PurgeGroup("q", "nope"))
    assert reply == fifo.replies.PurgeOk(0)


def test_drop_head_takes_the_oldest_message_of_any_group() -> None:
    log = grouped(max_length=2)
    publish(log, "a", b"1")
    publish(log, "b", b"2")
    publish(log, "b", b"3")
    assert [m.body for m in fifo.messages(log.state, "q")] == [b"2", b"3"]
    assert [r.group for r in fifo.groups(log.state, "q")] == ["b"]  # group a is freed


def test_ttl_expires_inside_groups_and_timers_see_the_oldest() -> None:
    log = grouped(message_ttl_ms=10)
    publish(log, "a", b"1")
    publish(log, "b", b"2")
    assert fifo.next_deadline_ms(log.state) == 1_002 + 10
    due = fifo.due_commands(log.state, 5_000)
    for command in due:
        log(command, advance=5_000)
    assert fifo.overview(log.state, "q").total == 0  # type: ignore[union-attr]


def test_snapshot_restore_keeps_groups_and_digest() -> None:
    log = grouped("exclusive")
    for n in range(5):
        publish(log, f"g{n % 2}", b"m%d" % n)
    attach(log, "a", 1)
    attach(log, "b", 1)
    restored = fifo.restore(fifo.snapshot(log.state))
    assert fifo.digest(restored) == fifo.digest(log.state)
    assert fifo.groups(restored, "q") == fifo.groups(log.state, "q")


def test_redeclare_must_name_the_same_groups() -> None:
    log = grouped()
    reply, _ = log(DeclareGroupedQueue("q", QueueConfig(), GroupConfig()))
    assert reply == fifo.replies.DeclareOk(False)
    reply, _ = log(DeclareQueue("q", QueueConfig()))
    assert isinstance(reply, Error) and reply.code == "queue_exists"
    bad = GroupConfig(policy="sequenced", rebalance_groups_on_join=True)
    reply, _ = log(DeclareGroupedQueue("q2", QueueConfig(), bad))
    assert isinstance(reply, Error) and "exclusive" in reply.message


@pytest.mark.parametrize("command", [
    DeclareGroupedQueue("g", QueueConfig(), GroupConfig()),
    AnnotatedEnqueue("q", b"x", annotations=(("x-group-id", "g"),)),
    PurgeGroup("q", "g"),
], ids=lambda c: type(c).__name__)  # fmt: skip
def test_machine_v2_refuses_grouped_commands_clearly(command: Any) -> None:
    """Before the upgrade to v3 a grouped command is an unknown command naming the version."""
    log = Log(2)
    log(DeclareQueue("q"))
    reply, _ = log(command)
    assert isinstance(reply, Error) and reply.code == "unknown_command"
    assert "machine version 2" in reply.message


def test_conversion_from_v2_groups_nothing() -> None:
    log = Log(2)
    log(DeclareQueue("q"))
    log(Enqueue("q", b"x"))
    new = fifo.convert(log.state, 2, 3, Meta(9, 1, 5_000, 3))
    assert new.queues["q"].grouping is None and fifo.overview(new, "q").ready == 1  # type: ignore[union-attr]
    assert fifo.state_version(new) == 3


def test_dispatch_does_not_scan_the_queue() -> None:
    """A delivery looks at heap tops only: with 20,000 waiting messages in 10,000 groups all
    held, a settle frees one group and the next delivery touches O(log groups) entries."""
    log = grouped()
    attach(log, "a", 10_000)
    for n in range(20_000):
        publish(log, f"g{n % 10_000}", b"m")
    grouping = log.state.queues["q"].grouping
    assert grouping is not None and grouping.waiting == 10_000
    popped: list[int] = []
    original = G._top

    def counting(gr: Grouping, heap: list[Any], owner: Any, any_owner: bool) -> Any:
        size = len(heap)
        found = original(gr, heap, owner, any_owner)
        popped.append(size - len(heap))
        return found

    G._top = counting
    try:
        log(Settle("q", log.key("a"), (5,)))
    finally:
        G._top = original
    assert log.bodies("a")[-1:] == [b"m"] and len(log.got["a"]) == 10_001
    assert sum(popped) < 64  # stale entries dropped, never a walk over the groups


# --- the fuzzer's grouped invariants, each shown to fail on a planted bug ---------------------


def planted(seeds: int = 6, steps: int = 1500, ignore: frozenset[str] = frozenset()) -> set[str]:
    found: set[str] = set()
    for seed in range(seeds):
        result = fifo.fuzz.run(seed, steps, 3, ignore=ignore)
        found |= {v.invariant for v in result.violations}
    return found


def test_planted_bug_two_holders_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dispatch that ignores owners hands one group to two consumers (`group_owner` trips on
    it too, and often first: it is ignored so the runs go on to show `group_two_holders`)."""
    original = G.pick
    monkeypatch.setattr(G, "pick", lambda gr, key: G.oldest(gr) if key is not None else
                        original(gr, key))  # fmt: skip
    assert "group_two_holders" in planted(ignore=frozenset({"group_owner"}))


def test_planted_bug_group_order_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """New messages put at the front of their group are delivered out of order."""

    def add_front(gr: Grouping, g: Any, m: Any) -> None:
        g.ready.appendleft(m)
        gr.waiting += 1
        G.push(gr, g)

    monkeypatch.setattr(G, "add_ready", add_front)
    assert "group_order" in planted()


def test_planted_bug_starvation_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A freed group that is not indexed again waits while consumers have credit."""

    def release_unindexed(gr: Grouping, g: Any) -> None:
        owned = gr.by_owner.get(g.owner)
        if owned is not None:
            owned.pop(g.gid, None)
            if not owned:
                del gr.by_owner[g.owner]
        g.owner = None
        G.tidy(gr, g)

    monkeypatch.setattr(G, "release", release_unindexed)
    assert "group_starvation" in planted()


def test_planted_bug_exclusive_move_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rebalance that moves groups with messages out breaks exclusive ownership."""

    def greedy(self: GroupedQueue, q: Any, gr: Grouping) -> int:
        live = [c for c in q.consumers.values() if self.sticky(q, c)]
        for g in list(gr.groups.values()):
            if len(live) > 1 and g.owner is not None and g.owner != live[-1].key:
                G.move(gr, g, live[-1].key)
        return 1

    monkeypatch.setattr(GroupedQueue, "rebalance", greedy)
    assert "group_moved" in planted(12)


def test_clean_v3_runs_exercise_groups() -> None:
    result = fifo.fuzz.run(21, 3000, 3, snapshot_check=True)
    assert result.violations == []
    counts = result.command_counts
    assert counts["AnnotatedEnqueue"] > 300 and counts["DeclareGroupedQueue"] > 0
    assert counts["PurgeGroup"] > 0 and result.deliveries > 300


def test_v2_runs_upgrading_past_v3_hold_every_invariant() -> None:
    """v2 runs converted at a random split to the latest version (through v3's conversion)."""
    for seed in (3, 4):
        result = fifo.fuzz.run(seed, 1500, 2, upgrade_at="random", snapshot_check=True)
        assert result.violations == [] and result.final_machine_version == fifo.LATEST_VERSION


# --- acceptance 3 -----------------------------------------------------------------------------


FUZZ_V3 = ["-m", "cluster.cli", "fuzz", "--seed", "7", "--steps", "5000", "--machine-version", "3"]


def test_fuzz_v3_same_digest_under_two_hash_seeds() -> None:
    """`quorumq fuzz --seed 7 --steps 5000 --machine-version 3 -o json` exits 0 with one digest
    (the two processes run at once)."""
    runs = [([*FUZZ_V3, "-o", "json"], seed) for seed in ("1", "4242")]
    outputs: list[dict[str, Any]] = []
    for proc in run_pythons(runs, 600):
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        outputs.append(json.loads(proc.stdout))
    first, second = outputs
    assert first["violations"] == [] and first["digest"] == second["digest"]
    assert first["command_counts"].get("AnnotatedEnqueue", 0) > 500
