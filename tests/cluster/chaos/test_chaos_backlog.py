"""The standing-backlog chaos run (issue 32, `--backlog`): the body check itself, then a short real
run on machine v4 where a killed and a power-lost node catch up by snapshot while the backlog
stands, and every node delivers a share of it byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.chaos.backlog import BacklogCheck, BacklogParams, body_for, index_of
from cluster.chaos.nemesis import ScheduleParams
from cluster.chaos.run import RunParams, run
from cluster.chaos.workload import WorkloadParams


def test_a_body_names_its_index_and_is_a_function_of_it() -> None:
    body = body_for(1234, 1024)
    assert len(body) == 1024 and index_of(body) == 1234
    assert body_for(1234, 1024) == body and body_for(1235, 1024)[13:] != body[13:]
    assert index_of(b"p1-g0-7") is None and index_of(b"") is None


def test_the_check_counts_lost_unexpected_bad_and_duplicated_bodies() -> None:
    check = BacklogCheck(BacklogParams(4, 64))
    check.confirmed = 4
    flipped = bytearray(body_for(2, 64))
    flipped[40] ^= 1
    for node, body in [
        ("n1", body_for(0, 64)),
        ("n2", body_for(1, 64)),
        ("n2", body_for(1, 64)),  # delivered twice: at least once allows it
        ("n3", bytes(flipped)),  # the right index, other bytes: that node's copy is damaged
        ("n3", b"something else"),
    ]:
        check._check(node, body)
    report = check.to_dict()
    assert (report["lost"], report["lost_sample"]) == (1, [3])
    assert (report["bad_bodies"], report["bad_bodies_sample"]) == (1, [[2, "n3"]])
    assert (report["unexpected"], report["duplicates"]) == (1, 1)
    assert not check.valid


def test_a_backlog_not_wholly_confirmed_is_no_valid_run() -> None:
    check = BacklogCheck(BacklogParams(2, 64))
    check.confirmed = 1
    check._check("n1", body_for(0, 64))
    assert check.lost == [] and not check.valid


@pytest.mark.parametrize(("messages", "body"), [(0, 64), (10, 8), (10, 2 << 20)])
def test_backlog_limits_are_refused_with_the_flag_named(messages: int, body: int) -> None:
    with pytest.raises(ValueError, match="--backlog"):
        BacklogParams(messages, body)


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_standing_backlog_survives_kills_and_power_loss_byte_for_byte(tmp_path: Path) -> None:
    """Machine v4 (bodies only in the journal's live entries), snapshots every 50 entries: a
    node down for seconds misses more than that and catches up by snapshot plus the live
    entries it names. Every node then delivers its share of the backlog: lost 0, unexpected 0,
    no body differs from what was published."""
    params = RunParams(
        duration_s=20.0,
        faults=("kill", "power-loss"),
        seed=3,
        out_dir=tmp_path,
        workload=WorkloadParams(producers=2, consumers=2, queues=("chaos-1",), rate_per_s=60.0),
        schedule=ScheduleParams(
            warmup_s=2.0, fault_min_s=4.0, fault_max_s=5.0, quiet_min_s=3.0, quiet_max_s=4.0
        ),
        snapshot_every_entries=50,
        backlog=BacklogParams(3000, 700),
        machine_version=4,
    )
    report = run(params)
    backlog = report["backlog"]
    assert backlog["confirmed"] == 3000, backlog
    assert (backlog["lost"], backlog["unexpected"], backlog["bad_bodies"]) == (0, 0, 0), backlog
    assert set(backlog["delivered_per_node"]) == {"n1", "n2", "n3"}, backlog
    assert all(count > 0 for count in backlog["delivered_per_node"].values()), backlog
    assert sum(backlog["restored_by_snapshot"].values()) >= 1, backlog  # the point of the run
    assert report["replicas"]["digests_equal"] and report["valid"], report["replicas"]
