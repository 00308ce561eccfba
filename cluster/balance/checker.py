"""An explicit-state model checker for the leaderless rebalancing model, run on the real rule.

The model (TLA+ "rabbit_leaderless_rebalancing"): apps start and get increasing ids, subscribe to
every queue (joining the back of its SAC waiting list), release a queue while above their ideal
number (the decision comes from `cluster.balance.decision`, the code the client runs), and a queue
with no active consumer activates the head of its list. The checker enumerates every reachable
state, the deadlocks (no action enabled) and the unbalanced ones, checks that no two apps release
when only one should, and checks liveness (every fair run ends balanced and stays so: <>[]Balanced)
under weak fairness of every action instance, printing a lasso when it fails.

Stopped apps are interchangeable, so the checker starts them in name order (a1 first): an exact
symmetry reduction that keeps traces readable (app `ak` always has id k).

    python -m cluster.balance.checker --queues 3 --apps 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from cluster.balance.decision import (
    PositionRule,
    View,
    active_counts,
    choose_release,
    is_balanced,
    over_releasing_apps,
    release_candidates,
)

STATES_MAX = 5_000_000  # refuse to explore beyond this (memory), rather than swap
Choice = Literal["any", "balancer"]
Fairness = Literal["instance", "next"]


@dataclass(frozen=True, slots=True)
class State:
    """ids[a]: start id of app a (0 = stopped); active[q]: 1-based app, 0 = none; waiting[q]."""

    ids: tuple[int, ...]
    next_id: int
    active: tuple[int, ...]
    waiting: tuple[tuple[int, ...], ...]


Label = tuple[str, int, int]  # (action, app index or -1, queue index or -1)


@dataclass(frozen=True, slots=True)
class Model:
    """Sizes and options of one check."""

    queues: int
    apps: int
    rule: PositionRule = "strict"
    choice: Choice = "any"  # "any": release any active queue (the model); "balancer": the client's
    fairness: Fairness = "instance"  # weak fairness per action instance, or only of Next

    def __post_init__(self) -> None:
        if not (1 <= self.queues <= 8 and 1 <= self.apps <= 6):
            raise ValueError("sizes must be 1..8 queues and 1..6 apps")

    def queue_name(self, q: int) -> str:
        return f"q{q + 1}"

    def app_name(self, a: int) -> str:
        return f"a{a + 1}"

    def init(self) -> State:
        return State((0,) * self.apps, 1, (0,) * self.queues, ((),) * self.queues)

    def view(self, s: State) -> View:
        """The global view, with app ids as zero-padded start ids (they sort in start order)."""
        ids = [f"{i:03d}" if i else "" for i in s.ids]
        return View(
            tuple(self.queue_name(q) for q in range(self.queues)),
            tuple(ids[a - 1] if a else None for a in s.active),
            tuple(x for x in ids if x),
        )

    def successors(self, s: State) -> Iterator[tuple[Label, State]]:
        """Every enabled action instance and the state it leads to."""
        if s.next_id <= self.apps:  # stopped apps are interchangeable: start them in name order
            a = s.next_id - 1
            ids = (*s.ids[:a], s.next_id, *s.ids[a + 1 :])
            yield ("start", a, -1), State(ids, s.next_id + 1, s.active, s.waiting)
        for a in range(self.apps):
            if s.ids[a] == 0:
                continue
            for q in range(self.queues):
                if (a + 1) not in s.waiting[q] and s.active[q] != a + 1:
                    waiting = _replace(s.waiting, q, (*s.waiting[q], a + 1))
                    yield ("subscribe", a, q), State(s.ids, s.next_id, s.active, waiting)
        yield from self._releases(s)
        for q in range(self.queues):
            if s.active[q] == 0 and s.waiting[q]:
                head = s.waiting[q][0]
                active = _replace(s.active, q, head)
                waiting = _replace(s.waiting, q, s.waiting[q][1:])
                yield ("activate", head - 1, q), State(s.ids, s.next_id, active, waiting)

    def _releases(self, s: State) -> Iterator[tuple[Label, State]]:
        if not any(s.active):
            return
        view = self.view(s)
        names = {self.queue_name(q): q for q in range(self.queues)}
        for a in range(self.apps):
            if s.ids[a] == 0 or (a + 1) not in s.active:
                continue
            app_id = f"{s.ids[a]:03d}"
            if self.choice == "any":
                chosen = release_candidates(view, app_id, self.rule)
            else:
                one = choose_release(view, app_id, self.rule)
                chosen = (one,) if one is not None else ()
            for name in chosen:
                q = names[name]
                waiting = _replace(s.waiting, q, tuple(x for x in s.waiting[q] if x != a + 1))
                active = _replace(s.active, q, 0)
                yield ("release", a, q), State(s.ids, s.next_id, active, waiting)

    def balanced(self, s: State) -> bool:
        """All apps started, every queue active, active counts within one of each other."""
        if 0 in s.ids or 0 in s.active:
            return False
        return is_balanced([s.active.count(a + 1) for a in range(self.apps)])

    def fairness_key(self, label: Label) -> tuple[str, int, int]:
        """Weak fairness per app for start and release, per (app, queue) to subscribe, per queue
        to activate."""
        action, a, q = label
        if self.fairness == "next":
            return ("next", -1, -1)
        if action in ("start", "release"):
            return (action, a, -1)
        if action == "activate":
            return (action, -1, q)
        return label

    def describe(self, label: Label, s: State) -> str:
        """The model's own comment style: `a2 subscribes to q1, added to subscriber queue`."""
        action, a, q = label
        app = self.app_name(a)
        queue = self.queue_name(q) if q >= 0 else ""
        if action == "start":
            return f"{app} starts with id {s.ids[a]}"
        if action == "subscribe":
            return f"{app} subscribes to {queue}, added to subscriber queue"
        if action == "release":
            return f"{app} releases {queue}"
        return f"{app} made active on {queue}"

    def render(self, s: State) -> list[str]:
        """One line per queue: `q1 -> a1 [a2]` (`-` when nobody is active)."""
        lines = []
        for q in range(self.queues):
            who = self.app_name(s.active[q] - 1) if s.active[q] else "-"
            wait = " ".join(self.app_name(x - 1) for x in s.waiting[q])
            lines.append(f"  - {self.queue_name(q)} -> {who}" + (f" [{wait}]" if wait else ""))
        counts = active_counts(self.view(s))
        started = [self.app_name(a) for a in range(self.apps) if s.ids[a]]
        lines.append(
            "    active counts: "
            + (", ".join(f"{n}={counts[f'{s.ids[int(n[1:]) - 1]:03d}']}" for n in started) or "-")
        )
        return lines


def _replace(items: tuple[object, ...], index: int, value: object) -> tuple:  # type: ignore[type-arg]
    return (*items[:index], value, *items[index + 1 :])


@dataclass(slots=True)
class Report:
    """What a check found."""

    queues: int
    apps: int
    rule: str
    choice: str
    fairness: str
    states: int = 0
    transitions: int = 0
    deadlocks: int = 0
    unbalanced_deadlocks: int = 0
    balanced_deadlocks: int = 0
    over_release_states: int = 0
    fair_unbalanced_cycles: int = 0
    liveness: bool = True
    unfair_unbalanced_cycles: int = 0  # livelocks that only fairness rules out
    seconds: float = 0.0
    counterexample: list[str] = field(default_factory=list)
    over_release_example: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        """The numbers, without the traces."""
        return {
            k: getattr(self, k)
            for k in self.__slots__
            if k not in ("counterexample", "over_release_example")
        }


def check(model: Model) -> Report:
    """Explore every reachable state; find deadlocks, over-releases and fair unbalanced cycles."""
    started = time.monotonic()
    report = Report(model.queues, model.apps, model.rule, model.choice, model.fairness)
    graph = _explore(model, report)
    components = _tarjan(graph.succ)
    for component in components:
        _check_component(model, graph, component, report)
    report.seconds = round(time.monotonic() - started, 3)
    return report


@dataclass(slots=True)
class _Graph:
    states: list[State]
    succ: list[list[int]]
    labels: list[list[Label]]
    parent: list[int]
    parent_label: list[Label | None]


def _explore(model: Model, report: Report) -> _Graph:
    init = model.init()
    index = {init: 0}
    graph = _Graph([init], [], [], [-1], [None])
    frontier = deque([0])
    while frontier:
        i = frontier.popleft()
        s = graph.states[i]
        out: list[int] = []
        labels: list[Label] = []
        for label, t in model.successors(s):
            j = index.get(t)
            if j is None:
                if len(graph.states) >= STATES_MAX:
                    raise RuntimeError(f"more than {STATES_MAX} states; use smaller sizes")
                j = index[t] = len(graph.states)
                graph.states.append(t)
                graph.parent.append(i)
                graph.parent_label.append(label)
                frontier.append(j)
            out.append(j)
            labels.append(label)
        while len(graph.succ) <= i:
            graph.succ.append([])
            graph.labels.append([])
        graph.succ[i], graph.labels[i] = out, labels
        report.transitions += len(out)
        if not out:
            report.deadlocks += 1
            if model.balanced(s):
                report.balanced_deadlocks += 1
            else:
                report.unbalanced_deadlocks += 1
                if report.liveness:
                    report.liveness = False
                    report.counterexample = _trace(model, graph, i, [], "deadlock")
        if any(s.active) and over_releasing_apps(model.view(s), model.rule):
            report.over_release_states += 1
            if not report.over_release_example:
                report.over_release_example = _over_release(model, graph, i)
    report.states = len(graph.states)
    return graph


def _tarjan(succ: list[list[int]]) -> list[list[int]]:
    """Strongly connected components, iteratively (no recursion limit)."""
    n = len(succ)
    order = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    stack: list[int] = []
    components: list[list[int]] = []
    counter = 0
    for root in range(n):
        if order[root] != -1:
            continue
        work = [(root, 0)]
        order[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = True
        while work:
            v, k = work[-1]
            if k < len(succ[v]):
                work[-1] = (v, k + 1)
                w = succ[v][k]
                if order[w] == -1:
                    order[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack[w] = True
                    work.append((w, 0))
                elif on_stack[w]:
                    low[v] = min(low[v], order[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == order[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    component.append(w)
                    if w == v:
                        break
                components.append(component)
    return components


def _check_component(model: Model, graph: _Graph, component: list[int], report: Report) -> None:
    members = set(component)
    internal = [
        (v, lab, w)
        for v in component
        for lab, w in zip(graph.labels[v], graph.succ[v], strict=True)
        if w in members
    ]
    if not internal:
        return  # a trivial component: no cycle through it
    if all(model.balanced(graph.states[v]) for v in component):
        return
    always = set.intersection(
        *({model.fairness_key(lab) for lab in graph.labels[v]} for v in component)
    )
    taken = {model.fairness_key(lab) for _, lab, _ in internal}
    if not always <= taken:
        report.unfair_unbalanced_cycles += 1
        return  # every run staying here starves a continuously enabled action: unfair
    report.fair_unbalanced_cycles += 1
    if report.liveness:
        report.liveness = False
        report.counterexample = _lasso(model, graph, component, internal)


def _path_to(graph: _Graph, i: int) -> list[tuple[Label | None, int]]:
    path = []
    while i != -1:
        path.append((graph.parent_label[i], i))
        i = graph.parent[i]
    return path[::-1]


def _trace(
    model: Model, graph: _Graph, end: int, loop: list[tuple[Label, int]], kind: str
) -> list[str]:
    lines: list[str] = []
    steps = _path_to(graph, end)
    for n, (label, i) in enumerate(steps):
        s = graph.states[i]
        title = "Initial state" if label is None else f"State {n} ({model.describe(label, s)})"
        lines.append(title + ":")
        lines.extend(model.render(s))
    if kind == "deadlock":
        lines.append("Deadlock, unbalanced (no action enabled)")
        return lines
    if kind == "state":
        return lines
    lines.append(f"--- loop starts here; the following {len(loop)} steps repeat forever ---")
    for n, (label, i) in enumerate(loop, start=len(steps)):
        lines.append(f"State {n} ({model.describe(label, graph.states[i])}):")
        lines.extend(model.render(graph.states[i]))
    lines.append("Back to the state where the loop starts: a fair run that never stays balanced")
    return lines


def _lasso(
    model: Model, graph: _Graph, component: list[int], internal: list[tuple[int, Label, int]]
) -> list[str]:
    """A fair cycle through the component that visits an unbalanced state, as a trace."""
    members = set(component)
    start = min(component)  # reached earliest by the breadth-first exploration
    goals: list[int] = [next(v for v in component if not model.balanced(graph.states[v]))]
    edge_of: dict[tuple[str, int, int], tuple[int, Label, int]] = {}
    for v, lab, w in internal:
        edge_of.setdefault(model.fairness_key(lab), (v, lab, w))
    loop: list[tuple[Label, int]] = []
    at = start
    for key in sorted(edge_of):
        v, lab, w = edge_of[key]
        loop += _inner_path(graph, members, at, v)
        loop.append((lab, w))
        at = w
    for goal in goals:
        loop += _inner_path(graph, members, at, goal)
        at = goal
    loop += _inner_path(graph, members, at, start)
    return _trace(model, graph, start, loop, "lasso")


def _inner_path(graph: _Graph, members: set[int], src: int, dst: int) -> list[tuple[Label, int]]:
    if src == dst:
        return []
    back: dict[int, tuple[int, Label]] = {}
    frontier = deque([src])
    while frontier:
        v = frontier.popleft()
        for lab, w in zip(graph.labels[v], graph.succ[v], strict=True):
            if w in members and w not in back and w != src:
                back[w] = (v, lab)
                if w == dst:
                    path = []
                    while w != src:
                        v, lab = back[w]
                        path.append((lab, w))
                        w = v
                    return path[::-1]
                frontier.append(w)
    raise AssertionError("members of one strongly connected component reach each other")


def _over_release(model: Model, graph: _Graph, i: int) -> list[str]:
    s = graph.states[i]
    ids = over_releasing_apps(model.view(s), model.rule)
    apps = [model.app_name(s.ids.index(int(x))) for x in ids]
    lines = _trace(model, graph, i, [], "state")
    lines.append(f"apps deciding to release although at or below their target: {', '.join(apps)}")
    return lines


MODEL_EXAMPLE: tuple[Label, ...] = (
    ("start", 0, -1),
    ("start", 1, -1),
    ("subscribe", 0, 0),
    ("activate", 0, 0),
    ("subscribe", 0, 1),
    ("activate", 0, 1),
    ("subscribe", 1, 0),
    ("subscribe", 1, 1),
    ("release", 0, 1),
    ("activate", 1, 1),
    ("subscribe", 0, 1),
)
"""The example in the model's comment (2 queues, 2 apps), with the starts it leaves implicit."""


def replay(model: Model, labels: tuple[Label, ...]) -> list[State]:
    """The states a sequence of actions goes through; ValueError on a disabled action."""
    states = [model.init()]
    for label in labels:
        found = [t for lab, t in model.successors(states[-1]) if lab == label]
        if not found:
            raise ValueError(f"{model.describe(label, states[-1])}: not enabled")
        states.append(found[0])
    return states


def model_example(model: Model) -> list[str]:
    """The model's example as a trace, ending with whether it is a balanced deadlock."""
    states = replay(model, MODEL_EXAMPLE)
    lines = ["Initial state:", *model.render(states[0])]
    for n, (label, s) in enumerate(zip(MODEL_EXAMPLE, states[1:], strict=True), start=1):
        lines.append(f"State {n} ({model.describe(label, s)}):")
        lines.extend(model.render(s))
    end = states[-1]
    deadlock = not any(True for _ in model.successors(end))
    lines.append(f"deadlock: {deadlock}; balanced: {model.balanced(end)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Command line: check one size and print the report (JSON with --json)."""
    parser = argparse.ArgumentParser(
        prog="python -m cluster.balance.checker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--queues", type=int, default=2)
    parser.add_argument("--apps", type=int, default=2)
    parser.add_argument("--rule", choices=["strict", "model"], default="strict")
    parser.add_argument("--choice", choices=["any", "balancer"], default="any")
    parser.add_argument(
        "--fairness",
        choices=["instance", "next"],
        default="instance",
        help="weak fairness per action instance (default) or only of Next",
    )
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    parser.add_argument(
        "--example",
        action="store_true",
        help="replay the model's own 2 queues x 2 apps example and stop",
    )
    args = parser.parse_args(argv)
    if args.example:
        model = Model(2, 2)
        print("\n".join(model_example(model)))
        return 0
    try:
        report = check(Model(args.queues, args.apps, args.rule, args.choice, args.fairness))
    except (ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 64
    if args.json:
        print(json.dumps(report.summary()))
    else:
        for key, value in report.summary().items():
            print(f"{key}: {value}")
        for title, lines in (
            ("liveness counterexample", report.counterexample),
            ("over-release example", report.over_release_example),
        ):
            if lines:
                print(f"\n{title}:")
                print("\n".join(lines))
    return 0 if report.liveness and not report.over_release_states else 1


if __name__ == "__main__":
    sys.exit(main())
