"""raft/sim end to end: a seed replays exactly, a bounded campaign passes, a planted bug fails.

Runs are in-process and take a few seconds each (2-6x faster than real time on this loaded
2-core machine, 25-30x per CPU second); the whole module stays within about two minutes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cluster.cli.exits import USAGE, CliError
from cluster.cli.main import cli
from raft.sim import (
    ROTATE,
    SimParams,
    SimResult,
    encode_faults,
    parse_faults,
    reproduce_command,
    run_seed,
    seed_params,
)
from raft.sim.patches import simulated
from raft.sim.run import _Run
from tests.raft.sim.plants import PLANTS

pytestmark = pytest.mark.slow

SHORT = SimParams(seconds=4.0)
CAMPAIGN_SEEDS = range(1, 4)
CAMPAIGN = SimParams(seconds=8.0)


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


# the first failing seed of a campaign from seed 1 (30 s runs, 6 clients, flaky links) with
# each fix undone (tests/raft/sim/plants.py; `python -m tests.raft.sim.find_planted NAME`), found
# again once raft ticked on its own deadlines (raft/ticker.py) instead of a 20 ms grid. The
# empty last snapshot chunk needs protocol-2 pickles on the wire (peers from before 8345617,
# which moved pysyncobj to protocol 5, where b"" needs no global): found at seed 3 of the
# campaign's wire rotation (`pysyncobj2`; issue 26); hello_order moved from 16 to 9 when a
# forward to an unreachable leader began to fail at once (raft/syncobj_adapter.py);
# leader_own_node_up (219) and stuck_entries_hold_commands (75) moved to 364 and 304 when a
# leader that steps down got a fresh election timeout (raft/elections.py, seeds 6167/6451)
PLANTED_BUGS = [
    ("late_append_truncation", 2, "quorumq", "committed entries cut"),
    ("snapshot_chunk_commit", 1, "quorumq", "state-machine safety"),
    ("hello_order", 9, "quorumq", "state-machine safety"),
    ("empty_snapshot_chunk", 3, "pysyncobj2", "replicas differ after healing"),
    ("dropped_connection_down", 1, "quorumq", "liveness: the drain left"),
    ("leader_own_node_up", 364, "quorumq", "liveness: n1 still lists ['n2'] down"),
    ("snapshot_orphans_proposals", 1, "quorumq", "orphaned proposal"),
    ("stuck_entries_hold_commands", 304, "quorumq", "liveness: c1 enqueue"),
]


def test_the_empty_last_chunk_is_found_only_on_protocol_2_pickles() -> None:
    # the same seed on today's pickle (protocol 5: b"" as empty SHORT_BINBYTES) passes
    with PLANTS["empty_snapshot_chunk"]():
        assert not run_seed(3, SimParams(seconds=30.0, wire="pysyncobj")).failed


def test_a_campaign_rotates_the_wire_by_seed_and_replays_with_the_seed_s_own() -> None:
    rotating = SimParams(seconds=SHORT.seconds, wire=ROTATE)
    assert [seed_params(s, rotating).wire for s in (1, 2, 3)] == [
        "quorumq",
        "pysyncobj",
        "pysyncobj2",
    ]
    assert seed_params(3, SHORT) is SHORT
    result = SimResult(3, parse_faults("1.00:heal:"))
    assert " --wire pysyncobj2 " in reproduce_command(result, rotating)


@pytest.mark.parametrize(
    ("plant", "seed", "wire", "violation"), PLANTED_BUGS, ids=[row[0] for row in PLANTED_BUGS]
)
def test_each_planted_bug_is_found_at_its_seed_replays_exactly_and_the_fix_holds(
    plant: str, seed: int, wire: str, violation: str
) -> None:
    params = SimParams(seconds=30.0, wire=wire)
    with PLANTS[plant]():
        planted = run_seed(seed, params)
        again = run_seed(seed, params)
    assert any(v.startswith(violation) for v in planted.violations), planted.violations
    assert again.trace_hash == planted.trace_hash
    fixed = run_seed(seed, params, planted.faults)
    assert not fixed.failed, fixed.violations


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


def test_a_cli_campaign_rotates_the_wire_and_each_row_names_its_seed_s() -> None:
    args = ["simulate", "--seeds", "2", "--first-seed", "2", "--seconds", "3", "-o", "jsonl"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines() if '"seed"' in line]
    assert [(r["seed"], r["wire"]) for r in rows] == [(2, "pysyncobj"), (3, "pysyncobj2")]
    assert rows[1]["trace_hash"] == run_seed(3, SimParams(seconds=3.0, wire=ROTATE)).trace_hash


def test_the_cli_wants_one_of_seed_or_seeds() -> None:
    result = CliRunner().invoke(cli, ["simulate"])
    assert isinstance(result.exception, CliError) and result.exception.exit_code == USAGE


def test_a_restarted_node_s_hello_is_retried_until_it_commits() -> None:
    # found by the 200-seed Spark campaign: n2 restarted behind a one-way partition, its one
    # hello timed out, and a dequeue of its old incarnation (applied later) stayed checked out
    # for ever; the node server retries the hello (NodeServer._hello), the simulator now too
    result = run_seed(159, SimParams(seconds=60.0))
    assert not result.failed, result.violations


def test_a_node_behind_the_leader_refuses_reads_until_it_has_caught_up() -> None:
    # broken by seed 1 with reads on every member: n1, the leader, isolated at 4.79 s and
    # healed at 7.85 s, answered a read at 8.45 s from index 163 while index 190 had been
    # confirmed before 7.45 s; 10 of seeds 1-12 break it (30 s runs, --reads)
    result = run_seed(1, SimParams(seconds=30.0, reads=True))
    assert not any(v.startswith("stale read") for v in result.violations), result.violations


def test_slow_links_hold_messages_across_elections_and_the_fixed_code_passes() -> None:
    # issue 26's other hazard (pysyncobj's next_node_idx acks carry no term): slow links
    # deliver acks after the term that sent them ended; 271 seeds of 30 s found nothing
    result = run_seed(3, SimParams(seconds=30.0, slow=True))
    assert any(f.op == "slow" for f in result.faults)
    assert not result.failed, result.violations


def test_a_lying_fsync_and_a_garbage_tail_before_a_power_cut_keep_the_checkers_green() -> None:
    # seed 4's schedule (--disk): n2 crashes with power loss after a last fsync that lied,
    # and a byte of what survived unsynced is flipped; the journal loads, nothing is lost
    result = run_seed(4, SimParams(seconds=15.0, disk=True))
    assert any({"lied", "garbage"} <= set(f.args) for f in result.faults), result.faults
    assert not result.failed, result.violations


def test_the_drain_starts_once_every_client_operation_is_answered_or_given_up() -> None:
    # seed 367 of the 10,000-seed campaign (on de5e644) reported a confirmed publish lost: its
    # reply came 4.6 s after the clients closed, when the drain had already found the queue
    # empty (the message was still in it). Its node's committer held the publish behind three
    # proposals a snapshot had orphaned (both planted above). Here clients hang after the heal
    # (the stuck plant): no client event may follow the drain's first
    with PLANTS["stuck_entries_hold_commands"]():
        result = run_seed(304, SimParams(seconds=30.0, wire="quorumq"))
    history = result.history
    first_drain = min(e[0] for e in history if e[1] == "drain")
    late = [e for e in history if e[1] != "drain" and e[0] >= first_drain]
    assert late == [], late[:3]
    assert any(e[2] == "info" and e[0] > first_drain - 4.0 for e in history), "nobody hung"


def test_seed_366_runs_without_a_storm_of_empty_snapshot_chunks() -> None:
    # seed 366 of the 10,000-seed campaign: the leader owed n2 a snapshot while it was taking
    # one; pysyncobj's send loop, given no chunk, sends an empty message and asks again until
    # its heartbeat period has passed, which never happens on the virtual clock: a million
    # events pending at 61.5 s. Real nodes sent thousands per round (raft.appends)
    result = run_seed(366, SimParams(seconds=60.0, wire="pysyncobj2"))
    assert not result.failed, result.violations


@pytest.mark.parametrize(("seed", "wire"), [(6451, "quorumq"), (6167, "pysyncobj")])
def test_a_leader_that_steps_down_stands_again(seed: int, wire: str) -> None:
    # seeds 6167 and 6451 of the 10,000-seed campaign: no leader for ever after the final heal,
    # every node connected. Two leaders had stepped down (pysyncobj's leader fallback: no
    # quorum heard from) keeping the election deadline the pre-vote gate had parked an hour
    # ahead, which the gate then took as the time of their next round; the third node's log
    # was behind, so nobody it asked would vote for it
    result = run_seed(seed, SimParams(seconds=60.0, wire=wire))
    assert not result.failed, result.violations
