"""raft.replicated and raft.entry: applying entries, snapshots, versions, failures (in process)."""

from __future__ import annotations

import random
from typing import Any

import cbor2
import pytest

import fifo
from fifo.commands import (
    Checkout,
    ConnectionDown,
    ConnectionId,
    ConsumerId,
    DeclareQueue,
    Enqueue,
    Settle,
    SimplePrefetch,
)
from fifo.effects import Deliver
from fifo.replies import CheckoutOk, DeclareOk, Error
from raft import entry as entries
from raft.entry import Entry, decode_entry, encode_entry
from raft.errors import EntryError, VersionTooOldError
from raft.replicated import ReplicatedState

MEMBERS = ["n1", "n2", "n3"]
CONN = ConnectionId("n1", 7, 1)


def cmds(*commands: Any, ts: int = 1000) -> Entry:
    return Entry("cmds", ts, ("n1", 7, 1), cmds=tuple(fifo.encode(c) for c in commands))


def hello(node: str, version: int, incarnation: int = 1) -> Entry:
    return Entry("hello", 1000, None, node=node, version=version, incarnation=incarnation)


def cluster_state(version: int = 2) -> ReplicatedState:
    rs = ReplicatedState(MEMBERS)
    for i, node in enumerate(MEMBERS):
        rs.apply_entry(2 + i, 1, hello(node, version, incarnation=7), supported=2)
    return rs


def test_entry_round_trips_and_garbage_is_an_entry_error() -> None:
    """Every entry kind encodes and decodes back; garbage raises EntryError."""
    for entry in (cmds(DeclareQueue("q")), hello("n1", 2), Entry("upgrade", 5, None, version=2)):
        assert decode_entry(encode_entry(entry)) == entry
    for blob in (b"\xff", cbor2.dumps([1]), cbor2.dumps({"k": "nope", "ts": 1})):
        with pytest.raises(EntryError):
            decode_entry(blob)


def test_commands_in_one_entry_get_distinct_sub_indexes() -> None:
    """Two checkouts in one entry get distinct consumer keys derived from index*span+position."""
    rs = cluster_state()
    rs.apply_entry(9, 1, Entry("upgrade", 1000, None, version=2), supported=2)
    rs.apply_entry(10, 1, cmds(DeclareQueue("q")), supported=2)
    out = rs.apply_entry(
        11,
        1,
        cmds(
            Checkout("q", ConsumerId("a", CONN), SimplePrefetch(1)),
            Checkout("q", ConsumerId("b", CONN), SimplePrefetch(1)),
        ),
        supported=2,
    )
    keys = [r.consumer_key for r in out.replies if isinstance(r, CheckoutOk)]
    assert keys == [entries.command_index(11, 0), entries.command_index(11, 1)]


def test_snapshot_restore_gives_an_equal_digest() -> None:
    """A restored snapshot has the same digest and applies the next entry identically."""
    rs = cluster_state()
    rs.apply_entry(
        10, 1, cmds(DeclareQueue("q"), *[Enqueue("q", b"m%d" % i) for i in range(20)]), 2
    )
    copy = ReplicatedState(MEMBERS)
    copy.restore(cbor2.loads(cbor2.dumps(rs.snapshot())))
    assert copy.digest() == rs.digest()
    nxt = cmds(Checkout("q", ConsumerId("c", CONN), SimplePrefetch(5)))
    assert rs.apply_entry(11, 1, nxt, 2).effects == copy.apply_entry(11, 1, nxt, 2).effects
    assert copy.digest() == rs.digest()


def test_an_exception_in_apply_is_not_contained_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """A raising machine's exception leaves apply_entry (raft.node is the one containment point):
    the commands before it applied, none after it did."""
    rs = cluster_state()
    real_apply = fifo.apply

    def flaky(meta: Any, command: Any, state: Any) -> Any:
        if isinstance(command, Enqueue) and command.body == b"boom":
            raise RuntimeError("bug")
        return real_apply(meta, command, state)

    monkeypatch.setattr(fifo, "apply", flaky)
    with pytest.raises(RuntimeError, match="bug"):
        rs.apply_entry(
            10, 1, cmds(DeclareQueue("q"), Enqueue("q", b"boom"), Enqueue("q", b"ok")), 2
        )
    assert fifo.overview(rs.state, "q").total == 0  # type: ignore[union-attr]


def test_undecodable_command_is_refused_alone() -> None:
    """A command blob that does not decode gets an Error; its neighbours apply."""
    rs = cluster_state()
    bad = Entry("cmds", 1, None, cmds=(fifo.encode(DeclareQueue("q")), b"\xff\x00"))
    out = rs.apply_entry(10, 1, bad, 2)
    assert isinstance(out.replies[0], DeclareOk) and isinstance(out.replies[1], Error)
    assert fifo.list_queues(rs.state) == ["q"]


def test_upgrade_waits_for_every_member_and_converts_at_its_index() -> None:
    """No target while a member supports only v1; once all support v2 the switch is recorded."""
    rs = ReplicatedState(MEMBERS)
    rs.apply_entry(2, 1, hello("n1", 2), 2)
    rs.apply_entry(3, 1, hello("n2", 2), 2)
    rs.apply_entry(4, 1, hello("n3", 1), 2)
    assert rs.upgrade_target() is None
    refused = rs.apply_entry(5, 1, Entry("upgrade", 1, None, version=2), 2)
    assert isinstance(refused.replies[0], Error) and "n3 supports 1" in refused.replies[0].message
    assert rs.meta.effective_version == 1
    rs.apply_entry(6, 1, hello("n3", 2, incarnation=2), 2)
    assert rs.upgrade_target() == 2
    rs.apply_entry(7, 1, Entry("upgrade", 1, None, version=2), 2)
    assert rs.meta.effective_version == 2 and rs.meta.switches == [(7, 2)]
    assert fifo.state_version(rs.state) == 2


def test_a_node_with_older_code_stops_before_changing_anything() -> None:
    """Applying a valid upgrade beyond this node's code raises before any change."""
    rs = cluster_state()
    digest = rs.digest()
    with pytest.raises(VersionTooOldError):
        rs.apply_entry(10, 1, Entry("upgrade", 1, None, version=2), supported=1)
    assert rs.digest() == digest
    rs.apply_entry(10, 1, Entry("upgrade", 1, None, version=2), supported=2)
    with pytest.raises(VersionTooOldError):
        rs.apply_entry(11, 1, cmds(DeclareQueue("q")), supported=1)


def test_an_older_node_is_refused_when_it_joins() -> None:
    """A hello below the effective version is refused and recorded as refused."""
    rs = cluster_state()
    rs.apply_entry(10, 1, Entry("upgrade", 1, None, version=2), 2)
    out = rs.apply_entry(11, 1, hello("n3", 1, incarnation=9), 2)
    assert isinstance(out.replies[0], Error) and "refused" in out.replies[0].message
    assert rs.meta.refused == {"n3": 1} and rs.meta.supported["n3"] == 2


def test_a_new_incarnation_closes_the_old_connections() -> None:
    """The hello of a restarted node applies ConnectionDown for its previous connections."""
    rs = cluster_state()
    rs.apply_entry(10, 1, Entry("upgrade", 1, None, version=2), 2)
    rs.apply_entry(11, 1, cmds(DeclareQueue("q"), Enqueue("q", b"a")), 2)
    rs.apply_entry(12, 1, cmds(Checkout("q", ConsumerId("c", CONN), SimplePrefetch(5))), 2)
    assert rs.meta.connections == {"n1": {(7, 1): None}}
    rs.apply_entry(13, 1, hello("n1", 2, incarnation=8), 2)
    assert rs.meta.connections == {"n1": {}}
    assert fifo.consumers(rs.state, "q") == []


def test_connection_down_forgets_the_connection() -> None:
    """ConnectionDown removes the connection from the metadata."""
    rs = cluster_state()
    rs.apply_entry(10, 1, cmds(DeclareQueue("q"), Enqueue("q", b"a", connection=CONN)), 2)
    assert (7, 1) in rs.meta.connections["n1"]
    rs.apply_entry(11, 1, cmds(ConnectionDown(CONN, "normal")), 2)
    assert rs.meta.connections["n1"] == {}


def test_deliveries_carry_the_consumer_connection() -> None:
    """Effects name the connection so only its node sends them."""
    rs = cluster_state()
    rs.apply_entry(10, 1, cmds(DeclareQueue("q"), Enqueue("q", b"a")), 2)
    out = rs.apply_entry(11, 1, cmds(Checkout("q", ConsumerId("c", CONN), SimplePrefetch(5))), 2)
    delivers = [e for e in out.effects if isinstance(e, Deliver)]
    assert delivers and delivers[0].connection == CONN


def test_a_restored_replica_closes_stale_connections_in_the_same_order_as_the_others() -> None:
    """Issue 17's root cause: a hello closes the node's connections of earlier incarnations, one
    ConnectionDown each, and each returns that connection's messages. A replica that applied the
    log kept them in the order they were first seen; one restored from a snapshot had them
    sorted: the messages came back in another order there, got other message ids, and a client
    of that replica that acked (key, id) settled a different message on the others (the ack
    "meant for 191 settled 192"). Every replica must apply them in one order."""
    live = cluster_state()
    late, early = ConnectionId("n1", 7, 5), ConnectionId("n1", 7, 3)
    live.apply_entry(10, 1, cmds(DeclareQueue("q")), supported=2)
    live.apply_entry(11, 1, cmds(*[Enqueue("q", b"m%d" % i) for i in range(4)]), supported=2)
    # the higher connection number is seen first: insertion order is not sorted order
    for index, conn in ((12, late), (13, early)):
        live.apply_entry(
            index, 1, cmds(Checkout("q", ConsumerId("c", conn), SimplePrefetch(2))), supported=2
        )
    restored = ReplicatedState(MEMBERS)
    restored.restore(cbor2.loads(cbor2.dumps(live.snapshot())))
    assert restored.digest() == live.digest()
    rejoin = Entry("hello", 1000, None, node="n1", version=2, incarnation=8)
    newcomer = ConnectionId("n2", 7, 1)
    later = cmds(Checkout("q", ConsumerId("new", newcomer), SimplePrefetch(1)))
    delivered = []
    for replica in (live, restored):
        replica.apply_entry(14, 1, rejoin, supported=2)
        outcome = replica.apply_entry(15, 1, later, supported=2)
        delivered.append(
            [m.body for e in outcome.effects if isinstance(e, Deliver) for m in e.messages]
        )
    assert delivered[0] == delivered[1]
    assert live.digest() == restored.digest()


def _random_log(seed: int, length: int) -> list[Entry]:
    """Commands from connections of three nodes, with restarts (hellos) in between."""
    rng = random.Random(seed)
    incarnation = {node: 7 for node in MEMBERS}
    log: list[Entry] = [cmds(DeclareQueue("q"))]
    if seed % 2:  # odd seeds run machine v2 (compact consumer keys), even ones stay on v1
        log.insert(0, Entry("upgrade", 1000, None, version=2))
    for _ in range(length):
        node = rng.choice(MEMBERS)
        roll = rng.random()
        if roll < 0.1:
            incarnation[node] += 1
            log.append(hello(node, 2, incarnation[node]))
            continue
        conn = ConnectionId(node, incarnation[node], rng.randint(1, 6))
        if roll < 0.45:
            command: Any = Enqueue("q", b"m%d" % rng.randint(0, 999), None, None, conn)
        elif roll < 0.7:
            command = Checkout("q", ConsumerId("c", conn), SimplePrefetch(rng.randint(1, 3)))
        elif roll < 0.8:
            command = ConnectionDown(conn, rng.choice(("normal", "noconnection")))
        else:
            command = Settle("q", rng.randint(1, 40) * 1024, (rng.randint(0, 5),))
        log.append(cmds(command))
    return log


@pytest.mark.parametrize("seed", range(6))
def test_restoring_a_snapshot_at_any_index_then_replaying_equals_replaying(seed: int) -> None:
    """The replica-level counterpart of fifo's equivalence: ReplicatedState (fifo state plus
    metadata such as connections by node) restored from a snapshot taken after any entry and
    fed the rest of the log ends with the digest of the replica that applied it all."""
    log = _random_log(seed, 120)
    full = cluster_state()
    snapshots = []
    for offset, entry in enumerate(log):
        full.apply_entry(10 + offset, 1, entry, supported=2)
        snapshots.append(cbor2.loads(cbor2.dumps(full.snapshot())))
    for cut in range(0, len(log), 7):
        replica = ReplicatedState(MEMBERS)
        replica.restore(snapshots[cut])
        for offset in range(cut + 1, len(log)):
            replica.apply_entry(10 + offset, 1, log[offset], supported=2)
        assert replica.digest() == full.digest(), f"seed {seed}, restored after entry {cut}"
