"""The simulated peer network, at pysyncobj's transport seam (`transportClass`).

A pair of members shares one connection, as with raft.transport (one TCP connection per pair):
- while it is up, each direction delivers in order (TCP) after a seeded per-message delay;
  a *flaky* direction instead loses, duplicates and reorders messages (a datagram network:
  more than TCP allows, but Raft must survive it);
- a partition blocks directions (both ways, or one way): messages in a blocked direction are
  dropped, and a connection with a blocked direction breaks after the connection timeout (its
  reader hears nothing), both ends told at once; messages still in flight on it are lost;
- a crashed node's connections break at once (the kernel resets them);
- a broken connection is re-dialed every `RETRY_S` while both ends are up and no direction is
  blocked: both ends are told it connected.
Every message goes through a real wire codec, so what arrives is a copy: `raft.peercodec`
(wire "quorumq", our transport's) or pysyncobj's own, `zlib(pysyncobj.pickle.dumps(message))`
read back with `pysyncobj.pickle.loads` (wire "pysyncobj", the `transport = "pysyncobj"` option:
the node installs `raft.safe_pickle`'s allow-list there, and its protocol-5 pickler), or
that pickle at protocol 2 (wire "pysyncobj2": what every peer running the code from before
8345617 sends, e.g. during a rolling upgrade from it; bytes as `_codecs.encode`, b"" as
`bytes()`, so the empty last chunk of each snapshot transfer needs `builtins.bytes` allowed;
the receivers run today's code); as pysyncobj's TcpConnection, a message that does not load
breaks its connection.
"""

from __future__ import annotations

import pickle
import random
import zlib
from dataclasses import dataclass
from typing import Any

import pysyncobj.pickle as pysyncobj_pickle
from pysyncobj.transport import Transport

from raft import peercodec
from raft.sim.clock import Handle, Scheduler, VirtualLoop

RETRY_S = 0.3  # as raft.node's connectionRetryTime
BROKEN_AFTER_S = 1.6  # as raft.node's connectionTimeout for election timeouts of (400, 800)
DELAY_S = (0.0005, 0.004)  # one-way delay range of a healthy link
DUPLICATE_RATE = 0.05  # on a flaky direction
LOSS_RATE = 0.1  # on a flaky direction
REORDER_SPREAD_S = 0.02  # extra random delay on a flaky direction (reorders)
SLOW_DELAY_S = (0.2, 1.4)  # extra in-order delay on a slow direction (under BROKEN_AFTER_S)
WIRES = ("quorumq", "pysyncobj", "pysyncobj2")
PYSYNCOBJ_ZLIB_LEVEL = 3  # as pysyncobj's TcpConnection
LEGACY_PICKLE_PROTOCOL = 2  # pysyncobj's own (pysyncobj.pickle), before raft.safe_pickle's 5


def encode_message(wire: str, message: Any) -> bytes:
    """A message's bytes on `wire`."""
    if wire == "pysyncobj":
        return zlib.compress(pysyncobj_pickle.dumps(message), PYSYNCOBJ_ZLIB_LEVEL)
    if wire == "pysyncobj2":
        body = pickle.dumps(message, LEGACY_PICKLE_PROTOCOL)
        return zlib.compress(body, PYSYNCOBJ_ZLIB_LEVEL)
    return peercodec.encode(message)


def decode_message(wire: str, body: bytes) -> Any:
    """The message in `body` (pysyncobj's loads is the allow-list unpickler once installed)."""
    if wire in ("pysyncobj", "pysyncobj2"):
        return pysyncobj_pickle.loads(zlib.decompress(body))
    return peercodec.decode(body)


@dataclass
class _Connection:
    epoch: int = 0
    up: bool = False
    blocked_since: float | None = None
    last_dial: float = -1e9


class SimNetwork:
    """Every link of the simulated cluster; the transports register here by address."""

    def __init__(
        self, scheduler: Scheduler, rng: random.Random, trace: list[Any], wire: str = "quorumq"
    ) -> None:
        assert wire in WIRES, wire
        self.wire = wire
        self.scheduler = scheduler
        self.rng = rng
        self.trace = trace
        self.transports: dict[str, SimTransport] = {}
        self.blocked: set[tuple[str, str]] = set()  # (from, to) addresses
        self.flaky: set[tuple[str, str]] = set()
        self.slow: set[tuple[str, str]] = set()
        self._connections: dict[tuple[str, str], _Connection] = {}
        self._last_arrival: dict[tuple[str, str], float] = {}
        self.loop = VirtualLoop(scheduler, "network")
        self.messages = 0
        self.errors: list[str] = []  # exceptions the node code raised on a message

    def start(self) -> None:
        """Begin the connection upkeep (every RETRY_S of virtual time)."""
        self.loop.call_soon(self._upkeep)

    def _pair(self, a: str, b: str) -> _Connection:
        key = (a, b) if a < b else (b, a)
        conn = self._connections.get(key)
        if conn is None:
            conn = self._connections[key] = _Connection()
        return conn

    def connected(self, a: str, b: str) -> bool:
        """Whether a and b have a live connection."""
        return self._pair(a, b).up

    def send(self, source: str, target: str, message: Any) -> bool:
        """Queue `message` from source to target (False: no connection, as pysyncobj's)."""
        conn = self._pair(source, target)
        if not conn.up:
            return False
        if (source, target) in self.blocked:
            return True  # lost on the wire; the connection breaks later
        body = encode_message(self.wire, message)
        self.messages += 1
        copies = 1
        delay = self.rng.uniform(*DELAY_S)
        if (source, target) in self.flaky:
            if self.rng.random() < LOSS_RATE:
                return True
            copies += self.rng.random() < DUPLICATE_RATE
            delay += self.rng.uniform(0, REORDER_SPREAD_S)
            at = self.scheduler.now + delay
        else:
            if (source, target) in self.slow:
                delay += self.rng.uniform(*SLOW_DELAY_S)
            at = max(self.scheduler.now + delay, self._last_arrival.get((source, target), 0.0))
            self._last_arrival[(source, target)] = at
        for copy in range(copies):
            self.loop.call_at(at + copy * 0.001, self._arrive, source, target, conn.epoch, body)
        return True

    def _arrive(self, source: str, target: str, epoch: int, body: bytes) -> None:
        conn = self._pair(source, target)
        receiver = self.transports.get(target)
        if not conn.up or conn.epoch != epoch or receiver is None or not receiver.alive:
            return
        if self.wire == "quorumq":
            receiver.deliver(source, peercodec.decode(body))
            return
        try:
            message = decode_message(self.wire, body)
        except Exception:  # pysyncobj's TcpConnection: any failure to load disconnects
            self.trace.append(("undecodable", round(self.scheduler.now, 6), source, target))
            self.disconnect(source, target)
            return
        receiver.deliver(source, message)

    def _upkeep(self) -> None:
        """Break connections with a blocked direction (after the timeout), dial broken ones."""
        self.loop.call_later(RETRY_S, self._upkeep)
        now = self.scheduler.now
        addresses = sorted(self.transports)
        for i, a in enumerate(addresses):
            for b in addresses[i + 1 :]:
                self._keep(a, b, now)

    def _keep(self, a: str, b: str, now: float) -> None:
        conn = self._pair(a, b)
        ends = self.transports.get(a), self.transports.get(b)
        alive = all(t is not None and t.alive for t in ends)
        blocked = (a, b) in self.blocked or (b, a) in self.blocked
        if conn.up:
            if not alive:
                self.disconnect(a, b)
            elif blocked:
                conn.blocked_since = conn.blocked_since if conn.blocked_since else now
                if now - conn.blocked_since >= BROKEN_AFTER_S:
                    self.disconnect(a, b)
            else:
                conn.blocked_since = None
            return
        knows = alive and ends[0].knows(b) and ends[1].knows(a)  # type: ignore[union-attr]
        if knows and not blocked and now - conn.last_dial >= RETRY_S:
            conn.last_dial = now
            conn.up, conn.epoch, conn.blocked_since = True, conn.epoch + 1, None
            self.trace.append(("connect", round(now, 6), a, b))
            for here, there in ((a, b), (b, a)):
                self.transports[here].connected(there)

    def disconnect(self, a: str, b: str) -> None:
        """Break the a-b connection now (messages in flight are lost); live ends are told."""
        conn = self._pair(a, b)
        if not conn.up:
            return
        conn.up, conn.epoch = False, conn.epoch + 1
        self.trace.append(("disconnect", round(self.scheduler.now, 6), a, b))
        for here, there in ((a, b), (b, a)):
            transport = self.transports.get(here)
            if transport is not None and transport.alive:
                transport.disconnected(there)

    def crashed(self, address: str) -> None:
        """A node died: every connection of it breaks at once."""
        for other in sorted(self.transports):
            if other != address:
                self.disconnect(address, other)


class SimTransport(Transport):  # type: ignore[misc]
    """pysyncobj's Transport over `SimNetwork` (what QuorumTransport is over TCP)."""

    network: SimNetwork  # set on the class by the simulator before a node is built
    _constructing = True

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        super().__init__(syncObj, selfNode, otherNodes)
        self._node = syncObj
        self.address = selfNode.id
        self.loop: VirtualLoop = syncObj.loop
        self._nodes: dict[str, Any] = {node.id: node for node in otherNodes}
        self.alive = True
        self.network.transports[self.address] = self

    @property
    def ready(self) -> bool:
        """Always bound: there is no port."""
        return True

    def tryGetReady(self) -> None:
        """Nothing to bind."""

    def waitReady(self) -> None:
        """Nothing to bind."""

    def knows(self, address: str) -> bool:
        """Whether `address` is one of this node's peers (members dial and answer members)."""
        return address in self._nodes

    def addNode(self, node: Any) -> None:
        """A member joins (a membership entry reached the log)."""
        self._nodes[node.id] = node

    def dropNode(self, node: Any) -> None:
        """A member leaves: its connection breaks."""
        self._nodes.pop(node.id, None)
        self.network.disconnect(self.address, node.id)

    def send(self, node: Any, message: Any) -> bool:
        """Send to a peer if connected."""
        if not self.alive:
            return False
        return self.network.send(self.address, node.id, message)

    def deliver(self, source: str, message: Any) -> None:
        """A message arrived (on the network's loop: run it as the node's loop would)."""
        node = self._nodes.get(source)
        if node is not None:
            self.loop.run_now(self._deliver_now, node, message)

    def _deliver_now(self, node: Any, message: Any) -> None:
        try:
            self._onMessageReceived(node, message)
        except Exception as err:  # LoopPoller logs it and goes on; here it is a finding
            self.network.errors.append(
                f"{self.address} receiving {type(message).__name__}: {err!r}"
            )
            self._node._stop_if_damaged()
        self._node._ticker.tick_now()  # as LoopPoller after a socket event

    def connected(self, address: str) -> None:
        """The connection to `address` is up."""
        node = self._nodes.get(address)
        if node is not None:
            self.loop.run_now(self._onNodeConnected, node)

    def disconnected(self, address: str) -> None:
        """The connection to `address` broke."""
        node = self._nodes.get(address)
        if node is not None:
            self.loop.run_now(self._onNodeDisconnected, node)

    def destroy(self) -> None:
        """The node stops (cleanly or by a crash): its connections break."""
        if self.alive:
            self.alive = False
            self.network.crashed(self.address)


__all__ = ["Handle", "SimNetwork", "SimTransport"]
