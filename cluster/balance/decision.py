"""The leaderless balancer's decision rule, shared by the client, the checker and the simulator.

Every application subscribes to every queue of the group and sees, for each queue, which
application is active on it. From that view alone it computes its ideal number of active queues
(queues // started apps, the remainder going to the apps ranked first: more active queues first,
ties by app id, the greater id first as in the model) and releases the queues above it, one at a
time. App ids must sort in start order (the model assigns them from a counter).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

PositionRule = Literal["strict", "model"]
"""`strict` ranks ties by app id (what the model's comment intends); `model` is the TLA+ text
literally, whose `>=` makes two tied apps both count the other as ahead of them."""


@dataclass(frozen=True, slots=True)
class View:
    """What one application knows: the group's queues, who is active on each, the started apps."""

    queues: tuple[str, ...]
    active: tuple[str | None, ...]  # aligned with `queues`: the active app id, or None
    apps: tuple[str, ...]  # the started apps' ids (order irrelevant)

    def __post_init__(self) -> None:
        assert len(self.queues) == len(self.active), "one active entry per queue"


def active_counts(view: View) -> dict[str, int]:
    """Active queues per started app (0 for an app active nowhere)."""
    held = Counter(view.active)  # C-speed counting: the simulator calls this on every poll
    return {app: held.get(app, 0) for app in view.apps}


def position(counts: dict[str, int], app: str, rule: PositionRule = "strict") -> int:
    """The app's rank among apps with active queues (0 = first); -1 when it has none."""
    mine = counts.get(app, 0)
    if mine == 0:
        return -1
    ahead = 0
    for other, theirs in counts.items():
        if other == app or theirs == 0:
            continue
        if rule == "model":
            if theirs >= mine:
                ahead += 1
        elif theirs > mine or (theirs == mine and other > app):
            ahead += 1
    return ahead


def ideal_number(view: View, app: str, rule: PositionRule = "strict") -> int:
    """How many queues `app` should be active on (the model's IdealNumber)."""
    return _ideal(len(view.queues), active_counts(view), app, rule)


def _ideal(queue_count: int, counts: dict[str, int], app: str, rule: PositionRule) -> int:
    if not counts:
        return 0
    ideal, remainder = divmod(queue_count, len(counts))
    if remainder == 0:
        return ideal
    return ideal + 1 if remainder >= position(counts, app, rule) + 1 else ideal


def release_candidates(view: View, app: str, rule: PositionRule = "strict") -> tuple[str, ...]:
    """The queues `app` may release now: all its active ones when it holds more than its ideal."""
    counts = active_counts(view)
    if app not in counts or counts[app] <= _ideal(len(view.queues), counts, app, rule):
        return ()
    return tuple(q for q, a in zip(view.queues, view.active, strict=True) if a == app)


def choose_release(view: View, app: str, rule: PositionRule = "strict") -> str | None:
    """The one queue the real balancer releases next (the last in queue order), or None."""
    candidates = release_candidates(view, app, rule)
    return candidates[-1] if candidates else None


def canonical_targets(queue_count: int, counts: dict[str, int]) -> dict[str, int]:
    """The balanced target per app, every app ranked (ties by id): what the rule must agree with."""
    if not counts:
        return {}
    ideal, remainder = divmod(queue_count, len(counts))
    ranked = sorted(counts, key=lambda a: (-counts[a], _desc(a)))
    return {a: ideal + (1 if i < remainder else 0) for i, a in enumerate(ranked)}


def _desc(app: str) -> tuple[int, ...]:
    """A sort key ordering app ids descending (greater id first)."""
    return (*tuple(-ord(ch) for ch in app), 1)


def over_releasing_apps(view: View, rule: PositionRule = "strict") -> tuple[str, ...]:
    """Apps that would release although they are not above their canonical target."""
    counts = active_counts(view)
    targets = canonical_targets(len(view.queues), counts)
    return tuple(
        sorted(
            a
            for a in counts
            if counts[a] > _ideal(len(view.queues), counts, a, rule) and counts[a] <= targets[a]
        )
    )


def is_balanced(counts: Sequence[int]) -> bool:
    """Counts differ by at most one (an empty group is balanced)."""
    return not counts or max(counts) - min(counts) <= 1


# --- the view, from the machine's consumer lists ---------------------------------------------

TAG_SEPARATOR = "/"
LIVE_STATUSES = ("up", "waiting", "quiescing")  # suspected, timed-out, cancelled: not counted


def consumer_tag(group: str, app_id: str, subscription: int) -> str:
    """The tag a balancing consumer uses: `GROUP/APP_ID/N` (N counts its subscriptions)."""
    if TAG_SEPARATOR in group or TAG_SEPARATOR in app_id or not group or not app_id:
        raise ValueError(f"group and app id must be non-empty and without {TAG_SEPARATOR!r}")
    return f"{group}{TAG_SEPARATOR}{app_id}{TAG_SEPARATOR}{subscription}"


def app_of(group: str, tag: str) -> str | None:
    """The app id in a balancing consumer's tag, or None for a consumer of another kind or group."""
    parts = tag.split(TAG_SEPARATOR)
    if len(parts) != 3 or parts[0] != group or not parts[1]:
        return None
    return parts[1]


ConsumerRow = tuple[str, str, bool]  # (tag, status, active), as `consumers` queries give them


def view_from_consumers(
    group: str, queues: Sequence[str], consumers: dict[str, list[ConsumerRow]]
) -> View:
    """The view of a group: who is active on each queue, and the apps with a live consumer."""
    apps: dict[str, None] = {}
    active: list[str | None] = []
    for q in queues:
        holder: str | None = None
        for tag, status, is_active in consumers.get(q, []):
            app = app_of(group, tag)
            if app is None:
                continue
            if status in LIVE_STATUSES:
                apps[app] = None
            if is_active and status != "cancelled":
                holder = app
        active.append(holder)
    return View(tuple(queues), tuple(active), tuple(sorted(apps)))
