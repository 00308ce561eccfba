"""The node server's session layer, as much of it as a simulated member runs.

`SimSessions` is one incarnation's shell around its replica, with the real parts of
`cluster.node`: its `EffectRouter` (which client connections are live), its `LeaderTimers`
(NodeDown / NodeUp for lost and returned members, the leader bringing itself up, the machine's
timeouts), and `NodeServer._reconcile_connections` (ConnectionDown through the log, retried,
for every connection of this incarnation that the state lists and no session serves), called
on this shell as the node server's periodic task calls it on itself, every PERIOD_S (the
server's TIMER_PERIOD_S when the planted-bug seeds of tests/raft/sim were found; it is 200 ms
now, with production's longer idle heartbeat: raft.sim.cluster.ClusterParams keeps that one too).
A client session that closes submits its ConnectionDown once, as `ClientSession._closed` does;
a new incarnation records itself with a hello retried until it commits, as `NodeServer._hello`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cluster.node.effects import EffectRouter
from cluster.node.server import NodeServer
from cluster.node.timers import LeaderTimers
from fifo.commands import ConnectionDown, ConnectionId
from raft.errors import SubmitError
from raft.replica import Replica
from raft.sim.clock import VirtualLoop

HELLO_RETRY_S = 0.5  # as NodeServer._hello after a failed submit
PERIOD_S = 0.1


def _reconcile_connections(shell: SimSessions) -> None:
    """The node server's method, run on this shell (it reads stopping, replica, node_id,
    incarnation, router and _down_submitted, as SimSessions has them); looked up at each call,
    so a test that replaces it on NodeServer replaces it here too."""
    reconcile: Callable[[Any], None] = NodeServer._reconcile_connections
    reconcile(shell)


class SimSessions:
    """One node incarnation's client sessions and periodic task (timers, reconciliation)."""

    def __init__(self, replica: Replica, loop: VirtualLoop, incarnation: int) -> None:
        self.replica = replica
        self.loop = loop
        self.node_id = replica.settings.node_id
        self.incarnation = incarnation
        self.router = EffectRouter(self.node_id, incarnation)
        self.router.use_replica(replica)
        self.timers = LeaderTimers(replica)
        self.stopping = False
        self._down_submitted: dict[int, float] = {}
        self._leaderless_since: float | None = loop.time()  # NodeServer's read gate state
        self.loop.call_later(PERIOD_S, self._periodic)

    def say_hello(self) -> None:
        """Record this incarnation through the log (its apply closes the old incarnation's
        connections), again every HELLO_RETRY_S while the submit fails and the node applies,
        as NodeServer._hello."""
        self.replica.propose_hello(self._on_hello)

    def _on_hello(self, reply: Any) -> None:
        if isinstance(reply, SubmitError) and self.replica.stopped_reason is None:
            self.loop.call_later(HELLO_RETRY_S, self.say_hello)

    def _periodic(self) -> None:
        """The node server's periodic task (less its status file and disk checks)."""
        self.loop.call_later(PERIOD_S, self._periodic)
        if self.replica.storage_damage() is not None:
            return  # the real node exits (65); a crash fault brings it back
        _server_method("_track_leader")(self)
        self.timers.tick()
        _reconcile_connections(self)
        self.router.reconcile()

    def _leader_problem(self) -> str | None:
        """NodeServer._leader_problem on this shell (its read gate calls it)."""
        return _server_method("_leader_problem")(self)  # type: ignore[no-any-return]

    def read_refusal(self) -> str | None:
        """Why the node server would refuse a data query now (None: it answers it)."""
        return _server_method("unavailable_reason")(self, True)  # type: ignore[no-any-return]

    def open(self, connection: ConnectionId) -> None:
        """A client session attached (its frames are not simulated: the workload reads replies)."""
        self.router.register(connection, _discard)

    def close(self, connection: ConnectionId) -> None:
        """A client session closed: unregister it and submit its ConnectionDown once, if the
        state lists it (as `ClientSession._closed`); a failed submit is left to reconciliation."""
        if not self.router.is_live(connection.number):
            return
        self.router.unregister(connection)
        if self.replica.read(lambda view: view.lists_connection(connection)):
            self.replica.propose(ConnectionDown(connection, "normal"), _discard)


def _server_method(name: str) -> Callable[..., Any]:
    """A NodeServer method, looked up at each call (a test may replace it), for this shell."""
    method: Callable[..., Any] = getattr(NodeServer, name)
    return method


def _discard(_value: Any) -> None:
    """Frames to a simulated client and replies nobody waits for."""
