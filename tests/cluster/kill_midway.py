"""Kill a node while a publisher runs, once it has `count` confirms: the failover tests' fault.

The watcher runs on a thread that ends with the `with` block, killed or not: one left polling a
publisher that failed before its count outlived its test.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from cluster.launcher import LocalCluster
from tests.background import Background

POLL_S = 0.005  # the kill lands within a few confirms of `count`


@contextlib.contextmanager
def kill_when_confirmed(
    cluster: LocalCluster, node_id: str, publisher: Any, count: int
) -> Iterator[threading.Event]:
    """Within the block, SIGKILL `node_id` once `publisher.confirmed >= count` (a threaded or a
    synced asyncio publisher); yields the Event set after the kill."""
    killed = threading.Event()
    with Background("kill-midway") as background:

        def kill_when_counted() -> None:
            while publisher.confirmed < count:
                if background.stop.wait(POLL_S):
                    return
            cluster.kill(node_id)
            killed.set()

        background.start(kill_when_counted, node_id)
        yield killed
        assert not background.errors, background.errors
