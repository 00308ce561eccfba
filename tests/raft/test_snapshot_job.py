"""raft.snapshotter.SnapshotJob: what pysyncobj hears of a local snapshot."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from pysyncobj.serializer import SERIALIZER_STATE

from raft import retention
from raft.snapshotter import SnapshotJob
from tests.raft.test_retention import _blob, _compact, _filled


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


def test_cancel_stops_a_paced_rewrite_of_retained_entries_between_two_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 32: a snapshot from the leader (or a shutdown) cancels the local job on the loop,
    which waited for the worker's paced rewrite of a backlog's adopted journal: up to ~35 s
    without a tick. Now the rewrite stops between two batches; every retained entry still
    reads back, and a later reclaim finishes the work."""
    monkeypatch.setattr(retention, "REWRITE_BYTES_PER_S", 1)  # the first pause: days
    monkeypatch.setattr(retention, "REWRITE_BATCH_BYTES", 1)  # one entry a batch
    paused = threading.Event()
    real_pause = retention._pause

    def pause(seconds: float, interrupt: threading.Event | None) -> None:
        paused.set()
        real_pause(seconds, interrupt)

    monkeypatch.setattr(retention, "_pause", pause)
    journal = _filled(tmp_path / "raft.journal", 40)
    _compact(journal, list(range(2, 30)), 30)  # the old journal, adopted, holds 2..29
    job = SnapshotJob(journal, tmp_path / "raft.dump", sync=False)
    job.start(lambda: (b"dump", [3, 7]), below=35)  # 2 of 28 left live: that file is rewritten
    for _ in range(3000):
        if paused.is_set() or job.poll() != SERIALIZER_STATE.SERIALIZING:
            break
        time.sleep(0.01)
    assert paused.is_set(), "the rewrite never paced"
    cancelling = threading.Thread(target=job.cancel)
    cancelling.start()
    cancelling.join(30)
    assert not cancelling.is_alive(), "cancel waited for the paced rewrite"
    assert job.poll() == SERIALIZER_STATE.FAILED
    assert [journal.read_entry(i) for i in (3, 7)] == [_blob(3), _blob(7)]
    assert journal.retained.indexes() == [3, 7]
    journal.retained.keep_only([3, 7], 35)  # not paced (a start): the rest of the work
    assert journal.retained.stats()["segments"] == 1
    assert [journal.read_entry(i) for i in (3, 7)] == [_blob(3), _blob(7)]
    journal._destroy()
