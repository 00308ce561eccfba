"""One case of the rebalance study: the same churn under every strategy, one metrics row each.

The leaderless balancer runs in `simulator` on the real machine. The allocation strategies are
replayed on the same membership timeline: each change (a crash counts once the disconnected
timeout has passed, as on the machine) recomputes the assignment from the previous one. Their
time to converge: the server-side sticky assignment is computed in the log and pushed to the
members as notices, so it takes one hand-over (`HANDOVER_MS`, a release and an activation
through the log); RocketMQ's client-side strategies converge when the last client has both seen
the new membership (its view is `view_delay_ms` old, jittered) and reached its next rebalance
poll. Views that disagree in between (RocketMQ's double or missed consumption) are not modelled.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from cluster.balance import sticky
from cluster.balance.simulator import SimConfig, membership_events, simulate
from cluster.balance.strategies import STRATEGIES

HANDOVER_MS = 10
STRATEGY_NAMES: tuple[str, ...] = ("leaderless", *STRATEGIES)


@dataclass(frozen=True, slots=True)
class Case:
    """One point of the grid (every strategy runs it)."""

    queues: int
    apps: int
    churn: str
    view_delay_ms: int
    seed: int
    horizon_ms: int = 60_000


def run_case(case: Case, strategies: Sequence[str] = STRATEGY_NAMES) -> list[dict[str, object]]:
    """Metrics rows (see `pipeline.rebalance_job.RESULT_SCHEMA`) for each strategy."""
    config = SimConfig(
        case.queues, case.apps, case.churn, case.view_delay_ms, case.seed,  # type: ignore[arg-type]
        horizon_ms=case.horizon_ms,
    )  # fmt: skip
    rows = []
    for name in strategies:
        if name == "leaderless":
            result = asdict(simulate(config))
            del result["initial_time_to_converge_ms"], result["initial_releases"]
        else:
            result = _allocate(name, config)
        rows.append({"strategy": name, **asdict(case), **result})
        del rows[-1]["horizon_ms"]
    return rows


def _allocate(name: str, config: SimConfig) -> dict[str, object]:
    strategy = STRATEGIES[name]
    rng = random.Random(config.seed)
    queues = [f"q{i:04d}" for i in range(config.queues)]
    members = [f"app{i:03d}" for i in range(config.apps)]
    current = strategy(queues, members, {})
    before = current
    changes = _changes(config)
    moved = handoffs = 0
    per_queue: dict[str, int] = dict.fromkeys(queues, 0)
    seconds = 0.0
    for _, kind, member in changes:
        members = [*members, member] if kind == "join" else [m for m in members if m != member]
        started = time.perf_counter()
        nxt = strategy(queues, members, current)
        seconds += time.perf_counter() - started
        moved += sticky.moves(current, nxt)
        owners_before = _owners(current)  # once per change, not once per queue
        for q, owner in _owners(nxt).items():
            if owners_before.get(q) != owner:
                per_queue[q] += 1
        current = nxt
    handoffs = sum(max(0, n - 1) for n in per_queue.values())
    counts = [len(current.get(m, ())) for m in members] or [0]
    owners_first, owners_last = _owners(before), _owners(current)
    alive = [q for q, owner in owners_first.items() if owner in members]
    kept = sum(1 for q in alive if owners_last.get(q) == owners_first[q])
    last = changes[-1][0] if changes else 0
    return {
        "converged": True,
        "time_to_converge_ms": _converge_ms(name, config, members, last, rng) if changes else 0,
        "steps": len(changes) + 2 * moved,
        "releases": moved,
        "moves": moved,
        "cascades": handoffs,
        "balance_std": statistics.pstdev(counts),
        "spread": max(counts) - min(counts),
        "stickiness": kept / len(alive) if alive else 1.0,
        "allocation_ms": 1000 * seconds / max(1, len(changes)),
    }


def _changes(config: SimConfig) -> list[tuple[int, str, str]]:
    """Membership changes in time order; a crash takes effect after the disconnected timeout."""
    out = [
        (t + (config.disconnected_timeout_ms if kind == "crash" else 0), kind, member)
        for t, kind, member in membership_events(config)
    ]
    return sorted(out, key=lambda change: change[0])


def _owners(assignment: Mapping[str, Sequence[str]]) -> dict[str, str]:
    return {q: m for m, qs in assignment.items() for q in qs}


def _converge_ms(
    name: str, config: SimConfig, members: list[str], last: int, rng: random.Random
) -> int:
    if name == "sticky":
        return last + HANDOVER_MS
    delay = config.view_delay_ms
    slowest = 0
    for _ in members:  # each client: sees the change after its view delay, acts at its next poll
        seen = last + rng.randint(delay // 2, delay + delay // 2)
        phase = rng.randint(0, config.poll_ms)
        slowest = max(slowest, seen + phase)
    return slowest
