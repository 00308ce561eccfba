"""`scripts/chaos.py --workload groups`: refused, with the reason, until the machine has groups."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import fifo.commands
from cluster.chaos.group_workload import GroupParams, unavailable_reason

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "chaos.py"


def test_the_groups_workload_says_why_it_cannot_run_before_the_machine_has_groups() -> None:
    """Exit 69 (unavailable) and the reason on stderr, before any cluster is started."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--workload", "groups", "--duration", "10"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if hasattr(fifo.commands, "JoinGroup"):
        assert unavailable_reason() is None
        return
    assert done.returncode == 69, done.stderr
    assert "no consumer groups" in done.stderr


def test_the_partition_queues_are_named_queue_dot_index() -> None:
    """The member queues the workload consumes and drains."""
    assert GroupParams(queue="orders", partitions=3).partition_queues() == (
        "orders.0", "orders.1", "orders.2",
    )  # fmt: skip
