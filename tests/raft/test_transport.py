"""raft.transport with real sockets and a real 3-member pysyncobj cluster in this process.

Every thing a stranger can send is refused after at most a few bytes, logged once per
connection, and changes nothing. The issue's attack (a 2^31 length prefix, then zeros without
end, at every node at once while the leader commits) runs against node processes in
test_transport_process.py: here three attacker threads and three nodes would share one GIL,
and the test would measure the interpreter, not the transport (issue 34).

The trio is shared by the module's tests, but each test gets it only after a health check (a
leader that commits within a few seconds); a trio that lost its leader is rebuilt, never
handed on.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

import fifo
from cluster.launcher import free_ports, wait_until
from fifo.commands import DeclareQueue, Enqueue
from fifo.replies import Ok
from raft import transport
from raft.entry import Entry
from raft.node import RaftNode, RaftSettings
from raft.replicated import Outcome

SECRET = "secret-for-transport-tests"
ELECTION_TIMEOUT_MS = (1500, 3000)
HEALTH_TIMEOUT_S = 10.0


class Trio:
    """Three RaftNodes in this process on loopback, and the outcomes each produced.

    The configuration has a fourth member, `ghost`, that never runs (3 of 4 are a majority):
    its identity is the tests' to borrow, with the largest address, so every node accepts its
    dial (pysyncobj: the larger address dials) and no real node competes for its connection.
    """

    def __init__(self, root: Path) -> None:
        addresses = sorted(f"127.0.0.1:{port}" for port in free_ports(4))
        self.ids = ["n1", "n2", "n3"]
        self.ghost = addresses[-1]
        self.addresses = dict(zip(self.ids, addresses[:3], strict=True))
        self.outcomes: dict[int, Outcome] = {}
        self.changed = threading.Condition()
        self.next_batch = 1
        self.nodes: dict[str, RaftNode] = {}
        for nid in self.ids:
            settings = RaftSettings(
                node_id=nid,
                address=self.addresses[nid],
                peers={
                    **{p: a for p, a in self.addresses.items() if p != nid},
                    "ghost": self.ghost,
                },
                data_dir=root / nid,
                password=SECRET,
                supported_version=2,
                incarnation=1,
                # margin: the three nodes share this process (and its GIL) with the tests, on a
                # host that may be loaded; these tests are about bytes on the wire, not timing
                election_timeout_ms=ELECTION_TIMEOUT_MS,
            )
            self.nodes[nid] = RaftNode(settings, self._on_outcome)
        wait_until(lambda: self.leader() is not None, 30, "a leader")

    def _on_outcome(self, outcome: Outcome) -> None:
        with self.changed:
            if outcome.origin is not None:
                self.outcomes[outcome.origin[2]] = outcome
            self.changed.notify_all()

    def leader(self) -> str | None:
        for nid, node in self.nodes.items():
            if node.role() == "leader":
                return nid
        return None

    def run(self, *commands: Any) -> list[Any]:
        """Submit one batch through the leader and wait until it is applied there."""
        replies = self.try_run(*commands, timeout_s=10)
        assert replies is not None, "the trio's leader did not commit within 10 s"
        return replies

    def try_run(self, *commands: Any, timeout_s: float) -> list[Any] | None:
        """`run`, or None when there is no leader or the batch is not applied in time."""
        leader = self.leader()
        if leader is None:
            return None
        batch = self.next_batch
        self.next_batch += 1
        blobs = tuple(fifo.encode(c) for c in commands)
        entry = Entry("cmds", int(time.time() * 1000), (leader, 1, batch), cmds=blobs)
        self.nodes[leader].submit(entry)
        with self.changed:
            if not self.changed.wait_for(lambda: batch in self.outcomes, timeout=timeout_s):
                return None
        return self.outcomes[batch].replies

    def healthy(self) -> bool:
        """A leader that commits (a declare of the tests' queue, idempotent) within a few
        seconds, with every node up."""
        if any(not node.tick_thread_alive() for node in self.nodes.values()):
            return False
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.try_run(DeclareQueue("q"), timeout_s=HEALTH_TIMEOUT_S) is not None:
                return True
            time.sleep(0.05)  # no leader yet: an election may be under way
        return False

    def terms(self) -> dict[str, int]:
        return {nid: node.status(with_digest=False)["term"] for nid, node in self.nodes.items()}

    def close(self) -> None:
        for node in self.nodes.values():
            node.destroy_synchronous()


@pytest.fixture(scope="module")
def trio_holder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Trio]]:
    """The module's trio (a one-item list: the health check may replace it), closed at the end."""
    holder = [Trio(tmp_path_factory.mktemp("trio"))]
    yield holder
    holder[0].close()


@pytest.fixture
def trio(trio_holder: list[Trio], tmp_path_factory: pytest.TempPathFactory) -> Trio:
    """The shared trio after a health check: a trio that cannot commit is rebuilt first, so no
    test inherits another test's lost cluster."""
    if not trio_holder[0].healthy():
        trio_holder[0].close()
        trio_holder[0] = Trio(tmp_path_factory.mktemp("trio"))
        assert trio_holder[0].healthy(), "a fresh trio did not commit"
    return trio_holder[0]


def _dial(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def _closed_by_peer(sock: socket.socket, timeout: float = 5.0) -> bool:
    """Whether the other end closes (reads EOF or a reset) within `timeout`."""
    sock.settimeout(timeout)
    try:
        while True:
            if not sock.recv(4096):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def _handshake(address: str, claimed: str, secret: str) -> tuple[socket.socket, bytes, bytes]:
    """Authenticate as member `claimed` (a dialer); returns the socket and both frame keys."""
    key = transport.cluster_key(secret)
    sock = _dial(address)
    nonce = os.urandom(transport.NONCE_BYTES)
    raw = claimed.encode()
    sock.sendall(transport.HELLO_HEAD.pack(transport.MAGIC, 1, nonce, len(raw)) + raw)
    data = b""
    while len(data) < transport.CHALLENGE.size:
        chunk = sock.recv(transport.CHALLENGE.size - len(data))
        assert chunk, "the listener closed before its challenge"
        data += chunk
    _magic, _version, their_nonce, mac = transport.CHALLENGE.unpack(data)
    assert mac == transport._mac(key, b"L", nonce, their_nonce, raw)
    sock.sendall(transport._mac(key, b"D", nonce, their_nonce, raw))
    send_key = transport._mac(key, b"dl", nonce, their_nonce)
    recv_key = transport._mac(key, b"ld", nonce, their_nonce)
    return sock, send_key, recv_key


def _events(logs: list[Any], name: str) -> list[Any]:
    return [entry for entry in logs if entry["event"] == name]


def _spare(trio: Trio) -> tuple[str, str]:
    """The ghost member's address (an identity a test may borrow) and a node that accepts it."""
    return trio.ghost, trio.addresses["n1"]


def test_a_stranger_gets_nothing_unpickled_and_each_connection_is_logged_once(
    trio: Trio, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple[Any, ...]:
            return (open, (str(marker), "w"))

    payload = pickle.dumps(Exploit(), protocol=2)
    attempts = [
        struct.pack("<i", len(payload)) + payload,  # a bare pickle, pysyncobj-framed
        struct.pack("<i", len(payload)) + zlib.compress(payload),  # as pysyncobj sends them
        payload,  # no framing at all
        os.urandom(4096),  # garbage
        struct.pack(">I", 2**31 - 1) + b"\0" * 100_000,  # an oversized length
    ]
    address = trio.addresses[trio.leader() or "n1"]
    ours: list[str] = []  # our connections as the node sees them (host:port)

    def refused() -> list[str]:  # only ours: another test's leftover process may dial this port
        return [e["peer"] for e in _events(logs, "peer_refused") if e["peer"] in ours]

    with capture_logs() as logs:
        for data in attempts:
            sock = _dial(address)
            host, port = sock.getsockname()[:2]
            ours.append(f"{host}:{port}")
            with contextlib.suppress(OSError):  # closed while we were still sending: the point
                sock.sendall(data)
            assert _closed_by_peer(sock)
            sock.close()
        wait_until(lambda: len(refused()) >= len(attempts), 5, "the logs")
    assert not marker.exists()
    assert sorted(refused()) == sorted(ours)  # every connection refused, one line each
    assert trio.run(Enqueue("q", b"after-strangers")) == [Ok()]


def test_a_node_speaking_pysyncobj_transport_is_refused_with_a_clear_message(trio: Trio) -> None:
    """What an older quorumq node sends first: a length, then a Fernet token."""
    with capture_logs() as logs:
        sock = _dial(trio.addresses["n1"])
        sock.sendall(struct.pack("<i", 120) + b"gAAAAABl" + b"x" * 112)
        assert _closed_by_peer(sock)
        sock.close()
        wait_until(lambda: _events(logs, "peer_refused"), 5, "the log line")
    assert "pysyncobj's transport" in _events(logs, "peer_refused")[0]["reason"]


def test_a_wrong_secret_cannot_join_either_way(trio: Trio) -> None:
    claimed, address = _spare(trio)
    # as a dialer: the listener's proof does not verify with our key, and our proof is refused
    with capture_logs() as logs:
        key = transport.cluster_key("not-the-secret")
        sock = _dial(address)
        nonce = os.urandom(transport.NONCE_BYTES)
        raw = claimed.encode()
        sock.sendall(transport.HELLO_HEAD.pack(transport.MAGIC, 1, nonce, len(raw)) + raw)
        data = sock.recv(transport.CHALLENGE.size)
        _m, _v, their_nonce, mac = transport.CHALLENGE.unpack(data)
        assert mac != transport._mac(key, b"L", nonce, their_nonce, raw)
        sock.sendall(transport._mac(key, b"D", nonce, their_nonce, raw))
        assert _closed_by_peer(sock)
        sock.close()
        wait_until(lambda: _events(logs, "peer_auth_failed"), 5, "the log line")
    # a replayed proof of a real handshake does not fit a fresh challenge
    with capture_logs() as logs:
        real_key = transport.cluster_key(SECRET)
        sock = _dial(address)
        sock.sendall(transport.HELLO_HEAD.pack(transport.MAGIC, 1, nonce, len(raw)) + raw)
        data = sock.recv(transport.CHALLENGE.size)
        _m, _v, fresh_nonce, _mac = transport.CHALLENGE.unpack(data)
        assert fresh_nonce != their_nonce
        sock.sendall(transport._mac(real_key, b"D", nonce, their_nonce, raw))  # old challenge
        assert _closed_by_peer(sock)
        sock.close()
        wait_until(lambda: _events(logs, "peer_auth_failed"), 5, "the log line")
    # a name that is no member gets no challenge at all
    with capture_logs() as logs:
        sock = _dial(address)
        raw = b"10.0.0.1:9"
        sock.sendall(transport.HELLO_HEAD.pack(transport.MAGIC, 1, nonce, len(raw)) + raw)
        assert _closed_by_peer(sock)
        sock.close()
        wait_until(lambda: _events(logs, "peer_refused"), 5, "the log line")
    assert _events(logs, "peer_refused")[0]["reason"] == "not a member"


def test_forged_replayed_and_spliced_frames_are_refused(trio: Trio) -> None:
    """A member's handshake (the test holds the secret), then frames that must not pass."""
    claimed, address = _spare(trio)
    heartbeat = {"type": "no_such_message_type"}  # harmless if accepted: pysyncobj ignores it
    cases: dict[str, Callable[[bytes], bytes]] = {
        "forged": lambda key: transport.encode_frame(os.urandom(32), 0, heartbeat),
        "replayed": lambda key: transport.encode_frame(key, 0, heartbeat) * 2,
        "reordered": lambda key: transport.encode_frame(key, 1, heartbeat),
        "oversized": lambda key: struct.pack(">I", transport.FRAME_BYTES_MAX + 1) + b"\0" * 64,
    }
    other, other_key, _ = _handshake(address, claimed, SECRET)
    cases["spliced"] = lambda key: transport.encode_frame(other_key, 0, heartbeat)
    for name, make in cases.items():
        with capture_logs() as logs:
            sock, send_key, _recv_key = _handshake(address, claimed, SECRET)
            sock.sendall(make(send_key))
            assert _closed_by_peer(sock), name
            sock.close()
            wait_until(lambda: _events(logs, "peer_frame_refused"), 5, f"the {name} log line")
        assert len(_events(logs, "peer_frame_refused")) == 1, name
    other.close()
    # the real members' connections were never touched; the cluster still commits
    assert trio.run(Enqueue("q", b"after-frames")) == [Ok()]


def test_unauthenticated_connections_are_bounded_and_have_a_deadline(trio: Trio) -> None:
    address = trio.addresses["n2"]
    pending = trio.nodes["n2"]._SyncObj__transport._unknownConnections
    idle = [_dial(address) for _ in range(transport.PENDING_AUTH_MAX)]
    # the condition the next lines assume: every slot taken (accepted on n2's loop, in its time)
    wait_until(lambda: len(pending) >= transport.PENDING_AUTH_MAX, 10, "the idle ones accepted")
    extra = _dial(address)
    assert _closed_by_peer(extra, timeout=2)
    extra.close()
    started = time.monotonic()
    assert all(_closed_by_peer(sock, timeout=transport.AUTH_TIMEOUT_S + 3) for sock in idle)
    assert time.monotonic() - started < transport.AUTH_TIMEOUT_S + 3
    for sock in idle:
        sock.close()
    assert trio.run(Enqueue("q", b"after-idle")) == [Ok()]


def test_a_cluster_with_a_wrong_secret_member_does_not_let_it_in(tmp_path: Path) -> None:
    """n3 runs with another secret: n1 + n2 commit, n3 never connects to either."""
    trio_ports = free_ports(3)
    addresses = {f"n{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(trio_ports)}
    nodes = []
    try:
        for nid, secret in (("n1", SECRET), ("n2", SECRET), ("n3", "another-secret")):
            settings = RaftSettings(
                node_id=nid,
                address=addresses[nid],
                peers={p: a for p, a in addresses.items() if p != nid},
                data_dir=tmp_path / nid,
                password=secret,
                supported_version=2,
                incarnation=1,
            )
            nodes.append(RaftNode(settings, lambda outcome: None))
        wait_until(lambda: any(n.role() == "leader" for n in nodes[:2]), 20, "a leader")
        time.sleep(1.0)
        assert not nodes[2].peer_connected("n1") and not nodes[2].peer_connected("n2")
        assert not nodes[0].peer_connected("n3") and not nodes[1].peer_connected("n3")
        assert nodes[2].role() != "leader" and nodes[2].leader_id() is None
    finally:
        for node in nodes:
            node.destroy_synchronous()
