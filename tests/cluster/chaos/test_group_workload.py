"""The consumer-group chaos workload on a real 3-node cluster: producers publish to the
partitioned queue's base name (keyed and keyless), members crash and come back, nodes are
killed; the group checks find no double ownership, no misrouted message, per-key order kept,
nothing stored twice, and measure recovery."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.chaos.group_workload import GroupParams, unavailable_reason
from cluster.chaos.history import read_history
from cluster.chaos.nemesis import ScheduleParams
from cluster.chaos.run import RunParams, run
from cluster.chaos.workload import WorkloadParams


def test_the_partition_queues_are_named_queue_dot_index() -> None:
    """The member queues the workload publishes to, consumes and drains."""
    assert GroupParams(queue="orders", partitions=3).partition_queues() == (
        "orders.0", "orders.1", "orders.2",
    )  # fmt: skip
    assert unavailable_reason() is None  # machine v3 has consumer groups


@pytest.mark.parametrize(
    ("field", "value"),
    [("partitions", 0), ("partitions", 65), ("keys", 0), ("keyless_fraction", 1.5),
     ("resend_max", -1)],
)  # fmt: skip
def test_group_params_out_of_bounds_are_refused_with_the_field_named(
    field: str, value: float
) -> None:
    """A bad bound fails at construction, saying which one."""
    with pytest.raises(ValueError, match=field):
        GroupParams(**{field: value})  # type: ignore[arg-type]


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_members_crash_and_a_node_is_killed_without_double_ownership(tmp_path: Path) -> None:
    """A group of 3 over 4 partitions fed through the base name, a member crash every 5 s and
    a node kill: valid (lost 0, unexpected 0), no partition delivered to two members at once,
    order kept per enqueuer and per key, every keyed message from its key's partition, nothing
    stored twice (resends included), every crash's partitions consumed again."""
    groups = GroupParams(partitions=4, members=3, member_crash_every_s=5.0)
    params = RunParams(
        duration_s=25.0,
        faults=("kill",),
        seed=4,
        out_dir=tmp_path,
        workload=WorkloadParams(producers=4, queues=groups.partition_queues(), rate_per_s=60.0),
        schedule=ScheduleParams(
            warmup_s=3.0, fault_min_s=3.0, fault_max_s=5.0, quiet_min_s=3.0, quiet_max_s=5.0
        ),
        groups=groups,
    )
    report = run(params)
    checks = report["groups"]
    assert report["lost"] == 0 and report["unexpected"] == 0, report["checker"]
    assert checks["double_ownership_count"] == 0, checks["double_ownership"]
    assert checks["order_violation_count"] == 0, checks["order_violations"]
    assert checks["keyed_publishes"] > 0 and checks["keyless_publishes"] > 0, checks
    assert checks["routing_violation_count"] == 0, checks["routing_violations"]
    assert checks["key_order_violation_count"] == 0, checks["key_order_violations"]
    assert checks["duplicated_count"] == report["duplicated"] == 0, checks["duplicated"]
    assert checks["lost_count"] == checks["unexpected_count"] == 0, checks
    assert len(checks["crash_recovery"]) >= 2, checks
    assert all(c["recovery_s"] is not None for c in checks["crash_recovery"]), checks
    assert report["valid"], report["notes"]
    history = read_history(tmp_path / "history.jsonl")
    assert any(e.f == "revoked" for e in history) and any(e.f == "assigned" for e in history)
    published = {e.queue for e in history if e.f == "publish" and e.type == "invoke"}
    delivered = {e.queue for e in history if e.f == "deliver"}
    assert published == {groups.queue}  # the base name only; the machine routes
    assert delivered == set(groups.partition_queues())  # keys and round robin reach all four
