"""A short real chaos run: 3 node processes, producers and consumers, kill and pause faults."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.chaos.history import read_history
from cluster.chaos.nemesis import ScheduleParams
from cluster.chaos.run import RunParams, run
from cluster.chaos.workload import WorkloadParams

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.mark.timeout(240)
def test_kill_and_pause_lose_nothing_and_replicas_agree_after_the_drain(tmp_path: Path) -> None:
    """Under SIGKILL+restart and SIGSTOP/SIGCONT: lost 0, unexpected 0, equal digests, empty."""
    params = RunParams(
        duration_s=30.0,
        faults=("kill", "pause"),
        seed=5,
        out_dir=tmp_path,
        workload=WorkloadParams(producers=2, consumers=2, queues=("chaos-1",), rate_per_s=30.0),
        schedule=ScheduleParams(
            warmup_s=3.0, fault_min_s=3.0, fault_max_s=5.0, quiet_min_s=3.0, quiet_max_s=5.0
        ),
    )
    report = run(params)
    assert {fault["kind"] for fault in report["faults"]} == {"kill", "pause"}
    assert all(not fault["errors"] for fault in report["faults"])
    assert report["operations"]["publish"]["ok"] > 100
    assert report["lost"] == 0, report["checker"]["lost"][:20]
    assert report["unexpected"] == 0, report["checker"]["unexpected"][:20]
    assert report["replicas"]["digests_equal"], report["replicas"]
    assert report["replicas"]["queues_empty_on_every_replica"], report["replicas"]
    assert report["valid"]
    history = read_history(tmp_path / "history.jsonl")
    assert sum(1 for e in history if e.f == "fault" and e.type == "invoke") == len(report["faults"])
    assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"
