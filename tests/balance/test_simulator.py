"""The seeded simulator on the real machine, and the study's per-case evaluation."""

from __future__ import annotations

import pytest

from cluster.balance.evaluate import STRATEGY_NAMES, Case, run_case
from cluster.balance.simulator import CHURNS, SimConfig, main, simulate


@pytest.mark.parametrize("churn", CHURNS)
def test_six_queues_three_apps_rebalance_after_every_churn(churn: str) -> None:
    """Each churn on 6 queues x 3 apps ends balanced (counts within one) within the bound."""
    result = simulate(SimConfig(6, 3, churn, 200, seed=3))  # type: ignore[arg-type]
    assert result.converged
    assert result.spread <= 1
    assert 0.0 <= result.stickiness <= 1.0


def test_the_same_seed_gives_the_same_run() -> None:
    """Virtual time and a seeded generator: a run is reproducible from its seed."""
    config = SimConfig(8, 3, "flapping", 300, seed=11)
    first, second = simulate(config), simulate(config)
    first.allocation_ms = second.allocation_ms = 0.0  # the only wall-clock field
    assert first == second


def test_a_join_costs_releases_and_cascades_that_sticky_avoids() -> None:
    """16 queues, 4 apps, one joins: leaderless hands queues on more than once; sticky moves 3."""
    rows = {r["strategy"]: r for r in run_case(Case(16, 4, "join", 250, seed=1))}
    assert set(rows) == set(STRATEGY_NAMES)
    assert rows["sticky"]["moves"] == 3  # 16 // 5: the minimum
    assert rows["sticky"]["time_to_converge_ms"] == 10  # one hand-over through the log
    assert int(str(rows["leaderless"]["moves"])) > 3
    assert int(str(rows["leaderless"]["cascades"])) > 0


def test_the_last_app_crashing_is_not_a_convergence_failure() -> None:
    """1 app crashes: nobody is left; the run ends once the disconnected timeout fired."""
    result = simulate(SimConfig(4, 1, "crash", 0, seed=0))
    assert result.converged and result.time_to_converge_ms == 2_000


def test_bad_sizes_are_refused() -> None:
    """Limits on everything: sizes outside the bounds are a ValueError, exit 64 on the CLI."""
    with pytest.raises(ValueError):
        SimConfig(0, 1, "join", 0, 0)
    assert main(["--queues", "5000"]) == 64
