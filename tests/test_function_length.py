"""No function in `fifo`, `raft`, `cluster` or `pipeline` runs past 60 lines (STYLE.md).

The functions longer than that today are listed with their length: they may shrink (then their
line goes) but not grow, and a new long function fails. Measured from `def` to the last line of
the body (decorators, like a CLI command's click options, are not counted).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fifo", "raft", "cluster", "pipeline")
LIMIT = 60

# file:function -> its length today (issue 30 names them; to be split by their owners).
LONG_TODAY = {
    "cluster/chaos/run.py:_run_workload": 68,
    "cluster/chaos/run.py:_report": 79,
    "cluster/cli/cluster_cmd.py:start": 61,
    "cluster/cli/publish.py:publish": 69,
    "cluster/cli/queue.py:declare": 72,
    "cluster/config.py:dumps": 65,
    "cluster/launcher.py:init_cluster": 61,
    "cluster/launcher.py:start_cluster": 61,
    "cluster/node/metrics.py:__init__": 84,
    "cluster/node/server.py:run_node": 63,
    "cluster/node/server.py:__init__": 77,
    "pipeline/analyze.py:run_analysis": 104,
    "pipeline/logscan.py:scan_log": 68,
    "pipeline/replay.py:_sync": 94,
}


def long_functions(source: str, where: str) -> dict[str, int]:
    """`where:name` -> length for every function (nested ones too) over LIMIT lines."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > LIMIT:
                key = f"{where}:{node.name}"
                found[key] = max(length, found.get(key, 0))
    return found


def tree_long_functions() -> dict[str, int]:
    found: dict[str, int] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found |= long_functions(path.read_text(), path.relative_to(ROOT).as_posix())
    return found


def test_no_function_is_longer_than_the_limit_or_than_it_was() -> None:
    """A long function is new (fails) or one of today's, no longer than it was."""
    problems = [
        f"{name}: {length} lines (limit {LIMIT}, listed at {LONG_TODAY.get(name)})"
        for name, length in sorted(tree_long_functions().items())
        if length > LONG_TODAY.get(name, LIMIT)
    ]
    assert not problems, "\n".join(problems)


def test_the_list_only_shrinks() -> None:
    """A listed function that was split (or got shorter) has its line deleted or lowered."""
    found = tree_long_functions()
    stale = [f"{name}: now {found.get(name, '<= 60')}" for name, length in LONG_TODAY.items()
             if found.get(name) != length]  # fmt: skip
    assert not stale, "update LONG_TODAY:\n" + "\n".join(stale)


def test_a_long_function_is_caught() -> None:
    """The check is not vacuous: a 61-line function is reported, a 60-line one is not."""
    body = "    x = 1\n"
    assert long_functions("def f():\n" + body * 60, "a.py") == {"a.py:f": 61}
    assert long_functions("def f():\n" + body * 59, "a.py") == {}
