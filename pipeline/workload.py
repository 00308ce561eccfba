"""A seeded, realistic queue workload run through the replicated machine, written as a log export.

Used by `scripts/make_log.py` and the benchmarks, so that analysing a large log needs no cluster.
The workload has `services` independent services, each with a work queue (delivery limit 3,
dead-lettering into its own `<name>.dlq`); every third service's queue is single-active-consumer.
Publishers publish bodies of 16..160 bytes; consumers (prefetch 10) ack most deliveries, return
some, reject a few, and sometimes hold one past the consumer timeout; consumers come and go and
connections drop. Entries batch 1..8 commands as the nodes' group commit does; three nodes say
hello and the cluster upgrades early on to `machine_version` (default the newest released; at
least 2: consumer timeouts need v2; 4, unreleased, keeps bodies in the log: its deliveries come
as `RefDeliver` and are observed the same, so a seed gives the same commands at v3 and v4).
Every entry goes through `ReplicatedState.apply_entry`, exactly as on a node, so the end
record's digests are the real ones.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fifo
from fifo.commands import (
    Checkout,
    ConnectionDown,
    ConnectionId,
    ConsumerId,
    DeclareQueue,
    Discard,
    Enqueue,
    QueueConfig,
    Return,
    Settle,
    SimplePrefetch,
)
from fifo.effects import ConsumerCancelled, Deliver, RefDeliver, Released
from raft import SUB_INDEX_SPAN, Entry
from raft.logfile import EndRecord, EntryRecord, Header, LoggedCommand, LogWriter
from raft.replicated import ReplicatedState

NODES = ("n1", "n2", "n3")
CONSUMER_TIMEOUT_MS = 5_000
PREFETCH = 10
MACHINE_VERSION_MIN = 2  # consumer timeouts
DELIVERIES = (Deliver, RefDeliver)  # v4 delivers by reference; the msg ids are the same


@dataclass
class _Consumer:
    cid: ConsumerId
    queue: str
    key: Any = None
    pending: list[int] = field(default_factory=list)
    stuck: bool = False  # holds its deliveries past the consumer timeout


@dataclass
class WorkloadStats:
    """What `write_log` produced."""

    path: str
    bytes: int
    entries: int
    commands: int
    seconds: float
    fifo_digest: str
    counts: dict[str, int]


class _Sim:
    def __init__(self, seed: int, services: int, machine_version: int) -> None:
        self.machine_version = machine_version
        self.rng = random.Random(seed)
        self.rs = ReplicatedState(list(NODES))
        self.index = 0
        self.now = 1_700_000_000_000
        self.conn_no = 0
        self.queues = [f"svc-{i}" for i in range(services)]
        self.consumers: dict[tuple[str, Any], _Consumer] = {}
        self.by_queue: dict[str, list[_Consumer]] = {q: [] for q in self.queues}
        self.publishers: dict[str, tuple[str, ConnectionId, int]] = {}
        self.counts: dict[str, int] = {}

    def connection(self) -> ConnectionId:
        self.conn_no += 1
        return ConnectionId(self.rng.choice(NODES), 1, self.conn_no)

    def entry(self, entry: Entry) -> tuple[EntryRecord, list[Any]]:
        """Apply an entry as a node does; its export record and the effects."""
        self.index += 1
        version = self.rs.meta.effective_version
        outcome = self.rs.apply_entry(self.index, 1, entry, self.machine_version)
        now = self.rs.meta.last_time_ms
        base: dict[str, Any] = {"index": self.index, "term": 1, "ts_ms": entry.ts_ms}
        if entry.kind == "cmds":
            commands = tuple(
                LoggedCommand(fifo.Meta(self.index * SUB_INDEX_SPAN + i, 1, now, version), blob)
                for i, blob in enumerate(entry.cmds)
            )
            return EntryRecord("cmds", commands=commands, **base), outcome.effects
        if entry.kind == "hello":
            record = EntryRecord("hello", node=entry.node, version=entry.version,
                                 incarnation=entry.incarnation, **base)  # fmt: skip
            return record, outcome.effects
        applied = self.rs.meta.effective_version != version
        record = EntryRecord("upgrade", version=entry.version, from_version=version,
                             applied=applied, **base)  # fmt: skip
        return record, outcome.effects

    def next_commands(self) -> list[Any]:
        rng = self.rng
        out: list[Any] = []
        for _ in range(rng.randint(1, 8)):
            out.append(self.one_command())
        return out

    def one_command(self) -> Any:
        rng = self.rng
        queue = rng.choice(self.queues)
        roll = rng.random()
        consumers = self.by_queue[queue]
        if roll < 0.003 or len(consumers) < 2:
            return self.churn(queue)
        pending = [c for c in consumers if c.pending and not c.stuck]
        if roll < 0.48 and pending:
            c = rng.choice(pending)
            count = min(len(c.pending), rng.randint(1, 3))
            ids, c.pending = tuple(c.pending[:count]), c.pending[count:]
            fate = rng.random()
            if fate < 0.9:
                return Settle(queue, c.key, ids)
            if fate < 0.97:
                return Return(queue, c.key, ids)
            return Discard(queue, c.key, ids)
        pub = self.publishers.get(queue)
        if pub is None or rng.random() < 0.0005:
            pub = (f"p{self.conn_no}", self.connection(), 1)
        name, conn, seq = pub
        self.publishers[queue] = (name, conn, seq + 1)
        body = rng.randbytes(rng.randint(16, 160))
        return Enqueue(queue, body, name, seq, conn)

    def churn(self, queue: str) -> Any:
        consumers = self.by_queue[queue]
        if len(consumers) >= 3 and self.rng.random() < 0.5:
            victim = self.rng.choice(consumers)
            return ConnectionDown(victim.cid.connection, "normal")
        cid = ConsumerId(f"c{self.conn_no}", self.connection())
        c = _Consumer(cid, queue, cid, stuck=self.rng.random() < 0.1)
        self.consumers[(queue, cid)] = c
        consumers.append(c)
        return Checkout(queue, cid, SimplePrefetch(PREFETCH))

    def observe(self, effects: list[Any]) -> None:
        for effect in effects:
            kind = type(effect)
            if kind in DELIVERIES:
                c = self._find(effect.queue, effect.tag, effect.connection)
                if c is not None:
                    c.key = effect.consumer_key
                    c.pending.extend(d.msg_id for d in effect.messages)
            elif kind is Released:
                c = self._find(effect.queue, effect.tag, effect.connection)
                if c is not None:
                    c.pending = [i for i in c.pending if i not in effect.msg_ids]
                    c.stuck = False
            elif kind is ConsumerCancelled:
                c = self._find(effect.queue, effect.tag, effect.connection)
                if c is not None:
                    self._drop(c)

    def _find(self, queue: str, tag: str, conn: ConnectionId) -> _Consumer | None:
        c = self.consumers.get((queue, ConsumerId(tag, conn)))
        if c is not None and c not in self.by_queue[queue]:
            self.by_queue[queue].append(c)
        return c

    def _drop(self, c: _Consumer) -> None:
        self.consumers.pop((c.queue, c.cid), None)
        if c in self.by_queue[c.queue]:
            self.by_queue[c.queue].remove(c)


def check_machine_version(version: int) -> None:
    """ValueError unless the workload can run at machine `version` (2 up to the newest one,
    released or not; the caller gates unreleased ones)."""
    if type(version) is not int or not MACHINE_VERSION_MIN <= version <= max(fifo.MACHINES):
        raise ValueError(
            f"machine version {version!r}: the workload runs at {MACHINE_VERSION_MIN} to "
            f"{max(fifo.MACHINES)} (consumer timeouts need v2)"
        )


def write_log(
    path: Path,
    target_bytes: int,
    seed: int = 1,
    services: int = 8,
    machine_version: int = fifo.LATEST_VERSION,
) -> WorkloadStats:
    """Write a log export of about `target_bytes` to `path`, the cluster upgraded to
    `machine_version` before the first declare."""
    check_machine_version(machine_version)
    started = time.perf_counter()
    sim = _Sim(seed, services, machine_version)
    counts: dict[str, int] = {}
    commands = 0
    with LogWriter.open(path) as writer:
        writer.write(Header("n1", "make_log", 0, sim.now))

        def put(entry: Entry) -> list[Any]:
            nonlocal commands
            record, effects = sim.entry(entry)
            writer.write(record)
            commands += len(record.commands)
            return effects

        for node in NODES:
            put(Entry("hello", sim.now, None, node=node, version=machine_version,
                      incarnation=1))  # fmt: skip
        put(Entry("upgrade", sim.now, None, version=machine_version))
        declares = []
        for number, queue in enumerate(sim.queues):
            dlq = f"{queue}.dlq"
            declares.append(fifo.encode(DeclareQueue(dlq)))
            config = QueueConfig(
                single_active_consumer=number % 3 == 2,
                delivery_limit=3,
                dead_letter_queue=dlq,
                consumer_timeout_ms=CONSUMER_TIMEOUT_MS,
            )
            declares.append(fifo.encode(DeclareQueue(queue, config)))
        put(Entry("cmds", sim.now, None, cmds=tuple(declares)))
        while writer.bytes_written < target_bytes:
            sim.now += sim.rng.randint(0, 4)
            due = fifo.due_commands(sim.rs.state, sim.now) if sim.index % 16 == 0 else []
            batch = due or sim.next_commands()
            for command in batch:
                name = type(command).__name__
                counts[name] = counts.get(name, 0) + 1
            sim.observe(put(Entry("cmds", sim.now, None, cmds=tuple(map(fifo.encode, batch)))))
        state = sim.rs
        writer.write(
            EndRecord(
                sim.index, commands, sim.index, state.meta.effective_version, state.digest(),
                fifo.digest(state.state),
            )
        )  # fmt: skip
        size = writer.bytes_written
    return WorkloadStats(
        str(path), size, sim.index, commands, round(time.perf_counter() - started, 3),
        fifo.digest(sim.rs.state), counts,
    )  # fmt: skip
