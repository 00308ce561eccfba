"""Machine version 3: v2's per-queue handlers plus message groups (`fifo/v3/grouped.py`).

v3 is assembled from feature classes, each in its own module and each leaving queues that do not
use the feature to the code below it (v2): a later v3 feature adds its module and its class to
the bases of `QueueMachineV3`, and its handlers to `__init__`.
"""

from __future__ import annotations

from fifo.commands import AnnotatedEnqueue, PurgeGroup
from fifo.v3.grouped import GroupedQueue
from fifo.v3.partitioned import PartitionedQueue


class QueueMachineV3(GroupedQueue, PartitionedQueue):
    """Per-queue command handlers of machine version 3."""

    def __init__(self) -> None:
        super().__init__()
        self.handlers[AnnotatedEnqueue] = self.enqueue_annotated
        self.handlers[PurgeGroup] = self.purge_group
