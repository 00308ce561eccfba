"""The leader's `dead_letter_dropped` line: one at once, then at most one per interval per queue
with the count since (cluster/node/deadletters.py); the real-process side is in
test_node_metrics.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from structlog.testing import capture_logs

from cluster.node.deadletters import REPORT_INTERVAL_S, DropReporter
from fifo.commands import QueueConfig
from fifo.effects import DeadLettered


class FakeReplica:
    """Just what the reporter asks of a replica: its role and a read of the state."""

    def __init__(self, queues: dict[str, Any], role: str = "leader") -> None:
        self.state = SimpleNamespace(queues=queues)
        self._role = role

    def role(self) -> str:
        return self._role

    def read(self, function: Any) -> Any:
        return function(SimpleNamespace(state=self.state))


def _queue(dead_letter_queue: str | None) -> Any:
    return SimpleNamespace(config=QueueConfig(dead_letter_queue=dead_letter_queue))


def _outcome(*effects: Any) -> Any:
    return SimpleNamespace(effects=list(effects))


def test_drops_into_a_missing_queue_are_reported_once_per_interval_with_counts() -> None:
    now = [0.0]
    replica = FakeReplica({"jobs": _queue("jobs.dlq"), "plain": _queue(None)})
    reporter = DropReporter(lambda: replica, clock=lambda: now[0])  # type: ignore[arg-type,return-value]
    with capture_logs() as logs:
        reporter.observe(_outcome(DeadLettered("jobs", "rejected", 2, None)), True)
        reporter.observe(_outcome(DeadLettered("plain", "rejected", 5, None)), True)
        now[0] = REPORT_INTERVAL_S / 2
        reporter.observe(_outcome(DeadLettered("jobs", "expired", 3, None)), True)
        now[0] = REPORT_INTERVAL_S + 1
        reporter.observe(_outcome(DeadLettered("jobs", "expired", 1, None)), True)
    lines = [(e["queue"], e["dead_letter_queue"], e["messages"]) for e in logs]
    assert lines == [("jobs", "jobs.dlq", 2), ("jobs", "jobs.dlq", 4)]


def test_nothing_is_reported_by_a_follower_or_for_a_moved_dead_letter() -> None:
    queues = {"jobs": _queue("jobs.dlq"), "jobs.dlq": _queue(None), "lost": _queue("gone")}
    with capture_logs() as logs:
        follower = DropReporter(lambda: FakeReplica(queues, role="follower"))  # type: ignore[arg-type,return-value]
        follower.observe(_outcome(DeadLettered("lost", "rejected", 1, None)), False)
        leader = DropReporter(lambda: FakeReplica(queues))  # type: ignore[arg-type,return-value]
        leader.observe(_outcome(DeadLettered("jobs", "rejected", 1, "jobs.dlq")), False)
        leader.observe(_outcome(DeadLettered("jobs", "rejected", 1, None)), False)  # hop limit
    assert logs == []
