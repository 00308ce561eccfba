"""Meta: what the log says about an entry, passed to `apply` with every command."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Meta:
    """Raft index and term of the entry, the submitter's clock, and the effective machine version.

    `system_time_ms` is made monotonic inside apply: the machine uses max(last time, this).
    """

    index: int
    term: int
    system_time_ms: int
    machine_version: int
