"""Seeded random logs over both versions, checking the machine's internal bookkeeping.

The property tests check observable invariants against a model; this test checks what only the
implementation knows: byte counters, the service ring, no message in two places, and that
validation (not the last-resort exception guard) rejects every bad command.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

import fifo
from fifo import commands as c
from fifo.replies import CheckoutOk, DequeueOk, Error, Ok
from fifo.state import Queue, State, inflate

CONNS = [c.ConnectionId(n, 1, i) for n in ("n1", "n2") for i in range(2)]
CIDS = [c.ConsumerId(t, cn) for t in ("a", "b") for cn in CONNS]
STOPS: list[c.CheckoutSpec] = [c.Cancel(), c.Remove(), c.Dequeue(True), c.Dequeue(False)]


def check_queue(q: Queue) -> None:
    """Counters match contents; SAC has one active; the service ring is consistent."""
    holders = (*q.consumers.values(), *q.waiting)
    held = [m for x in holders for m in x.checked_out.values()]
    waiting_msgs = [*map(inflate, q.ready), *map(inflate, q.returns)]
    assert q.messages_total == len(waiting_msgs) + len(held)
    assert q.bytes_ready == sum(len(m.body) for m in waiting_msgs)
    assert q.bytes_checkout == sum(len(m.body) for m in held)
    assert len({id(m) for m in (*held, *waiting_msgs)}) == len(held) + len(waiting_msgs)
    if q.config.single_active_consumer:
        assert sum(x.status in ("up", "quiescing") for x in q.consumers.values()) <= 1
    for x in q.consumers.values():
        if not x.credited and not x.once:
            assert 0 <= x.credit <= x.prefetch
    for prio, ring in q.service.items():
        assert ring and len(set(map(repr, ring))) == len(ring)
        for key in ring:
            x = q.consumers[key]
            assert x.in_service and x.priority == prio


def check(state: State) -> None:
    """Check every queue."""
    for q in state.queues.values():
        check_queue(q)


class Driver:
    """Generates semi-valid commands against a live state."""

    def __init__(self, seed: int, version: int) -> None:
        self.rng = random.Random(seed)
        self.state = fifo.init_state(version)
        self.keys: list[c.ConsumerKey] = []
        self.seqs: dict[str, int] = {}
        self.index = 0
        self.time = 0

    def config(self, queue: str) -> c.QueueConfig:
        r = self.rng
        dlq = r.choice([None, "q", "r", "zz"])
        return c.QueueConfig(
            single_active_consumer=r.random() < 0.4, delivery_limit=r.choice([None, 0, 1, 3]),
            max_length=r.choice([None, 2, 5]), max_bytes=r.choice([None, 10]),
            overflow=r.choice(["drop_head", "reject_publish"]),
            message_ttl_ms=r.choice([None, 50, 500]),
            dead_letter_queue=None if dlq == queue else dlq,
            consumer_timeout_ms=r.choice([100, 1000]), disconnected_timeout_ms=r.choice([0, 100]),
        )  # fmt: skip

    def key(self) -> c.ConsumerKey:
        if self.keys and self.rng.random() < 0.7:
            return self.rng.choice(self.keys)
        return self.rng.choice(CIDS)

    def command(self) -> object:
        r = self.rng
        q = r.choice(["q", "r"])
        ids = tuple(r.randrange(6) for _ in range(r.randrange(3)))
        options: list[Callable[[], object]] = [
            lambda: c.DeclareQueue(q, self.config(q)),
            lambda: c.UpdateConfig(q, self.config(q)),
            lambda: c.Enqueue(q, b"x" * r.randrange(5), ttl_ms=r.choice([None, 0, 20])),
            lambda: c.Enqueue(
                q, b"y", "p", self.seqs.get(q, 1) + r.choice([0, 0, -1, 1]), r.choice(CONNS)
            ),
            lambda: c.RegisterEnqueuer(q, "p", r.choice(CONNS)),
            lambda: c.Checkout(
                q, r.choice(CIDS), c.SimplePrefetch(r.randrange(4)), priority=r.randrange(3)
            ),
            lambda: c.Checkout(q, r.choice(CIDS), c.Credited(r.choice([0, 2**32 - 2]))),
            lambda: c.Checkout(
                q,
                r.choice(CIDS),
                r.choice(STOPS),
            ),
            lambda: c.Settle(q, self.key(), ids),
            lambda: c.Settle(q, self.key(), ids),
            lambda: c.Return(q, self.key(), ids),
            lambda: c.Discard(q, self.key(), ids),
            lambda: c.Modify(q, self.key(), ids, r.random() < 0.5, r.random() < 0.5, (("k", 1),)),
            lambda: c.Credit(
                q, self.key(), r.randrange(4), r.choice([0, 1, 2**32 - 1]), r.random() < 0.3
            ),
            lambda: c.RenewLocks(q, self.key(), ids),
            lambda: c.Purge(q),
            lambda: c.ConnectionDown(r.choice(CONNS), r.choice(["normal", "noconnection"])),
            lambda: c.NodeDown(r.choice(["n1", "n2"])),
            lambda: c.NodeUp(r.choice(["n1", "n2"])),
            lambda: c.DeleteQueue(q) if r.random() < 0.1 else c.Purge(q),
        ]
        if r.random() < 0.15:
            due = fifo.due_commands(self.state, self.time)
            return r.choice(due) if due else c.Expire(q)
        return r.choice(options)()

    def step(self) -> None:
        self.index += 1
        self.time += self.rng.choice([0, 1, 10, 100, 1000])
        if self.state.version == 1 and self.rng.random() < 0.01:
            meta = fifo.Meta(self.index, 1, self.time, 2)
            self.state = fifo.convert(self.state, 1, 2, meta)
            return
        cmd = self.command()
        before = fifo.digest(self.state) if self.rng.random() < 0.05 else None
        meta = fifo.Meta(self.index, 1, self.time, self.state.version)
        reply, _ = fifo.apply(meta, cmd, self.state)
        if isinstance(reply, Error):
            assert not reply.message.startswith("rejected:"), (cmd, reply)
            assert before is None or before == fifo.digest(self.state), (cmd, reply)
        if isinstance(reply, CheckoutOk | DequeueOk) and reply.consumer_key is not None:
            self.keys.append(reply.consumer_key)
        if isinstance(cmd, c.Enqueue) and cmd.seq is not None and reply == Ok():
            self.seqs[cmd.queue] = max(self.seqs.get(cmd.queue, 1), cmd.seq + 1)
        check(self.state)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("seed", range(6))
def test_random_logs_keep_the_bookkeeping_consistent(seed: int, version: int) -> None:
    """Every step keeps counters, rings and placement consistent; snapshots round-trip."""
    driver = Driver(seed, version)
    for _ in range(600):
        driver.step()
    state = driver.state
    assert fifo.digest(fifo.restore(fifo.snapshot(state))) == fifo.digest(state)
