"""The peer transport follows membership changes: a removed member's dial is refused, an added
one's is answered (real sockets, three RaftNodes in this process)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import FAIL_REASON
from structlog.testing import capture_logs

from cluster.launcher import wait_until
from fifo.commands import DeclareQueue
from raft.membership import Member, MemberChange, Refusal
from tests.raft.test_transport import SECRET, Trio, _closed_by_peer, _events, _handshake

# larger than every loopback address of the trio, so a node waits for its dial (never dials it)
NEWBIE = Member("newbie", "127.0.0.2:1", "127.0.0.2:2")


@pytest.fixture
def trio(tmp_path: Path) -> Iterator[Trio]:
    t = Trio(tmp_path)
    t.run(DeclareQueue("q"))  # the leader's first entries are applied: changes are accepted
    yield t
    t.close()


def change(trio: Trio, proposed: MemberChange) -> tuple[Any, Refusal | None]:
    """Submit a change through the leader and wait for its outcome there."""
    leader = trio.leader()
    assert leader is not None
    done = threading.Event()
    got: list[tuple[Any, Refusal | None]] = []

    def callback(reply: Any, refusal: Refusal | None) -> None:
        got.append((reply, refusal))
        done.set()

    trio.nodes[leader].change_membership(proposed, callback)
    assert done.wait(10)
    return got[0]


def members(trio: Trio, *extra: Member) -> tuple[Member, ...]:
    rows = [Member(n, a, f"127.0.0.1:{i + 1}") for i, (n, a) in enumerate(trio.addresses.items())]
    return tuple(sorted([*rows, *extra]))


def test_removed_members_are_refused_and_added_ones_answered(trio: Trio) -> None:
    """remove ghost: its dial gets no challenge; add newbie: its handshake completes."""
    _reply, refusal = change(trio, MemberChange("remove", "ghost", trio.ghost, members(trio)))
    assert refusal is None, refusal
    wait_until(lambda: all("ghost" not in n.status()["members"] for n in trio.nodes.values()), 10)
    with capture_logs() as logs:
        sock = _handshake_refused(trio.addresses["n1"], trio.ghost)
        sock.close()
        wait_until(lambda: _events(logs, "peer_refused"), 5, "the log line")
    assert _events(logs, "peer_refused")[0]["reason"] == "not a member"
    _reply, refusal = change(
        trio, MemberChange("add", "newbie", NEWBIE.raft, members(trio, NEWBIE))
    )
    assert refusal is None, refusal
    wait_until(lambda: all("newbie" in n.status()["members"] for n in trio.nodes.values()), 10)
    # a challenge comes back only for a member's hello (`_handshake` checks it and its MAC)
    sock, _send, _recv = _handshake(trio.addresses["n1"], NEWBIE.raft, SECRET)
    sock.close()


def test_the_leader_refuses_a_duplicate_and_its_own_removal_with_a_reason(trio: Trio) -> None:
    """The checks made when the leader appends: each refusal says why and changes nothing."""
    leader = trio.leader()
    assert leader is not None
    others = tuple(m for m in members(trio) if m.id != leader)
    ghost = Member("ghost", trio.ghost, "127.0.0.9:9")
    duplicate = Member("again", trio.addresses["n2"], "127.0.0.9:8")
    _reply, refusal = change(
        trio, MemberChange("remove", leader, trio.addresses[leader], (*others, ghost))
    )
    assert refusal is not None and "is the leader" in refusal.message
    _reply, refusal = change(
        trio, MemberChange("add", "again", duplicate.raft, (*members(trio), ghost, duplicate))
    )
    assert refusal is not None and "is used by two members" in refusal.message
    # a malformed change payload is refused by the leader, never appended as an entry
    node = trio.nodes[leader]
    before = node.status()["log_len"]
    outcome: list[int] = []
    done = threading.Event()

    def denied(_result: Any, error: int) -> None:
        outcome.append(error)
        done.set()

    node._applyCommand(b"\xa1bopcbad", denied, 2)  # 2: pysyncobj's MEMBERSHIP entry type
    assert done.wait(10) and outcome == [FAIL_REASON.REQUEST_DENIED]
    assert node.status()["log_len"] == before
    assert all(n.status()["members"] == ["ghost", "n1", "n2", "n3"] for n in trio.nodes.values())


def _handshake_refused(address: str, claimed: str) -> Any:
    import os
    import socket

    from raft import transport

    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    raw = claimed.encode()
    nonce = os.urandom(transport.NONCE_BYTES)
    sock.sendall(transport.HELLO_HEAD.pack(transport.MAGIC, 1, nonce, len(raw)) + raw)
    assert _closed_by_peer(sock)
    return sock
