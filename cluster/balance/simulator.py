"""A seeded, virtual-time simulator of the leaderless balancer on the real fifo machine (v2 SAC).

Apps subscribe to every queue of a group through real `Checkout` commands applied to an
in-process machine; each app polls every `poll_ms` (jittered), decides on a view of the machine
that is `view_delay_ms` old (jittered, as a periodic `consumers` query would be) with the same
`decision` code the client runs, and releases one queue at a time: `Cancel`, then a new `Checkout`
at the back of the SAC waiting list. Leaving closes the connection (`ConnectionDown normal`);
crashing makes it unreachable (`noconnection`), and the machine's disconnected timeout, fired
from `fifo.due_commands`, hands its queues on. Nothing reads the wall clock except the optional
`allocation` timing.

    python -m cluster.balance.simulator --queues 6 --apps 3 --churn crash --seed 1
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Literal

import fifo
from cluster.balance.decision import View, app_of, choose_release, consumer_tag, is_balanced
from fifo.commands import (
    Cancel,
    Checkout,
    ConnectionDown,
    ConnectionId,
    ConsumerId,
    DeclareQueue,
    QueueConfig,
    SimplePrefetch,
)
from fifo.replies import Error

Churn = Literal["join", "leave", "crash", "scale_out", "scale_in", "flapping"]
CHURNS: tuple[Churn, ...] = ("join", "leave", "crash", "scale_out", "scale_in", "flapping")
GROUP = "g"
QUEUES_MAX = 1024
APPS_MAX = 256
DECISIONS_CACHED_MAX = 100_000


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One run: sizes, the churn after the initial balance, delays, and the bounds."""

    queues: int
    apps: int
    churn: Churn
    view_delay_ms: int
    seed: int
    poll_ms: int = 100
    disconnected_timeout_ms: int = 2_000
    flaps: int = 3
    flap_period_ms: int = 1_500
    horizon_ms: int = 120_000  # a rebalance not done by then counts as not converging

    def __post_init__(self) -> None:
        if not (1 <= self.queues <= QUEUES_MAX and 1 <= self.apps <= APPS_MAX):
            raise ValueError(f"queues must be 1..{QUEUES_MAX}, apps 1..{APPS_MAX}")
        if self.churn not in CHURNS:
            raise ValueError(f"churn must be one of {', '.join(CHURNS)}")
        if self.view_delay_ms < 0 or self.poll_ms < 1 or self.horizon_ms < 1:
            raise ValueError("delays must be >= 0, poll and horizon >= 1 ms")


def membership_events(config: SimConfig) -> list[tuple[int, str, str]]:
    """The churn as (offset ms, join|leave|crash, app name), relative to the churn start."""
    n = config.apps
    new = [f"app{n + i:03d}" for i in range(max(1, n))]
    old = [f"app{i:03d}" for i in range(n)]
    if config.churn == "join":
        return [(0, "join", new[0])]
    if config.churn == "leave":
        return [(0, "leave", old[-1])]
    if config.churn == "crash":
        return [(0, "crash", old[0])]
    if config.churn == "scale_out":
        return [(i * 50, "join", a) for i, a in enumerate(new[:n])]
    if config.churn == "scale_in":
        return [(i * 50, "leave", a) for i, a in enumerate(old[n - n // 2 :])] if n > 1 else []
    events: list[tuple[int, str, str]] = []
    for k in range(config.flaps):
        events.append((2 * k * config.flap_period_ms, "join", f"{new[0]}.{k}"))
        events.append(((2 * k + 1) * config.flap_period_ms, "leave", f"{new[0]}.{k}"))
    events.append((2 * config.flaps * config.flap_period_ms, "join", new[0]))
    return events


@dataclass(slots=True)
class Result:
    """What one leaderless rebalance did, measured from the churn start."""

    converged: bool
    time_to_converge_ms: int
    steps: int  # machine commands applied
    releases: int
    moves: int  # active changes on queues whose previous holder is still live
    cascades: int  # hand-offs of a queue beyond its first
    balance_std: float
    spread: int
    stickiness: float
    allocation_ms: float  # wall time of the decision function per poll (mean)
    initial_time_to_converge_ms: int
    initial_releases: int


@dataclass(slots=True)
class _App:
    name: str
    app_id: str
    connection: ConnectionId
    subscriptions: int = 0
    consumer_of: dict[str, ConsumerId] = field(default_factory=dict)
    live: bool = True


class Simulation:
    """The machine, the apps and the event queue of one run."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.state = fifo.init_state(2)
        self.index = 0
        self.now = 0
        self.queues = tuple(f"q{i:04d}" for i in range(config.queues))
        self.active: dict[str, str | None] = dict.fromkeys(self.queues)
        self.history: list[tuple[int, View]] = []
        self.apps: dict[str, _App] = {}
        self.events: list[tuple[int, int, str, str]] = []
        self.seq = 0
        self.releases = 0
        self.handoffs: dict[str, int] = dict.fromkeys(self.queues, 0)
        self.moves = 0
        self.last_change = 0
        self.decision_seconds = 0.0
        self.decisions = 0
        self.crashed = False  # only then can timers fire: skip the scan for deadlines before
        self.timer_at: int | None = None
        # next_deadline_ms is a minimum over queues: keep each queue's, recompute the touched
        # ones only (a one-queue probe state answers for one queue)
        self.deadlines: dict[str, int] = {}
        self.probe = fifo.init_state(2)
        self.changes = 0  # bumped whenever an active holder or the live set changes
        self.converged_at: tuple[int, bool] | None = None
        self.decided: dict[tuple[int, str], str | None] = {}
        cfg = QueueConfig(
            single_active_consumer=True, disconnected_timeout_ms=config.disconnected_timeout_ms
        )
        for q in self.queues:
            self.apply(DeclareQueue(q, cfg))
        self.snapshot()

    # --- the machine -----------------------------------------------------------------------

    def apply(self, command: object) -> None:
        self.index += 1
        meta = fifo.Meta(self.index, 1, self.now, 2)
        reply, _ = fifo.apply(meta, command, self.state)
        if isinstance(reply, Error):
            raise AssertionError(f"the machine refused {command!r}: {reply!r}")
        queue = getattr(command, "queue", None)
        touched = [queue] if isinstance(queue, str) else self.queues
        for q in touched:
            self.refresh(q)
        if self.crashed:
            for q in touched:
                self.probe.queues = {q: self.state.queues[q]}
                deadline = fifo.next_deadline_ms(self.probe)
                if deadline is None:
                    self.deadlines.pop(q, None)
                else:
                    self.deadlines[q] = deadline
            self.timer_at = min(self.deadlines.values()) if self.deadlines else None

    def refresh(self, q: str) -> None:
        holder = None
        # what `fifo.consumers` reports as active, without building every waiting one's info
        for c in self.state.queues[q].consumers.values():
            if c.status in ("up", "quiescing"):
                holder = app_of(GROUP, c.tag)
        before = self.active[q]
        if holder != before:
            self.changes += 1
            self.active[q] = holder
            self.last_change = self.now
            if holder is not None:
                self.handoffs[q] += 1
                if before is not None and self.apps[self._name(before)].live:
                    self.moves += 1

    def _name(self, app_id: str) -> str:
        return app_id.split(".", 1)[1]

    def snapshot(self) -> None:
        live = tuple(sorted(a.app_id for a in self.apps.values() if a.live))
        view = View(self.queues, tuple(self.active[q] for q in self.queues), live)
        if self.history and self.history[-1][1] == view:
            return
        self.history.append((self.now, view))

    def view_at(self, t: int) -> int:
        """The index of the newest snapshot taken at or before `t` (the first one if none)."""
        lo, hi = 0, len(self.history) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.history[mid][0] <= t:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def fire_timers(self) -> None:
        for command in fifo.due_commands(self.state, self.now):
            self.apply(command)

    # --- apps ------------------------------------------------------------------------------

    def schedule(self, at: int, kind: str, name: str) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, name))

    def join(self, name: str) -> None:
        number = len(self.apps) + 1
        app = _App(name, f"{self.now:09d}.{name}", ConnectionId(name, 0, number))
        self.apps[name] = app
        self.changes += 1
        for q in self.rng.sample(self.queues, len(self.queues)):
            self.subscribe(app, q)
        self.snapshot()
        self.schedule(self.now + self.rng.randint(1, self.config.poll_ms), "poll", name)

    def subscribe(self, app: _App, q: str) -> None:
        app.subscriptions += 1
        cid = ConsumerId(consumer_tag(GROUP, app.app_id, app.subscriptions), app.connection)
        app.consumer_of[q] = cid
        self.apply(Checkout(q, cid, SimplePrefetch(10)))

    def poll(self, name: str) -> None:
        app = self.apps[name]
        if not app.live:
            return
        delay = self.config.view_delay_ms
        seen = self.view_at(self.now - self.rng.randint(delay // 2, delay + delay // 2))
        key = (seen, app.app_id)
        if key not in self.decided:  # the rule is a pure function of (view, app): decide once
            started = time.perf_counter()
            if len(self.decided) >= DECISIONS_CACHED_MAX:
                self.decided.clear()
            self.decided[key] = choose_release(self.history[seen][1], app.app_id)
            self.decision_seconds += time.perf_counter() - started
            self.decisions += 1
        q = self.decided[key]
        if q is not None and self.active[q] == app.app_id:  # its own status comes by notice
            self.apply(Checkout(q, app.consumer_of[q], Cancel()))
            self.subscribe(app, q)
            self.releases += 1
            self.snapshot()
        jitter = self.rng.randint(0, self.config.poll_ms // 5)
        self.schedule(self.now + self.config.poll_ms + jitter, "poll", name)

    def leave(self, name: str, reason: Literal["normal", "noconnection"]) -> None:
        app = self.apps[name]
        app.live = False
        self.changes += 1
        self.crashed = self.crashed or reason == "noconnection"
        self.apply(ConnectionDown(app.connection, reason))
        self.snapshot()

    # --- running ---------------------------------------------------------------------------

    def converged(self) -> bool:
        """Every queue held by a live app, counts differing by at most one (cached until a
        holder or the live set changes)."""
        if self.converged_at is None or self.converged_at[0] != self.changes:
            self.converged_at = (self.changes, self._converged())
        return self.converged_at[1]

    def _converged(self) -> bool:
        live = {a.app_id for a in self.apps.values() if a.live}
        if not live:
            return True  # nobody left to balance over (the last app left or crashed)
        if any(self.active[q] not in live for q in self.queues):
            return False
        counts = dict.fromkeys(live, 0)
        for q in self.queues:
            counts[self.active[q] or ""] += 1
        return is_balanced(list(counts.values()))

    def run_until_quiet(self, deadline: int) -> bool:
        """Process events until balanced and unchanged long enough for every view to show it."""
        settle = self.config.view_delay_ms * 3 // 2 + self.config.poll_ms * 2
        while self.events or self.timer_at is not None:
            if self.timer_at is not None and (not self.events or self.timer_at < self.events[0][0]):
                self.now = max(self.now, self.timer_at)
                if self.now > deadline:
                    return False
                self.fire_timers()
                self.snapshot()
            else:
                at, _, kind, name = heapq.heappop(self.events)
                self.now = max(self.now, at)
                if self.now > deadline:
                    return False
                self.handle(kind, name)
            waiting = self.now - self.last_change <= settle or self.timer_at is not None
            if waiting and (self.events or self.timer_at is not None):
                continue
            if not any(k != "poll" for _, _, k, _ in self.events) and self.converged():
                return True
        return self.converged()

    def handle(self, kind: str, name: str) -> None:
        if kind == "poll":
            self.poll(name)
        elif kind == "join":
            self.join(name)
        else:
            self.leave(name, "normal" if kind == "leave" else "noconnection")

    def assignment(self) -> dict[str, str | None]:
        return dict(self.active)


def simulate(config: SimConfig) -> Result:
    """Start the apps, let them balance, apply the churn, and measure the rebalance."""
    sim = Simulation(config)
    for i in range(config.apps):
        sim.schedule(sim.rng.randint(0, 500), "join", f"app{i:03d}")
    sim.run_until_quiet(config.horizon_ms)
    initial_time, initial_releases = sim.last_change, sim.releases
    start = sim.now
    before = sim.assignment()
    sim.releases = sim.moves = 0
    sim.handoffs = dict.fromkeys(sim.queues, 0)
    steps_before = sim.index
    for offset, kind, name in membership_events(config):
        sim.schedule(start + offset, kind, name)
    done = sim.run_until_quiet(start + config.horizon_ms)
    live = {a.app_id for a in sim.apps.values() if a.live}
    counts = dict.fromkeys(live, 0)
    for holder in sim.active.values():
        if holder in counts:
            counts[holder] += 1
    values = list(counts.values()) or [0]
    kept = [q for q, a in before.items() if a in live]
    still = sum(1 for q in kept if sim.active[q] == before[q])
    return Result(
        converged=done,
        time_to_converge_ms=max(0, sim.last_change - start) if done else config.horizon_ms,
        steps=sim.index - steps_before,
        releases=sim.releases,
        moves=sim.moves,
        cascades=sum(max(0, n - 1) for n in sim.handoffs.values()),
        balance_std=statistics.pstdev(values),
        spread=max(values) - min(values),
        stickiness=still / len(kept) if kept else 1.0,
        allocation_ms=1000 * sim.decision_seconds / max(1, sim.decisions),
        initial_time_to_converge_ms=initial_time,
        initial_releases=initial_releases,
    )


def main(argv: list[str] | None = None) -> int:
    """Command line: one run, its result as JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m cluster.balance.simulator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--queues", type=int, default=6)
    parser.add_argument("--apps", type=int, default=3)
    parser.add_argument("--churn", choices=CHURNS, default="join")
    parser.add_argument("--view-delay-ms", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        config = SimConfig(args.queues, args.apps, args.churn, args.view_delay_ms, args.seed)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 64
    print(json.dumps(asdict(simulate(config))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
