"""`fifo/` is pure: every module imports only pure standard-library modules, cbor2 and fifo."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

FIFO_DIR = Path(__file__).resolve().parents[2] / "fifo"

# Standard-library modules with no I/O, clock, randomness or concurrency.
PURE_STDLIB = frozenset({
    "__future__", "abc", "bisect", "collections", "copy", "dataclasses", "enum", "functools",
    "hashlib", "heapq", "itertools", "math", "numbers", "operator", "re", "struct", "types",
    "typing", "typing_extensions", "string", "textwrap", "contextlib", "decimal", "fractions",
    "array", "binascii", "base64", "codecs", "keyword", "reprlib", "graphlib", "weakref",
})
ALLOWED_THIRD_PARTY = frozenset({"cbor2"})
# Named here so the failure message can say why; anything not allowed fails anyway.
KNOWN_IMPURE = frozenset({
    "time", "random", "socket", "threading", "asyncio", "os", "subprocess", "logging",
    "pysyncobj", "raft", "cluster", "pipeline", "structlog", "datetime", "uuid", "secrets",
    "multiprocessing", "signal", "select", "selectors", "io", "pathlib", "shutil", "tempfile",
    "sys", "pickle", "marshal", "importlib", "ctypes", "concurrent", "sched", "queue", "http",
    "urllib", "ssl", "platform", "sqlite3", "shelve", "glob", "fnmatch", "warnings", "gc",
})


def imported_roots(source: str, module_path: Path) -> list[tuple[int, str]]:
    """Top-level package names imported by a module, with their line numbers."""
    tree = ast.parse(source, filename=str(module_path))
    roots: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module is not None:
                roots.append((node.lineno, node.module.split(".")[0]))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            roots.append((node.lineno, "__import__"))
    return roots


def impure_imports(source: str, module_path: Path) -> list[str]:
    """The forbidden imports of one module, as readable lines."""
    bad: list[str] = []
    for line, root in imported_roots(source, module_path):
        if root == "fifo" or root in PURE_STDLIB or root in ALLOWED_THIRD_PARTY:
            continue
        why = " (impure)" if root in KNOWN_IMPURE else " (not on the pure allow-list)"
        bad.append(f"{module_path.name}:{line} imports {root}{why}")
    return bad


def fifo_modules() -> list[Path]:
    return sorted(FIFO_DIR.rglob("*.py"))


def test_fifo_has_modules_to_check() -> None:
    """The scan finds the contract modules (a wrong path would make the purity test vacuous)."""
    names = {p.name for p in fifo_modules()}
    assert {"commands.py", "replies.py", "effects.py", "meta.py"} <= names


@pytest.mark.parametrize("module_path", fifo_modules(), ids=lambda p: str(p.relative_to(FIFO_DIR)))
def test_module_imports_only_pure_modules(module_path: Path) -> None:
    """Every module under fifo/ imports only pure stdlib modules, cbor2 and fifo itself."""
    assert impure_imports(module_path.read_text(), module_path) == []


@pytest.mark.parametrize(
    ("source", "culprit"),
    [
        ("import time\n", "time"),
        ("from random import randint\n", "random"),
        ("import os.path\n", "os"),
        ("def f():\n    import socket\n", "socket"),
        ("from raft.log import Entry\n", "raft"),
        ("import structlog\n", "structlog"),
        ("x = __import__('threading')\n", "__import__"),
    ],
)
def test_checker_catches_impure_imports(source: str, culprit: str) -> None:
    """The checker itself flags each kind of forbidden import, even nested in a function."""
    found = impure_imports(source, Path("planted.py"))
    assert len(found) == 1 and f"imports {culprit}" in found[0]


def test_checker_accepts_pure_and_relative_imports() -> None:
    """Pure stdlib, cbor2, fifo and relative imports pass."""
    source = (
        "import hashlib\nfrom collections import deque\nimport cbor2\n"
        "from fifo import x\nfrom . import y\n"
    )
    assert impure_imports(source, Path("ok.py")) == []
