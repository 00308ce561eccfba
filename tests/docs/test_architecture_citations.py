"""docs/architecture.md cites only what exists: every `path:name`, every path and every dotted
`package.module.Name` it names is found in the code (a renamed or removed name fails here)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
CODE = re.compile(r"`([^`\s()]+)`")
PATH_NAME = re.compile(r"^([\w./-]+\.py):([\w.]+)$")
PATH = re.compile(r"^(?:[\w-]+/)+[\w.-]*$")
DOTTED = re.compile(r"^(?:cluster|raft|fifo|pipeline)(?:\.\w+)+$")


def defined(tree: ast.Module, dotted: str) -> bool:
    """Whether `dotted` (a name, or Class.member) is defined in a module's syntax tree."""
    body: list[ast.stmt] = tree.body
    for part in dotted.split("."):
        found: ast.stmt | None = None
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if node.name == part:
                    found = node
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == part for t in targets):
                    found = node
        if found is None:
            return False
        body = found.body if isinstance(found, ast.ClassDef) else []
    return True


def missing(citation: str) -> str | None:
    """Why a cited `path:name`, path or dotted name does not exist, or None."""
    if match := PATH_NAME.match(citation):
        path, name = ROOT / match.group(1), match.group(2)
        if not path.is_file():
            return f"{match.group(1)} does not exist"
        if not defined(ast.parse(path.read_text()), name):
            return f"{match.group(1)} defines no {name}"
        return None
    if PATH.match(citation):  # `vN` stands for any version
        return None if any(ROOT.glob(citation.replace("vN", "v[0-9]*"))) else \
            f"{citation} does not exist"  # fmt: skip
    if DOTTED.match(citation):
        parts = citation.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                module = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            target: object = module
            for attribute in parts[cut:]:
                if not hasattr(target, attribute):
                    return f"{citation}: {'.'.join(parts[:cut])} has no {attribute}"
                target = getattr(target, attribute)
            return None
        return f"{citation}: no such module"
    return None  # not a citation (a command, a value, a class named in prose)


def citations(text: str) -> list[str]:
    """The backticked tokens of a page that look like code citations."""
    return [t for t in CODE.findall(text) if PATH_NAME.match(t) or PATH.match(t) or DOTTED.match(t)]


def test_every_citation_of_the_architecture_page_exists() -> None:
    """Every `path:name`, path and dotted name docs/architecture.md cites exists."""
    found = citations(DOC.read_text())
    assert sum(1 for t in found if PATH_NAME.match(t)) >= 15  # the publish path is cited so
    problems = [f"{t}: {why}" for t in found if (why := missing(t)) is not None]
    assert not problems, "\n".join(problems)


def test_a_stale_citation_is_reported() -> None:
    """The check is not vacuous: the name the page used to cite, and others, are caught."""
    assert missing("raft/metadata.py:_track") == "raft/metadata.py defines no _track"
    assert missing("raft/metadata.py:apply_metadata") is None
    assert missing("raft/node.py:RaftNode._apply_locked") is None
    assert missing("raft/node.py:RaftNode._nope") is not None
    assert missing("fifo/v9/registry.py") is not None
    assert missing("raft.replica.Nope") is not None
    assert missing("cluster.launcher.LocalCluster") is None
