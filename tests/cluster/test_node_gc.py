"""The node's garbage collector tuning: fewer collections, cyclic garbage still collected."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import gc, weakref
    from cluster.node.server import GC_GEN0_THRESHOLD, tune_gc

    before = gc.get_threshold()
    tune_gc()
    after = gc.get_threshold()
    assert after == (GC_GEN0_THRESHOLD, before[1], before[2]), (before, after)
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0  # what was alive at start is no longer walked

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    gone = weakref.ref(a)
    del a, b
    garbage = [[] for _ in range(3 * GC_GEN0_THRESHOLD)]  # allocations trigger collections
    assert gone() is None, "cyclic garbage was never collected"
    print("ok")
    """
)


def test_tune_gc_raises_the_young_threshold_and_still_collects_cycles() -> None:
    """In a fresh interpreter (the test process's collector stays as it is)."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
