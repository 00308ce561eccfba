"""Upgrade dry-run: replay an exported log as it ran, and upgraded to version N at split points.

The baseline replays every command with the version effective in the log (following its own
upgrade entries) and checks that it reproduces the exported state. A split point is the start
of every k-th `cmds` entry (conversions happen between entries, as in the cluster) plus the end
of the log: there a copy of the baseline state is converted to N and the rest of the log runs on
it. Per split point: the conserved counters before and after the conversion, replies that differ
from the baseline's, errors. Safe when the counters are equal everywhere, nothing raised, and no
command got an error reply under N that the baseline did not give. Split points run in groups,
one streaming pass over the file each.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fifo
from fifo.meta import Meta
from fifo.replies import Error
from raft.entry import command_index
from raft.logfile import EndRecord, EntryRecord, LoggedCommand, SnapshotRecord, read_log

SPLITS_AUTO_MAX = 32  # --every default: at most this many split points (+ the end)
GROUP_SIZE = 8  # branch states held in memory at once
DIFFERENCES_SHOWN = 5
COUNTERS = ("queues", "total", "ready", "checked_out", "consumers", "enqueuers")
ProgressCallback = Callable[[int, int], None]  # (entries done, entries total)


@dataclass
class SplitResult:
    """One split point: the conversion there and the run of the rest of the log on N."""

    index: int  # the raft index of the first entry run upgraded (last index + 1 at the end)
    ordinal: int  # how many cmds entries ran before it
    status: str = "pending"  # ok | unsafe | skipped (already at N there)
    before: dict[str, int] = field(default_factory=dict)
    after: dict[str, int] = field(default_factory=dict)
    replies_compared: int = 0
    replies_differ: int = 0
    new_errors: int = 0
    errors: list[str] = field(default_factory=list)
    differences: list[dict[str, Any]] = field(default_factory=list)
    new_error_examples: list[dict[str, Any]] = field(default_factory=list)
    digest: str = ""

    @property
    def conserved(self) -> bool:
        """Whether the conversion kept every counter."""
        return self.before == self.after

    def finish(self) -> None:
        """Set the status from what was found."""
        if self.status == "pending":
            unsafe = not self.conserved or self.errors or self.new_errors
            self.status = "unsafe" if unsafe else "ok"

    def to_plain(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "index": self.index,
            "ordinal": self.ordinal,
            "status": self.status,
            "conserved": self.conserved,
            "before": self.before,
            "after": self.after,
            "replies_compared": self.replies_compared,
            "replies_differ": self.replies_differ,
            "new_errors": self.new_errors,
            "errors": self.errors,
            "differences": self.differences,
            "new_error_examples": self.new_error_examples,
            "digest": self.digest,
        }


@dataclass
class DryRunReport:
    """The whole dry-run."""

    log: str
    from_version: int
    to_version: int
    every: int
    entries: int
    commands: int
    splits: list[SplitResult]
    baseline_digest: str = ""
    baseline_errors: list[str] = field(default_factory=list)

    @property
    def safe(self) -> bool:
        """Exit-0 condition: every split point ok (or skipped) and the baseline ran cleanly."""
        return not self.baseline_errors and all(s.status != "unsafe" for s in self.splits)

    def to_plain(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "log": self.log,
            "safe": self.safe,
            "from_version": self.from_version,
            "to_version": self.to_version,
            "every": self.every,
            "entries": self.entries,
            "commands": self.commands,
            "split_points": len(self.splits),
            "unsafe_split_points": sum(s.status == "unsafe" for s in self.splits),
            "baseline_digest": self.baseline_digest,
            "baseline_errors": self.baseline_errors,
            "splits": [s.to_plain() for s in self.splits],
        }


def counters(state: Any) -> dict[str, int]:
    """The conserved counters summed over every queue."""
    totals = dict.fromkeys(COUNTERS, 0)
    for queue in fifo.list_queues(state):
        view = fifo.overview(state, queue)
        if view is None:
            continue
        totals["queues"] += 1
        totals["total"] += view.total
        totals["ready"] += view.ready + view.returned
        totals["checked_out"] += view.checked_out
        totals["consumers"] += view.consumers + view.waiting_consumers
        totals["enqueuers"] += view.enqueuers
    return totals


@dataclass
class _Run:
    """A machine state being driven through the log (the baseline or one branch)."""

    state: Any
    version: int
    split: SplitResult | None = None

    def apply(self, command: Any, meta: Meta) -> Any:
        """Apply with this run's version; an exception becomes an error string, not a crash."""
        try:
            reply, _effects = fifo.apply(
                Meta(meta.index, meta.term, meta.system_time_ms, self.version), command, self.state
            )
        except Exception as err:
            return f"{type(command).__name__} at index {meta.index} raised {err!r}"
        return reply

    def upgrade(self, to: int, meta: Meta) -> str | None:
        """Convert to `to` (no-op if already there); an error string if the conversion raised."""
        if to <= self.version:
            return None
        try:
            self.state = fifo.convert(self.state, self.version, to, meta)
        except Exception as err:
            return f"conversion v{self.version}->v{to} at index {meta.index} raised {err!r}"
        self.version = to
        return None


# --- planning ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Plan:
    entries: int
    commands: int
    cmds_entries: int
    last_index: int


def _plan(path: Path) -> _Plan:
    entries = commands = cmds_entries = last_index = 0
    for record in read_log(path):
        if isinstance(record, SnapshotRecord):
            last_index = record.index
        elif isinstance(record, EntryRecord):
            entries += 1
            last_index = record.index
            if record.kind == "cmds":
                cmds_entries += 1
                commands += len(record.commands)
    return _Plan(entries, commands, cmds_entries, last_index)


def default_every(cmds_entries: int) -> int:
    """The `--every` used when none is given: at most SPLITS_AUTO_MAX split points."""
    return max(1, math.ceil(cmds_entries / SPLITS_AUTO_MAX))


# --- running -------------------------------------------------------------------------------------


def _decoded(commands: tuple[LoggedCommand, ...]) -> Iterator[tuple[Any, Meta]]:
    for logged in commands:
        try:
            yield fifo.decode(logged.blob), logged.meta
        except Exception:  # the cluster refused it the same way; nothing to compare
            continue


def _compare(split: SplitResult, command: Any, meta: Meta, base: Any, reply: Any) -> None:
    split.replies_compared += 1
    if isinstance(reply, str):
        split.errors.append(reply)
        return
    if reply == base:
        return
    split.replies_differ += 1
    example = {
        "index": meta.index,
        "command": type(command).__name__,
        "baseline": repr(base),
        "upgraded": repr(reply),
    }
    if len(split.differences) < DIFFERENCES_SHOWN:
        split.differences.append(example)
    if isinstance(reply, Error) and not isinstance(base, Error):
        split.new_errors += 1
        if len(split.new_error_examples) < DIFFERENCES_SHOWN:
            split.new_error_examples.append(example)


class _Pass:
    """One streaming pass: the baseline plus the branches of a group of split points."""

    def __init__(self, to_version: int, group: list[SplitResult], report: DryRunReport) -> None:
        self.to_version = to_version
        self.pending = list(group)
        self.branches: list[_Run] = []
        self.report = report
        self.baseline = _Run(fifo.init_state(1), 1)
        self.ordinal = 0
        self.last_time = 0
        self.last_term = 0

    def snapshot(self, record: SnapshotRecord) -> None:
        """Start from the log's snapshot."""
        self.baseline = _Run(fifo.restore(record.state["fifo"]), 0)
        self.baseline.version = fifo.state_version(self.baseline.state)
        self.last_time = int(record.state["meta"]["last_time_ms"])

    def split_due(self, index: int) -> None:
        """Open the branches whose split point is this entry."""
        while self.pending and self.pending[0].ordinal == self.ordinal:
            split = self.pending.pop(0)
            split.index = index
            self._open(split, index)

    def _open(self, split: SplitResult, index: int) -> None:
        if self.baseline.version >= self.to_version:
            split.status = "skipped"
            return
        split.before = counters(self.baseline.state)
        branch = _Run(self.baseline.state, self.baseline.version, split)
        meta = Meta(command_index(index, 0), self.last_term, self.last_time, self.to_version)
        error = branch.upgrade(self.to_version, meta)
        if error is not None:
            split.errors.append(error)
            return
        split.after = counters(branch.state)
        self.branches.append(branch)

    def entry(self, record: EntryRecord) -> None:
        """Run one entry on the baseline and on every open branch."""
        self.last_term = record.term
        if record.kind == "upgrade" and record.applied:
            meta = Meta(command_index(record.index, 0), record.term, self.last_time, record.version)
            for run in (self.baseline, *self.branches):
                error = run.upgrade(record.version, meta)
                if error is not None:
                    target = run.split.errors if run.split else self.report.baseline_errors
                    target.append(error)
            return
        if record.kind == "cmds":
            self.split_due(record.index)
            self.ordinal += 1
        for command, meta in _decoded(record.commands):
            self.last_time = max(self.last_time, meta.system_time_ms)
            base = self.baseline.apply(command, meta)
            if isinstance(base, str):
                self.report.baseline_errors.append(base)
            for branch in self.branches:
                assert branch.split is not None
                _compare(branch.split, command, meta, base, branch.apply(command, meta))

    def finish(self, last_index: int) -> None:
        """Open the end-of-log split point if it is in this group, and settle the results."""
        self.split_due(last_index + 1)
        for branch in self.branches:
            assert branch.split is not None
            branch.split.digest = fifo.digest(branch.state)


def _run_pass(
    path: Path,
    plan: _Plan,
    to_version: int,
    group: list[SplitResult],
    report: DryRunReport,
    tick: Callable[[], None],
) -> str:
    run = _Pass(to_version, group, report)
    expected = ""
    for record in read_log(path):
        if isinstance(record, SnapshotRecord):
            run.snapshot(record)
        elif isinstance(record, EntryRecord):
            run.entry(record)
            tick()
        elif isinstance(record, EndRecord):
            expected = record.fifo_digest
    run.finish(plan.last_index)
    digest = fifo.digest(run.baseline.state)
    if expected and digest != expected:
        report.baseline_errors.append(
            f"the replay does not reproduce the exported state (fifo digest {digest[:12]} != "
            f"{expected[:12]}): the log was written by other code, or it is corrupt"
        )
    return digest


def _from_version(path: Path) -> int:
    for record in read_log(path, require_end=False):
        if isinstance(record, SnapshotRecord):
            return int(record.state["meta"]["effective_version"])
        if isinstance(record, EntryRecord) and record.kind == "cmds" and record.commands:
            return record.commands[0].meta.machine_version
    return 1


def dry_run(
    path: Path,
    to_version: int,
    every: int | None = None,
    progress: ProgressCallback | None = None,
) -> DryRunReport:
    """Replay the log at `path` as it ran and upgraded to `to_version` at every k-th cmds entry."""
    fifo.machine_for(to_version)  # UnsupportedVersionError before any work
    plan = _plan(path)
    step = every if every is not None else default_every(plan.cmds_entries)
    ordinals = [*range(0, plan.cmds_entries, step), plan.cmds_entries]
    splits = [SplitResult(index=0, ordinal=o) for o in ordinals]
    report = DryRunReport(
        str(path), _from_version(path), to_version, step, plan.entries, plan.commands, splits
    )
    groups = [splits[i : i + GROUP_SIZE] for i in range(0, len(splits), GROUP_SIZE)]
    total, done = plan.entries * len(groups), 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None and (done % 64 == 0 or done == total):
            progress(done, total)

    for group in groups:
        report.baseline_digest = _run_pass(path, plan, to_version, group, report, tick)
    for split in splits:
        split.finish()
    report.baseline_errors = list(dict.fromkeys(report.baseline_errors))  # repeated per pass
    return report
