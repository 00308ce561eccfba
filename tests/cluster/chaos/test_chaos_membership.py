"""A short real chaos run with the membership fault: followers replaced under traffic."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.chaos.nemesis import ScheduleParams
from cluster.chaos.run import RunParams, run
from cluster.chaos.workload import WorkloadParams

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.mark.timeout(300)
def test_replacing_followers_and_kills_lose_nothing_and_the_new_members_agree(
    tmp_path: Path,
) -> None:
    """membership (add a node, wait for it, remove a follower, stop it) and kill faults:
    lost 0, unexpected 0, equal digests on the final member set, every queue empty."""
    params = RunParams(
        duration_s=30.0,
        faults=("membership", "kill"),
        seed=1,
        out_dir=tmp_path,
        workload=WorkloadParams(producers=2, consumers=2, queues=("chaos-1",), rate_per_s=30.0),
        schedule=ScheduleParams(
            warmup_s=3.0, fault_min_s=3.0, fault_max_s=5.0, quiet_min_s=3.0, quiet_max_s=5.0
        ),
        snapshot_every_entries=200,  # new members are rebuilt from a snapshot and the log
    )
    report = run(params)
    replaced = [f for f in report["faults"] if f["kind"] == "membership"]
    assert replaced and all(not f["errors"] for f in replaced), report["faults"]
    assert all("->" in f["detail"] for f in replaced), replaced
    final = set(report["replicas"]["per_node"])
    assert len(final) == 3 and final != {"n1", "n2", "n3"}, final
    assert report["lost"] == 0, report["checker"]["lost"][:20]
    assert report["unexpected"] == 0, report["checker"]["unexpected"][:20]
    assert report["replicas"]["digests_equal"], report["replicas"]
    assert report["replicas"]["queues_empty_on_every_replica"], report["replicas"]
    assert report["valid"]
