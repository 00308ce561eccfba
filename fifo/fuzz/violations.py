"""The fuzzer's result types."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Violation:
    """An invariant that failed after applying the entry at `step` (0-based log position)."""

    step: int
    command: str
    invariant: str
    detail: str


@dataclass(slots=True)
class FuzzResult:
    """What one seeded run did and found; `reproduce` is the command line that replays it.

    `ready` and `total` are summed over the queues at the end (ready includes returned messages).
    """

    seed: int
    steps: int
    initial_machine_version: int
    final_machine_version: int
    upgrade_index: int | None
    digest: str
    violations: list[Violation]
    ready: int
    total: int
    reproduce: str
    steps_run: int = 0
    error_replies: int = 0
    deliveries: int = 0
    snapshot_index: int | None = None
    command_counts: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when no invariant failed."""
        return not self.violations
