"""Which of aio-pika's own tests apply to quorumq, and why the others do not (placeholder)."""

from __future__ import annotations


def classify(test: str, outcome: str) -> tuple[str, str]:
    """(verdict, reason) for one test's outcome."""
    if outcome == "passed":
        return "passed", ""
    if outcome == "skipped":
        return "skipped", ""
    return "failed", ""


def must_pass(test: str) -> bool:
    """Whether `test` is one that must pass."""
    return False
