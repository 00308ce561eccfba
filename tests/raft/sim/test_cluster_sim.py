"""raft/sim end to end: a seed replays exactly, a bounded campaign passes, a planted bug fails.

Runs are in-process and take a few seconds each (2-6x faster than real time on this loaded
2-core machine, 25-30x per CPU second); the whole module stays within about two minutes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from click.testing import CliRunner

from cluster.cli.exits import USAGE, CliError
from cluster.cli.main import cli
from raft.sim import SimParams, SimResult, encode_faults, parse_faults, run_seed
from raft.sim.patches import simulated
from raft.sim.run import _Run
from tests.raft.sim.plants import hello_order, late_append_truncation, snapshot_chunk_commit

pytestmark = pytest.mark.slow

SHORT = SimParams(seconds=4.0)
CAMPAIGN_SEEDS = range(1, 4)
CAMPAIGN = SimParams(seconds=8.0)
# the campaign from seed 1 (8 s runs) with late_append_truncation planted fails first at seed 3
# (seed 2 before raft ticks followed the node's deadlines instead of a 20 ms grid)
PLANTED_SEED = 3
PLANTED = SimParams(seconds=8.0)


@pytest.fixture(scope="module")
def seed_5() -> SimResult:
    """One short run, shared by the replay tests."""
    return run_seed(5, SHORT)


def test_the_same_seed_replays_to_the_same_trace_hash(seed_5: SimResult) -> None:
    again = run_seed(5, SHORT)
    assert again.trace_hash == seed_5.trace_hash
    assert seed_5.operations > 20 and seed_5.verdict is not None and seed_5.verdict.confirmed > 0
    assert not seed_5.failed, seed_5.violations


def test_the_printed_schedule_replays_the_seed_exactly(seed_5: SimResult) -> None:
    schedule = parse_faults(encode_faults(seed_5.faults))
    assert run_seed(5, SHORT, schedule).trace_hash == seed_5.trace_hash


def test_another_seed_gives_another_trace(seed_5: SimResult) -> None:
    assert run_seed(6, SHORT).trace_hash != seed_5.trace_hash


@pytest.mark.parametrize("seed", CAMPAIGN_SEEDS)
def test_a_bounded_campaign_finds_nothing_on_the_fixed_code(seed: int) -> None:
    result = run_seed(seed, CAMPAIGN)
    assert result.faults, "the seed's schedule must inject faults"
    assert not result.failed, result.violations


def test_the_planted_late_append_truncation_is_found_and_the_fix_holds() -> None:
    with late_append_truncation():
        planted = run_seed(PLANTED_SEED, PLANTED)
    assert any(v.startswith("committed entries cut") for v in planted.violations)
    fixed = run_seed(PLANTED_SEED, PLANTED, planted.faults)
    assert not fixed.failed, fixed.violations


@pytest.mark.parametrize(
    ("plant", "seed"),
    [(hello_order, 1), (snapshot_chunk_commit, 13)],
    ids=["hello_order", "snapshot_chunk_commit"],
)
def test_the_other_planted_bugs_are_found_at_their_seeds(
    plant: Callable[[], AbstractContextManager[None]], seed: int
) -> None:
    # the first failing seeds of a campaign from seed 1 (30 s runs) with each bug planted;
    # the fixed code passes both (quorumq simulate --seed 1 / --seed 13)
    with plant():
        result = run_seed(seed, SimParams(seconds=30.0))
    assert any(v.startswith("state-machine safety") for v in result.violations)


def test_a_power_loss_keeps_what_was_fsynced(tmp_path: Path) -> None:
    run = _Run(3, SHORT, tmp_path)
    with simulated(lambda: run.scheduler.now, run.raft_rng):
        run.network.start()
        for node_id in sorted(run.cluster.nodes):
            run.start(node_id)
        run.advance(3.0)
        node = run.cluster.nodes["n2"]
        assert node.replica is not None
        journal = node.replica._node._journal()
        journal.sync()
        synced = list(journal._indexes)
        run.cluster.crash("n2", power_loss=True)
        run.start("n2")
        assert node.replica is not None
        kept = list(node.replica._node._journal()._indexes)
        run.cluster.stop_all()
    assert len(synced) > 3 and kept[: len(synced)] == synced


def test_the_cli_prints_the_seed_s_trace_hash(seed_5: SimResult) -> None:
    args = ["simulate", "--seed", "5", "--seconds", f"{SHORT.seconds:g}", "-o", "json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    row = json.loads(result.output)
    assert row["ok"] and row["trace_hash"] == seed_5.trace_hash


def test_the_cli_wants_one_of_seed_or_seeds() -> None:
    result = CliRunner().invoke(cli, ["simulate"])
    assert isinstance(result.exception, CliError) and result.exception.exit_code == USAGE
