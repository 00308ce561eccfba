"""The model checker: the model's example, 3x2 and 3x3, and a lasso under weak fairness of Next."""

from __future__ import annotations

import pytest

from cluster.balance.checker import MODEL_EXAMPLE, Model, check, main, model_example, replay


def test_the_models_own_example_ends_in_its_balanced_deadlock() -> None:
    """2 queues x 2 apps: its steps are enabled and end in q1 -> a1 [a2], q2 -> a2 [a1]."""
    model = Model(2, 2)
    end = replay(model, MODEL_EXAMPLE)[-1]
    assert model.render(end)[:2] == ["  - q1 -> a1 [a2]", "  - q2 -> a2 [a1]"]
    assert model.balanced(end)
    assert not list(model.successors(end))
    assert model_example(model)[-1] == "deadlock: True; balanced: True"


def test_a_disabled_step_is_refused() -> None:
    """Replaying a release by an app at its ideal fails."""
    with pytest.raises(ValueError, match="not enabled"):
        replay(Model(2, 2), (("start", 0, -1), ("release", 0, 0)))


def test_three_queues_two_apps_always_ends_balanced() -> None:
    """Every deadlock is balanced, no over-release, and every fair run converges."""
    report = check(Model(3, 2))
    assert (report.states, report.deadlocks, report.unbalanced_deadlocks) == (757, 6, 0)
    assert report.liveness and report.over_release_states == 0
    assert report.unfair_unbalanced_cycles > 0  # livelocks exist; fairness rules them out


def test_more_apps_than_queues_with_the_balancers_own_choice_converge() -> None:
    """2 queues x 3 apps with the queue the client really picks: no unbalanced deadlock, live."""
    report = check(Model(2, 3, choice="balancer"))
    assert report.deadlocks > 0 and report.unbalanced_deadlocks == 0
    assert report.liveness and report.fair_unbalanced_cycles == 0


def test_without_per_app_fairness_a_lasso_shows_an_app_starved_forever() -> None:
    """Weak fairness of Next alone: a1 grabs and releases q2 forever while a2 never subscribes."""
    report = check(Model(2, 2, fairness="next"))
    assert not report.liveness
    text = "\n".join(report.counterexample)
    assert "loop starts here" in text and "a1 releases q2" in text


def test_the_models_literal_position_rule_over_releases_at_4x3(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The literal `>=` lets two tied apps both release; the checker prints where."""
    model = Model(4, 3, rule="model")
    # replay to 2/2/0 rather than exploring 4x3 (about a minute)
    steps = [("start", 0, -1), ("start", 1, -1), ("start", 2, -1)]
    steps += [("subscribe", 0, 0), ("subscribe", 0, 1), ("subscribe", 1, 2), ("subscribe", 1, 3)]
    steps += [("activate", 0, 0), ("activate", 0, 1), ("activate", 1, 2), ("activate", 1, 3)]
    end = replay(model, tuple((a, b, c) for a, b, c in steps))[-1]
    releasers = {lab[1] for lab, _ in model.successors(end) if lab[0] == "release"}
    assert releasers == {0, 1}
    strict = Model(4, 3)
    assert {lab[1] for lab, _ in strict.successors(end) if lab[0] == "release"} == {0}


def test_the_command_line_prints_a_report_and_exits_1_on_a_violation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`python -m cluster.balance.checker` prints the numbers, then the lasso."""
    assert main(["--queues", "2", "--apps", "2"]) == 0
    assert main(["--queues", "2", "--apps", "2", "--fairness", "next"]) == 1
    out = capsys.readouterr().out
    assert "liveness: False" in out and "liveness counterexample:" in out
    assert main(["--queues", "9", "--apps", "2"]) == 64
