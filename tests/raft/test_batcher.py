"""The group committer (raft.batcher) against a node that never answers some entries.

Found by the simulator (seed 367 of the 10,000-seed campaign, and the liveness check on a healed
cluster): a leader cut off with entries in flight, caught up by a snapshot after it stepped
down, never hears of those entries again (pysyncobj answers a proposal only when it applies its
index one by one), and with `inflight_max` of them unanswered the committer held every new
command of the node until its 10 s sweep.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from pysyncobj import FAIL_REASON

from raft.batcher import GroupCommitter
from raft.errors import SubmitError


class _SilentNode:
    """What the committer uses of a RaftNode; records submissions, answers none by itself."""

    def __init__(self) -> None:
        self.settings = SimpleNamespace(node_id="n1", incarnation=1)
        self.callbacks: list[Any] = []

    def submit(self, _entry: Any, callback: Any = None) -> None:
        self.callbacks.append(callback)

    def disk_full(self) -> bool:
        return False

    def hand_decoded(self, _batch_id: int, _decoded: Any) -> None:
        pass

    def forget_decoded(self, _batch_id: int) -> None:
        pass


async def _submit_and_settle(committer: GroupCommitter, replies: list[Any], blob: bytes) -> None:
    committer.submit(blob, replies.append)
    await asyncio.sleep(0.01)  # the window (1 ms) and the end of the loop iteration


def _committer(node: _SilentNode, stuck_s: float) -> GroupCommitter:
    loop = asyncio.get_running_loop()
    return GroupCommitter(node, loop, inflight_max=3, stuck_s=stuck_s)  # type: ignore[arg-type]


def test_unanswered_entries_hold_new_commands_no_longer_than_stuck_s() -> None:
    async def scenario() -> int:
        node = _SilentNode()
        committer = _committer(node, stuck_s=0.1)
        replies: list[Any] = []
        for k in range(3):
            await _submit_and_settle(committer, replies, b"old-%d" % k)
        assert len(node.callbacks) == 3  # three entries in flight, none answered
        await _submit_and_settle(committer, replies, b"new")
        assert len(node.callbacks) == 3, "young entries in flight hold a new one (bigger entries)"
        await asyncio.sleep(0.3)  # the three are older than stuck_s now
        return len(node.callbacks)

    assert asyncio.run(scenario()) == 4


def test_answered_entries_release_a_held_command_at_once() -> None:
    async def scenario() -> int:
        node = _SilentNode()
        committer = _committer(node, stuck_s=60.0)
        replies: list[Any] = []
        for k in range(3):
            await _submit_and_settle(committer, replies, b"old-%d" % k)
        await _submit_and_settle(committer, replies, b"new")
        assert len(node.callbacks) == 3
        node.callbacks[0](None, FAIL_REASON.DISCARDED)
        await asyncio.sleep(0.01)
        assert [type(r) for r in replies] == [SubmitError]
        return len(node.callbacks)

    assert asyncio.run(scenario()) == 4
