"""Seeded, model-driven fuzzing of the fifo machine: a log generator and per-step invariants.

Pure like the rest of `fifo`: its PRNG is splitmix64 (`fifo.fuzz.prng`), its clock is virtual.
"""

from __future__ import annotations

from fifo.fuzz.prng import SplitMix64
from fifo.fuzz.runner import ApplyFn, LogEntry, Upgrade, generate_log, replay, run, run_with_log
from fifo.fuzz.shrink import ShrinkResult, shrink
from fifo.fuzz.violations import FuzzResult, Violation

__all__ = [
    "ApplyFn",
    "FuzzResult",
    "LogEntry",
    "ShrinkResult",
    "SplitMix64",
    "Upgrade",
    "Violation",
    "generate_log",
    "replay",
    "run",
    "run_with_log",
    "shrink",
]
