"""Leader-side timers, outside the log: they only submit commands, which come back through it.

Every tick, on the leader only: `fifo.due_commands` (consumer timeouts when a lock expired,
expiry, disconnected timeouts), `NodeDown` / `NodeUp` for lost and returned peers (deduplicated
against the replicated list of down nodes), and the machine upgrade once every member supports it.
A command is not resubmitted while an identical one is in flight (`resubmit_s`).
"""

from __future__ import annotations

import time
from typing import Any

import structlog

import fifo
from fifo.commands import NodeDown, NodeUp
from raft.batcher import GroupCommitter
from raft.entry import Entry, Origin
from raft.node import RaftNode

log = structlog.get_logger("cluster.timers")


class LeaderTimers:
    """Decides, on the leader, which timer commands to submit now."""

    def __init__(
        self,
        node: RaftNode,
        committer: GroupCommitter,
        down_after_s: float = 1.5,
        resubmit_s: float = 2.0,
    ) -> None:
        self.node = node
        self.committer = committer
        self.down_after_s = down_after_s
        self.resubmit_s = resubmit_s
        self._in_flight: dict[bytes, float] = {}
        self._lost_since: dict[str, float] = {}
        self.submitted: list[Any] = []  # every timer command submitted (for status and tests)

    def tick(self, now_ms: int | None = None) -> None:
        """Run one round; does nothing unless this node is the leader and applying."""
        if self.node.role() != "leader":
            self._lost_since.clear()
            return
        now_ms = self.node.now_ms() if now_ms is None else now_ms
        with self.node.lock:
            state = self.node.replicated_state
            due = list(fifo.due_commands(state.state, now_ms))
            down_nodes = list(state.meta.down_nodes)
            target = state.upgrade_target()
        for command in due + self._node_changes(down_nodes):
            self._submit(command)
        if target is not None:
            self._upgrade(target)

    def _node_changes(self, down_nodes: list[str]) -> list[Any]:
        changes: list[Any] = []
        now = time.monotonic()
        me = self.node.settings.node_id
        if me in down_nodes:
            # an earlier leader lost us and we now lead: no peer would ever see us come back,
            # so our own consumers would stay suspected (nothing delivered to them) for ever
            changes.append(NodeUp(me))
        for peer in self.node.settings.peers:
            if self.node.peer_connected(peer):
                self._lost_since.pop(peer, None)
                if peer in down_nodes:
                    changes.append(NodeUp(peer))
            else:
                since = self._lost_since.setdefault(peer, now)
                if now - since >= self.down_after_s and peer not in down_nodes:
                    changes.append(NodeDown(peer))
        return changes

    def _fresh(self, key: bytes) -> bool:
        now = time.monotonic()
        if now - self._in_flight.get(key, -1e9) < self.resubmit_s:
            return False
        self._in_flight = {k: t for k, t in self._in_flight.items() if now - t < self.resubmit_s}
        self._in_flight[key] = now
        return True

    def _submit(self, command: Any) -> None:
        blob = fifo.encode(command)
        if not self._fresh(blob):
            return
        self.submitted.append(command)
        log.info("timer_command", command=type(command).__name__, detail=repr(command)[:200])
        self.committer.submit(blob, _ignore, command)

    def _upgrade(self, target: int) -> None:
        if not self._fresh(f"upgrade:{target}".encode()):
            return
        log.info("machine_upgrade_proposed", to=target)
        now = self.node.now_ms()

        def make(origin: Origin) -> Entry:
            return Entry("upgrade", now, origin, version=target)

        self.committer.submit_entry(make, _ignore)


def _ignore(_reply: Any) -> None:
    """Timer commands need no reply: their effect comes back through the log."""
