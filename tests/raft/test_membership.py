"""raft.membership and the member set in the replicated metadata (in process, no sockets)."""

from __future__ import annotations

from pathlib import Path

import cbor2
import pytest

import fifo
from fifo.commands import Checkout, ConnectionId, ConsumerId, DeclareQueue, Enqueue, SimplePrefetch
from fifo.replies import Error, Ok
from raft import membership
from raft.entry import Entry
from raft.errors import StorageError
from raft.membership import Member, MemberChange, MemberSet, MembershipError
from raft.replicated import ReplicatedState
from tests.must import must

FOUNDERS = (
    Member("n1", "127.0.0.1:7001", "127.0.0.1:8001"),
    Member("n2", "127.0.0.1:7002", "127.0.0.1:8002"),
    Member("n3", "127.0.0.1:7003", "127.0.0.1:8003"),
)
N4 = Member("n4", "127.0.0.1:7004", "127.0.0.1:8004")


def add_n4() -> MemberChange:
    return MemberChange("add", "n4", N4.raft, (*FOUNDERS, N4))


def remove_n3(*extra: Member) -> MemberChange:
    return MemberChange("remove", "n3", FOUNDERS[2].raft, (*FOUNDERS[:2], *extra))


def test_a_change_round_trips_as_cbor_and_garbage_is_refused() -> None:
    """Changes encode to CBOR (never a pickle) and decode back; anything else is refused."""
    for change in (add_n4(), remove_n3()):
        payload = membership.encode_change(change)
        assert not payload.startswith(b"\x80")  # no pickle protocol header
        assert membership.decode_change(payload) == change
    bad = [
        b"\x80\x02garbage",
        cbor2.dumps({"op": "rename", "node": "n4", "raft": N4.raft, "members": []}),
        # the set after an add must hold the added node, with the same raft address
        cbor2.dumps(
            {"op": "add", "node": "n4", "raft": N4.raft, "members": [["n1", "a:1", "b:1"]]}
        ),
        cbor2.dumps({"op": "add", "node": "n4", "raft": "127.0.0.1:9", "members": [N4.to_plain()]}),
        # two members on one address
        cbor2.dumps(
            {
                "op": "add",
                "node": "n4",
                "raft": N4.raft,
                "members": [N4.to_plain(), ["n5", N4.raft, "127.0.0.1:1"]],
            }
        ),
    ]
    for payload in bad:
        with pytest.raises(MembershipError):
            membership.decode_change(payload)


def test_the_members_file_round_trips_and_any_flipped_byte_refuses_the_start(
    tmp_path: Path,
) -> None:
    """The persisted member set is checksummed: every single flipped byte is caught."""
    member_set = MemberSet(42, (*FOUNDERS, N4))
    membership.write_member_set(tmp_path, member_set)
    path = tmp_path / membership.MEMBERS_FILE
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert membership.read_member_set(tmp_path) == member_set
    data = path.read_bytes()
    for at in range(len(data)):
        damaged = bytearray(data)
        damaged[at] ^= 0x01
        path.write_bytes(bytes(damaged))
        with pytest.raises(StorageError, match="node recover n9"):
            membership.read_member_set(tmp_path, "n9")
    path.write_bytes(data[:-3])
    with pytest.raises(StorageError, match="members"):
        membership.read_member_set(tmp_path)
    assert membership.read_member_set(tmp_path / "nothing-here") is None


def test_a_committed_add_then_remove_switches_the_member_set_and_records_addresses() -> None:
    """add n4, remove n3: members and addresses follow; the removed node's versions go."""
    state = ReplicatedState(["n1", "n2", "n3"])
    for index, node in enumerate(("n1", "n2", "n3"), start=2):
        state.apply_entry(index, 1, Entry("hello", 1, None, node=node, version=2, incarnation=5), 2)
    outcome = state.apply_member_change(10, 1, add_n4())
    assert outcome.replies == [Ok()]
    assert state.meta.members == ["n1", "n2", "n3", "n4"]
    assert state.meta.last_index == 10
    assert state.meta.addresses["n4"] == (N4.raft, N4.client)
    assert state.upgrade_target() is None  # n4 has not said which versions it supports
    outcome = state.apply_member_change(11, 1, remove_n3(N4))
    assert outcome.replies == [Ok()]
    assert state.meta.members == ["n1", "n2", "n4"]
    assert "n3" not in state.meta.supported and "n3" not in state.meta.addresses


def test_a_change_that_does_not_fit_the_member_set_changes_nothing() -> None:
    """Adding a member twice, removing a non-member: an error reply, the state untouched."""
    state = ReplicatedState(["n1", "n2", "n3"])
    before = state.digest()
    bad_add = MemberChange("add", "n2", FOUNDERS[1].raft, FOUNDERS)
    bad_remove = MemberChange("remove", "n4", N4.raft, FOUNDERS)
    for change in (bad_add, bad_remove):
        (reply,) = state.apply_member_change(12, 1, change).replies
        assert isinstance(reply, Error)
    assert state.meta.members == ["n1", "n2", "n3"]
    assert state.meta.addresses == {}
    # only the index moved: the digest differs by last_index alone
    state.meta.last_index = 0
    assert state.digest() == before


def test_removing_a_member_closes_its_client_connections_so_its_messages_come_back() -> None:
    """A consumer attached through n3 holds a message; removing n3 returns it to the queue."""
    state = ReplicatedState(["n1", "n2", "n3"])
    conn = ConnectionId("n3", 5, 1)
    commands = [
        DeclareQueue("q"),
        Enqueue("q", b"body"),
        Checkout("q", ConsumerId("c", conn), SimplePrefetch(10)),
    ]
    blobs = tuple(fifo.encode(c) for c in commands)
    outcome = state.apply_entry(3, 1, Entry("cmds", 1000, None, cmds=blobs), 2)
    assert outcome.effects  # delivered to the consumer on n3
    assert must(fifo.overview(state.state, "q")).checked_out == 1
    state.apply_member_change(4, 1, remove_n3())
    overview = must(fifo.overview(state.state, "q"))
    assert overview.checked_out == 0 and overview.total == 1
    assert "n3" not in state.meta.connections or not state.meta.connections["n3"]


def test_the_member_set_survives_a_snapshot_and_older_snapshots_still_restore() -> None:
    """Addresses are in the snapshot once recorded; a snapshot without them restores empty."""
    state = ReplicatedState(["n1", "n2", "n3"])
    plain_before = state.meta.to_plain()
    assert "addresses" not in plain_before  # digests of clusters that never changed are as before
    state.apply_member_change(7, 1, add_n4())
    restored = ReplicatedState(["x"])
    restored.restore(state.snapshot())
    assert restored.digest() == state.digest()
    assert restored.meta.addresses == state.meta.addresses
    old = ReplicatedState(["x"])
    old.restore({**ReplicatedState(["n1"]).snapshot()})
    assert old.meta.addresses == {}
