"""Dead-letters that go nowhere: say so in the leader's log (issue 34 item 1).

A queue configured with a dead-letter queue that does not exist (deleted after the declare, or
named in a config without being declared) drops what it dead-letters: the machine has nowhere to
put it, and every replica drops it the same way. Declares create the dead-letter queue and
`queue delete` warns, but a message dropped at run time used to leave no trace. Now every node
counts dropped messages (`quorumq_queue_messages_dropped_total`, cluster/node/metrics.py) and
the leader logs `dead_letter_dropped` naming the queue and its missing target: at once for the
first drop of a queue, then at most once per `REPORT_INTERVAL_S` per queue with the count since
the last line. A queue with no dead-letter queue configured discards as it was told to: no line.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from fifo.effects import DeadLettered
from raft.replica import Replica, ReplicaView
from raft.replicated import Outcome

log = structlog.get_logger("cluster.deadletters")

REPORT_INTERVAL_S = 60.0
QUEUES_TRACKED_MAX = 1000  # per-queue report times kept; the oldest is forgotten past it


class DropReporter:
    """Watches applied entries (inside the tick) for dead-letterings that dropped messages."""

    def __init__(
        self, replica: Callable[[], Replica], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._replica = replica
        self._clock = clock
        self._reported: dict[str, float] = {}  # queue -> when its last line was written
        self._unreported: dict[str, int] = {}  # queue -> messages dropped since that line

    def observe(self, outcome: Outcome, mine: bool) -> None:
        """Raft hook (`Replica`'s outcome observer): one applied entry, on every node."""
        for effect in outcome.effects:
            if type(effect) is DeadLettered and effect.target is None:
                self._dropped(effect)

    def _dropped(self, effect: DeadLettered) -> None:
        replica = self._replica()
        if replica.role() != "leader":
            return
        target = replica.read(lambda view: _missing_target(view, effect.queue))
        if target is None:
            return
        count = self._unreported.pop(effect.queue, 0) + effect.count
        now = self._clock()
        last = self._reported.get(effect.queue)
        if last is not None and now - last < REPORT_INTERVAL_S:
            self._unreported[effect.queue] = count
            return
        self._reported.pop(effect.queue, None)
        if len(self._reported) >= QUEUES_TRACKED_MAX:
            oldest = next(iter(self._reported))
            del self._reported[oldest]
            self._unreported.pop(oldest, None)
        self._reported[effect.queue] = now
        log.warning(
            "dead_letter_dropped",
            queue=effect.queue,
            dead_letter_queue=target,
            reason=effect.reason,
            messages=count,
            hint=f"declare {target!r} (or change the queue's dead-letter queue): until then "
            "what the queue dead-letters is dropped",
        )


def _missing_target(view: ReplicaView, queue: str) -> str | None:
    """The dead-letter queue `queue` is configured with, if that queue does not exist."""
    found = view.state.queues.get(queue)
    target = found.config.dead_letter_queue if found is not None else None
    if target is None or target in view.state.queues:
        return None  # none configured (a plain discard), or dropped for another reason
    return target
