"""Deliberately broken machines, to check that a campaign catches bugs (a mutation canary).

Pass one by name to `quorumq pipeline fuzz --apply-fn tests.pipeline.planted:lossy_enqueue`: a
campaign that reports no failure with it is not checking anything. Lives with the tests, not in
the installed package (the spark fixture puts the checkout on the executors' PYTHONPATH).
"""

from __future__ import annotations

import fifo
from fifo.commands import Command, Enqueue
from fifo.effects import Effect
from fifo.meta import Meta
from fifo.replies import Ok, Reply
from fifo.state import State

LOSE_ONE_IN = 3  # by Raft index, so the loss is deterministic for a seed


def lossy_enqueue(meta: Meta, command: Command, state: State) -> tuple[Reply, list[Effect]]:
    """fifo.apply, except that every third plain enqueue to an existing queue is acked and lost."""
    if (
        isinstance(command, Enqueue)
        and command.enqueuer is None
        and meta.index % LOSE_ONE_IN == 0
        and fifo.overview(state, command.queue) is not None
    ):
        return Ok(), []
    return fifo.apply(meta, command, state)
