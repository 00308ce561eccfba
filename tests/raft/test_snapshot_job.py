"""raft.snapshotter.SnapshotJob: what pysyncobj hears of a local snapshot."""

from __future__ import annotations

from pathlib import Path

from pysyncobj.serializer import SERIALIZER_STATE

from raft.snapshotter import SnapshotJob


def test_a_finished_snapshot_not_yet_reported_is_dropped_when_the_leaders_replaces_it(
    tmp_path: Path,
) -> None:
    """Campaign seed 9464 (on 54b325b): a follower's own snapshot had finished, its SUCCESS not
    yet polled, when a snapshot from the leader arrived and was installed (the log now two
    entries). The next tick heard SUCCESS and compacted the new log up to the old snapshot's
    index: every entry gone, and pysyncobj, which needs one, raised on every AppendEntries
    (`journal position 0 out of range (0 entries)`). `cancel` left a finished job alone."""
    job = SnapshotJob(None, tmp_path / "raft.dump", sync=False)
    job.start(lambda: (b"dump", [3, 5]), below=10, in_child=False)  # done at the next poll
    job.cancel()  # the leader's snapshot replaces the state first
    assert job.poll() == SERIALIZER_STATE.FAILED  # pysyncobj compacts nothing
    assert job.poll() == SERIALIZER_STATE.NOT_SERIALIZING


def test_a_finished_snapshot_reports_success_once(tmp_path: Path) -> None:
    job = SnapshotJob(None, tmp_path / "raft.dump", sync=False)
    job.start(lambda: (b"dump", [3, 5]), below=10, in_child=False)
    assert job.poll() == SERIALIZER_STATE.SUCCESS
    assert job.poll() == SERIALIZER_STATE.NOT_SERIALIZING
    assert (tmp_path / "raft.dump").read_bytes() == b"dump"
