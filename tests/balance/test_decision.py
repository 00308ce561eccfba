"""The leaderless decision rule: ideal numbers, position ties, and the model's literal `>=` flaw."""

from __future__ import annotations

from cluster.balance.decision import (
    View,
    choose_release,
    ideal_number,
    over_releasing_apps,
    release_candidates,
)


def view(active: list[str | None], apps: list[str]) -> View:
    return View(tuple(f"q{i + 1}" for i in range(len(active))), tuple(active), tuple(apps))


def test_the_remainder_goes_to_the_app_with_more_active_queues() -> None:
    """3 queues over 2 apps: the app holding 2 keeps 2, the other wants 1."""
    v = view(["1", "1", "2"], ["1", "2"])
    assert ideal_number(v, "1") == 2
    assert ideal_number(v, "2") == 1
    assert release_candidates(v, "1") == ()


def test_an_app_holding_everything_releases_down_to_its_ideal_one_at_a_time() -> None:
    """4 queues, 2 apps, one holds all: any may go, the client picks the last."""
    v = view(["1", "1", "1", "1"], ["1", "2"])
    assert release_candidates(v, "1") == ("q1", "q2", "q3", "q4")
    assert choose_release(v, "1") == "q4"
    assert release_candidates(v, "2") == ()


def test_ties_go_to_the_greater_id_so_only_one_of_two_tied_apps_releases() -> None:
    """4 queues, 3 apps at 2/2/0: exactly one of the tied apps is above its ideal."""
    v = view(["1", "1", "2", "2"], ["1", "2", "3"])
    releasing = [a for a in ("1", "2", "3") if release_candidates(v, a)]
    assert releasing == ["1"]
    assert over_releasing_apps(v) == ()


def test_the_models_literal_rule_makes_both_tied_apps_release() -> None:
    """With the TLA+ text's `>=`, each tied app counts the other as ahead: both release."""
    v = view(["1", "1", "2", "2"], ["1", "2", "3"])
    releasing = [a for a in ("1", "2", "3") if release_candidates(v, a, "model")]
    assert releasing == ["1", "2"]
    assert over_releasing_apps(v, "model") == ("2",)


def test_an_app_that_has_not_started_never_releases() -> None:
    """Queues held by an id outside the started apps are ignored by the rule."""
    v = view(["9", "9"], ["1"])
    assert release_candidates(v, "9") == ()
    assert ideal_number(v, "1") == 2
