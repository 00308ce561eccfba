"""pysyncobj's private names live in one module (issue 26): raft/syncobj_adapter.py.

No other module of raft/ or cluster/ spells a `_SyncObj__` name, raft/node.py stays a thin node
(under 500 lines), and every private name the adapter lists still exists in the installed
pysyncobj (a method on its class, or an attribute its source assigns), so an upgrade of pysyncobj
that renames one fails here rather than at run time."""

from __future__ import annotations

import inspect
from pathlib import Path

from raft.syncobj_adapter import PRIVATE_NAMES

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = ROOT / "raft" / "syncobj_adapter.py"


def test_no_module_but_the_adapter_names_a_pysyncobj_private() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for package in ("raft", "cluster")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != ADAPTER and "_SyncObj__" in path.read_text(encoding="utf-8")
    ]
    assert offenders == []


def test_the_node_module_stays_thin() -> None:
    lines = len((ROOT / "raft" / "node.py").read_text(encoding="utf-8").splitlines())
    assert lines < 500, f"raft/node.py has {lines} lines: move a seam into its own module"


def test_every_listed_private_exists_in_the_installed_pysyncobj() -> None:
    missing = []
    for owner, names in PRIVATE_NAMES.items():
        source = inspect.getsource(owner)
        for name in names:
            mangled = f"_{owner.__name__}__{name}"
            assigned = f"self.__{name} =" in source or f"self.__{name}," in source
            if not hasattr(owner, mangled) and not assigned:
                missing.append(f"{owner.__name__}.__{name}")
    assert missing == []
