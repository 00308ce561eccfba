"""The layering of the packages, written once and checked on every import (lazy ones included).

`ARROWS` is the table: which layer may import which (DESIGN.md: `cluster -> raft -> fifo`,
`pipeline -> fifo`). A layer may always import itself. Every `import`, `from ... import` and
literal `importlib.import_module("...")` / `__import__("...")` in `fifo`, `raft`, `cluster`,
`pipeline` and `scripts` (at module level, inside functions, under `TYPE_CHECKING` alike) must
follow an arrow, or be one of the `KNOWN_EXCEPTIONS` of today (named by file, each still present:
fixing one means deleting its line, so the list only shrinks).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fifo", "raft", "cluster", "pipeline", "scripts")

# The layer of each part of cluster (a module or a subpackage); other packages are one layer each.
CLUSTER_LAYERS = {
    "cluster": "cluster.base",  # cluster/__init__.py
    "cluster.errors": "cluster.base",
    "cluster.config": "cluster.base",
    "cluster.protocol": "cluster.base",
    "cluster.nodelock": "cluster.base",
    "cluster.tls": "cluster.base",
    "cluster.bundles": "cluster.base",
    "cluster.balance": "cluster.balance",
    "cluster.client": "cluster.client",
    "cluster.rawclient": "cluster.tools",
    "cluster.launcher": "cluster.tools",
    "cluster.integrations": "cluster.tools",
    "cluster.node": "cluster.server",
    "cluster.amqp": "cluster.server",
    "cluster.management": "cluster.server",
    "cluster.chaos": "cluster.chaos",
    "cluster.cli": "cluster.cli",
}

# The arrows: layer -> the layers it may import (besides itself).
ARROWS: dict[str, frozenset[str]] = {
    "fifo": frozenset(),
    "raft": frozenset({"fifo"}),
    "pipeline": frozenset({"fifo"}),
    "cluster.balance": frozenset({"fifo"}),
    "cluster.base": frozenset({"fifo", "raft"}),
    "cluster.client": frozenset({"fifo", "cluster.base", "cluster.balance"}),
    "cluster.tools": frozenset({"fifo", "cluster.base", "cluster.client"}),
    "cluster.server": frozenset({"fifo", "raft", "cluster.base", "cluster.client"}),
    "cluster.chaos": frozenset({"fifo", "raft", "cluster.base", "cluster.client", "cluster.tools"}),
    "cluster.cli": frozenset(
        {"fifo", "raft", "cluster.base", "cluster.balance", "cluster.client", "cluster.tools"}
        | {"cluster.server"}
    ),
    "scripts": frozenset({"fifo", "raft", "pipeline", *CLUSTER_LAYERS.values()}),
}

# Imports against the arrows that exist today (issue 30): (file, imported layer). Only shrinks.
KNOWN_EXCEPTIONS: frozenset[tuple[str, str]] = frozenset(
    {
        # the simulator runs the real node code (its clock seam, its reconciliation)
        ("raft/sim/patches.py", "cluster.server"),
        ("raft/sim/session.py", "cluster.server"),
        # pipeline reads raft's log format and runs raft.sim; the balancer job runs cluster.balance
        ("pipeline/logscan.py", "raft"),
        ("pipeline/workload.py", "raft"),
        ("pipeline/simulate_job.py", "raft"),
        ("pipeline/rebalance_job.py", "cluster.balance"),
        # the CLI starts the Spark jobs (lazily): with the line above, the cluster/pipeline cycle
        ("cluster/cli/rebalance_eval.py", "pipeline"),
        ("cluster/cli/pipeline_analyze.py", "pipeline"),
        ("cluster/cli/pipeline_simulate.py", "pipeline"),
        ("cluster/cli/pipeline.py", "pipeline"),
    }
)


def layer_of(module: str) -> str | None:
    """The layer a dotted module name belongs to, or None when it is not ours."""
    parts = module.split(".")
    if parts[0] not in PACKAGES:
        return None
    if parts[0] != "cluster":
        return parts[0]
    unit = ".".join(parts[:2])
    return CLUSTER_LAYERS.get(unit, f"unlisted {unit}")  # a new part of cluster needs a layer


def module_name(path: Path, root: Path) -> str:
    """The dotted name of a file below `root` (a package's `__init__` is the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path) -> Iterator[str]:
    """Every module a file imports, absolute, anywhere in it; `from pkg import mod` gives both."""
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            yield module
            yield from (f"{module}.{alias.name}".lstrip(".") for alias in node.names)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            function = node.func
            name = function.attr if isinstance(function, ast.Attribute) else ""
            name = function.id if isinstance(function, ast.Name) else name
            if name in ("import_module", "__import__"):
                yield str(node.args[0].value)


def violations(root: Path) -> set[tuple[str, str]]:
    """(file, imported layer) for every import below `root` that follows no arrow."""
    found: set[tuple[str, str]] = set()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            own = layer_of(module_name(path, root))
            assert own is not None and own in ARROWS, f"{path}: no layer in the table"
            for module in imported_modules(path, root):
                target = layer_of(module)
                if target is not None and target != own and target not in ARROWS[own]:
                    found.add((path.relative_to(root).as_posix(), target))
    return found


def test_every_import_follows_the_layering() -> None:
    """No import in the tree goes against the arrows, apart from the listed exceptions."""
    unexpected = sorted(violations(ROOT) - KNOWN_EXCEPTIONS)
    assert not unexpected, "imports against the layering:\n" + "\n".join(map(str, unexpected))


def test_every_known_exception_still_exists() -> None:
    """An exception that was fixed is deleted from the list, so the list only shrinks."""
    gone = KNOWN_EXCEPTIONS - violations(ROOT)
    assert not gone, f"fixed: delete from KNOWN_EXCEPTIONS: {sorted(gone)}"


def test_every_subpackage_of_cluster_has_a_layer() -> None:
    """A new subpackage of cluster gets its own row, not a neighbour's by default."""
    for sub in (ROOT / "cluster").iterdir():
        if (sub / "__init__.py").is_file() or sub.suffix == ".py":
            assert layer_of(f"cluster.{sub.stem}") in ARROWS or sub.stem == "__init__", sub


def test_the_table_has_no_cycle() -> None:
    """The arrows between layers go one way: following them never comes back."""

    def visit(layer: str, trail: tuple[str, ...]) -> None:
        assert layer not in trail, f"cycle: {' -> '.join((*trail, layer))}"
        for below in ARROWS[layer]:
            visit(below, (*trail, layer))

    for layer in ARROWS:
        visit(layer, ())


def test_a_planted_upward_import_is_caught(tmp_path: Path) -> None:
    """The check is not vacuous: lazy, relative, dynamic and `from pkg import mod` ones fail."""
    files = {
        "fifo/__init__.py": "",
        "fifo/core.py": "def f() -> None:\n    from raft import node\n",
        "raft/__init__.py": "import cluster.protocol\n",
        "raft/x.py": "import importlib\nimportlib.import_module('pipeline.spark')\n",
        "cluster/__init__.py": "",
        "cluster/client/__init__.py": "from ..node import server\n",
        "cluster/client/x.py": "if False:\n    from cluster import node\n",
        "cluster/balance/__init__.py": "__import__('cluster.client')\n",
        "pipeline/__init__.py": "from cluster.client import Client\n",
        "scripts/x.py": "import pipeline, cluster.cli\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert violations(tmp_path) == {
        ("fifo/core.py", "raft"),
        ("raft/__init__.py", "cluster.base"),
        ("raft/x.py", "pipeline"),
        ("cluster/client/__init__.py", "cluster.server"),
        ("cluster/client/x.py", "cluster.server"),
        ("cluster/balance/__init__.py", "cluster.client"),
        ("pipeline/__init__.py", "cluster.client"),
    }
