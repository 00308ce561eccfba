"""Shrink a failing fuzz run to a short log that still breaks the same invariant (ddmin).

The log keeps its original Meta (indexes, times, versions), so v2 compact consumer keys and
timestamps stay valid in any subsequence; upgrade points are entries like the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import fifo
from fifo.fuzz.invariants import Checker
from fifo.fuzz.runner import (
    ApplyFn,
    LogEntry,
    Upgrade,
    UpgradeAt,
    check_codec,
    check_queries,
    check_timers_at,
    crashed,
    resolving,
    run_with_log,
)
from fifo.replies import Error

REPLAYS_MAX = 400


@dataclass(frozen=True, slots=True)
class ShrinkResult:
    """The shortest log found that still breaks `invariant` (`reproducible` False: the replay
    of the full prefix did not break it, e.g. a sampled or bad-input-only check)."""

    invariant: str
    entries: list[LogEntry]
    original_length: int
    replays: int
    reproducible: bool

    def lines(self) -> list[str]:
        """One readable line per entry: `index @time vN: Command(...)` or the upgrade."""
        out: list[str] = []
        for entry in self.entries:
            if isinstance(entry, Upgrade):
                out.append(
                    f"upgrade to v{entry.meta.machine_version} before index {entry.meta.index}"
                )
            else:
                meta, command = entry
                out.append(
                    f"{meta.index} @{meta.system_time_ms} v{meta.machine_version}: {command!r}"
                )
        return out


def breaks(entries: list[LogEntry], version: int, apply_fn: ApplyFn, invariant: str) -> bool:
    """Replay `entries` from an empty state of `version`; True when `invariant` fails."""
    state, checker = fifo.init_state(version), Checker()
    apply_fn = resolving(apply_fn)
    for entry in entries:
        if isinstance(entry, Upgrade):
            target = entry.meta.machine_version
            state = fifo.convert(state, fifo.state_version(state), target, entry.meta)
            continue
        meta, command = entry
        before = fifo.digest(state) if invariant == "error_changed_state" else None
        peek = checker.before(state, command)
        try:
            reply, effects = apply_fn(meta, command, state)
        except Exception:  # apply_raised is what we look for, or a different failure
            return invariant == "apply_raised"
        if crashed(reply):  # v1-v3's catch-all answered a handler that raised
            return invariant == "apply_rejected"
        found = [name for name, _ in checker.after(state, command, reply, effects, peek)]
        if before is not None and isinstance(reply, Error) and fifo.digest(state) != before:
            found.append("error_changed_state")
        found += [
            name
            for name, _ in _sampled_checks(
                invariant, state, meta, apply_fn, [command, reply, *effects]
            )
        ]
        if invariant in found:
            return True
    return False


def _sampled_checks(
    invariant: str, state: fifo.State, meta: fifo.Meta, apply_fn: ApplyFn, objects: list[object]
) -> list[tuple[str, str]]:
    """The checks a run only samples, done at every step when they are the target."""
    if invariant.startswith("timer"):
        return check_timers_at(state, meta.system_time_ms, meta, apply_fn)
    if invariant == "codec_round_trip":
        return check_codec(objects)
    if invariant.startswith("query_"):
        return check_queries(state)
    return []


def ddmin(
    items: list[LogEntry], fails: Callable[[list[LogEntry]], bool], budget: int
) -> tuple[list[LogEntry], int]:
    """Delta debugging by complements: drop chunks while the log still fails."""
    chunks, replays = 2, 0
    while len(items) >= 2 and replays < budget:
        size = -(-len(items) // chunks)
        for start in range(0, len(items), size):
            candidate = items[:start] + items[start + size :]
            replays += 1
            if candidate and fails(candidate):
                items, chunks = candidate, max(chunks - 1, 2)
                break
            if replays >= budget:
                return items, replays
        else:
            if chunks >= len(items):
                break
            chunks = min(len(items), chunks * 2)
    return items, replays


def shrink(
    seed: int,
    steps: int,
    machine_version: int,
    upgrade_at: UpgradeAt = None,
    apply_fn: ApplyFn | None = None,
    replays_max: int = REPLAYS_MAX,
) -> ShrinkResult | None:
    """Re-run a seed; if it breaks an invariant, shrink its log to a minimal failing one."""
    log, result = run_with_log(seed, steps, machine_version, upgrade_at, apply_fn=apply_fn)
    if not result.violations:
        return None
    target = result.violations[0]
    commands_seen, cut = 0, len(log)
    for position, entry in enumerate(log):
        if not isinstance(entry, Upgrade):
            commands_seen += 1
            if commands_seen == target.step + 1:
                cut = position + 1
                break
    prefix = log[:cut]
    machine = apply_fn or fifo.apply

    def fails(entries: list[LogEntry]) -> bool:
        return breaks(entries, machine_version, machine, target.invariant)

    if not fails(prefix):
        return ShrinkResult(target.invariant, prefix, len(prefix), 1, False)
    minimal, replays = ddmin(prefix, fails, replays_max)
    return ShrinkResult(target.invariant, minimal, len(prefix), replays + 1, True)
