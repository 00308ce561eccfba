"""Counterexamples found by the fuzzer, pinned as named scenarios (minimal command sequences).

A test marked xfail(strict=True) documents a machine bug that is not fixed yet: when the fix
lands it starts passing, strict xfail turns that into a failure, and the marker must go.
Fixed ones stay as plain regression tests.
"""

from __future__ import annotations

import pytest

import fifo
from fifo.commands import (
    Cancel,
    Checkout,
    Command,
    ConnectionId,
    ConsumerId,
    DeclareQueue,
    Enqueue,
    QueueConfig,
    Settle,
    SimplePrefetch,
)
from fifo.effects import Deliver, Effect
from fifo.fuzz.invariants import check_state
from fifo.meta import Meta
from fifo.replies import Error
from fifo.state import State

CONN = ConnectionId("n1", 1, 1)
LOW, HIGH = ConsumerId("low", CONN), ConsumerId("high", CONN)


def apply_all(state: State, version: int, commands: list[Command], first: int = 1) -> list[Effect]:
    effects: list[Effect] = []
    for offset, command in enumerate(commands):
        reply, out = fifo.apply(Meta(first + offset, 1, 1_000 + offset, version), command, state)
        assert not isinstance(reply, Error), (command, reply)
        effects += out
    return effects


def sac_v1_then_upgrade() -> State:
    """v1: SAC queue, `low` (priority 0) attaches first and is active, `high` (priority 2) waits;
    then the state is converted to v2 (v1 ignores priorities; v2 honours them)."""
    state = fifo.init_state(1)
    apply_all(state, 1, [
        DeclareQueue("q", QueueConfig(single_active_consumer=True)),
        Checkout("q", LOW, SimplePrefetch(5), priority=0),
        Checkout("q", HIGH, SimplePrefetch(5), priority=2),
    ])
    return fifo.convert(state, 1, 2, Meta(4, 1, 1_004, 2))


def test_upgrade_applies_sac_priority_takeover() -> None:
    """Found by `quorumq fuzz --seed 12 --steps 2000 --machine-version 1 --upgrade-at random`:
    right after the conversion, an idle lower-priority active consumer blocked a higher one
    (fixed in 1bc3932: convert_v1_to_v2 applies the v2 takeover rule)."""
    state = sac_v1_then_upgrade()
    assert [i for i, _ in check_state(state, {})] == []


def test_first_message_after_upgrade_goes_to_the_higher_priority_consumer() -> None:
    """The same scenario, as a client sees it: the next message went to `low`, not `high`."""
    state = sac_v1_then_upgrade()
    effects = apply_all(state, 2, [Enqueue("q", b"m")], first=5)
    assert [e.tag for e in effects if isinstance(e, Deliver)] == ["high"]


def test_fresh_v2_sac_queue_gives_the_higher_priority_consumer_the_message() -> None:
    """The v2 behaviour the upgraded state should match (passes today)."""
    state = fifo.init_state(2)
    effects = apply_all(state, 2, [
        DeclareQueue("q", QueueConfig(single_active_consumer=True)),
        Checkout("q", LOW, SimplePrefetch(5), priority=0),
        Checkout("q", HIGH, SimplePrefetch(5), priority=2),
        Enqueue("q", b"m"),
    ])
    assert [e.tag for e in effects if isinstance(e, Deliver)] == ["high"]
    assert check_state(state, {}) == []


def cancel_waiting_holder(version: int) -> tuple[State, list[Effect]]:
    """SAC: `low` takes m1 and cancels (keeps m1 pending); `high` attaches and is active; `low`
    checks out again (waits, still holding m1), then cancels again."""
    state = fifo.init_state(version)
    effects = apply_all(state, version, [
        DeclareQueue("q", QueueConfig(single_active_consumer=True)),
        Enqueue("q", b"m1"),
        Checkout("q", LOW, SimplePrefetch(1)),
        Checkout("q", LOW, Cancel()),
        Checkout("q", HIGH, SimplePrefetch(1)),
        Checkout("q", LOW, SimplePrefetch(1)),
        Checkout("q", LOW, Cancel()),
    ])
    return state, effects


@pytest.mark.parametrize("version", [1, 2])
def test_cancel_of_a_waiting_consumer_keeps_its_pending_messages(version: int) -> None:
    """Found by test_properties_sac (SacAgainstModel): enqueue, checkout low, cancel low,
    checkout high, checkout low, cancel low. Fixed: the cancelled holder keeps m1 until settled."""
    state, effects = cancel_waiting_holder(version)
    redelivered = [m.body for e in effects if isinstance(e, Deliver) and e.tag == "high"
                   for m in e.messages]
    assert redelivered == []
    queue = state.queues["q"]
    held = {c.tag: len(c.checked_out) for c in (*queue.consumers.values(), *queue.waiting)}
    assert held.get("low") == 1


def test_waiting_order_follows_credit_after_a_settle() -> None:
    """Found by test_properties_sac (SacV2AgainstModel), minimised by hand. Fixed: a settle or
    return by a waiting holder re-sorts the waiting list."""
    state = fifo.init_state(2)
    b, c = ConsumerId("b", CONN), ConsumerId("c", CONN)
    apply_all(state, 2, [
        DeclareQueue("q", QueueConfig(single_active_consumer=True)),
        Enqueue("q", b"m1"),
        Checkout("q", LOW, SimplePrefetch(2)),  # active, takes m1
        Checkout("q", LOW, Cancel()),  # cancelled, m1 pending
        Checkout("q", b, SimplePrefetch(1)),  # active
        Checkout("q", c, SimplePrefetch(2)),  # waits, credit 2
        Checkout("q", LOW, SimplePrefetch(2)),  # waits holding m1: credit 1, behind c
    ])
    queue = state.queues["q"]
    msg_id = next(iter(next(w for w in queue.waiting if w.tag == "low").checked_out))
    apply_all(state, 2, [Settle("q", LOW, (msg_id,))], first=8)  # credit 2, attached first
    assert [w.tag for w in queue.waiting] == ["low", "c"]


def test_fuzz_seed_125_v4_a_timeout_never_delivers_to_a_member_it_ends() -> None:
    """Found by `quorumq pipeline fuzz --seeds 200 --steps 5000 --machine-version 4` (one seed of
    200 failing, 2026-11-29; the same on 7207543, before v4's compact messages). At step 2449,
    `EvalConsumerTimeouts(queue='parts.0', consumer_keys=(2321,))`: member m666 of group gb, the
    only consumer of partitions parts.0-3, times out on parts.0; its messages there are returned,
    which puts parts.0 over its max length; the overflow is dead-lettered into parts.2 and
    parts.3, which deliver it at once to m666 (still their consumer); then the same command
    revokes m666 from every partition. The deliveries name a consumer the resulting state no
    longer has (the messages themselves are back in those queues). `--shrink` kept 2,234 of the
    2,450 entries: `quorumq fuzz --seed 125 --steps 2450 --machine-version 4 --shrink -o json`.
    Fixed: such deliveries are dropped from the command's effects (fifo/v4/registry.py)."""
    result = fifo.fuzz.run(125, 2450, 4)
    assert result.violations == [], [(v.step, v.invariant, v.detail) for v in result.violations]
