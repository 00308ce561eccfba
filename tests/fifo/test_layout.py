"""The layout that keeps versions frozen: no version imports a later one, none asks its version."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import fifo

FIFO_DIR = Path(__file__).resolve().parents[2] / "fifo"
VERSION_PACKAGE = re.compile(r"^fifo\.v(\d+)(\.|$)")
# modules that map version numbers to code; every other module outside fifo/vN is version-neutral
VERSION_TABLES = {"__init__.py", "versions.py", "timers.py"}


def imported_modules(path: Path) -> list[str]:
    """Absolute module names a file imports (`from fifo.v2 import timers` counts as fifo.v2)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.append(node.module)
    return names


def imported_versions(path: Path) -> set[int]:
    """The machine versions whose packages a file imports."""
    found = (VERSION_PACKAGE.match(name) for name in imported_modules(path))
    return {int(m.group(1)) for m in found if m}


def version_dirs() -> list[Path]:
    return sorted(FIFO_DIR.glob("v[0-9]*"), key=lambda p: int(p.name[1:]))


def test_every_version_has_a_package() -> None:
    """fifo/vN exists for each version, released or not (so the scans below are not vacuous)."""
    assert [int(p.name[1:]) for p in version_dirs()] == sorted(fifo.MACHINES)
    assert sorted(fifo.MACHINES) == sorted((*fifo.SUPPORTED_VERSIONS, *fifo.UNRELEASED_VERSIONS))


@pytest.mark.parametrize("package", version_dirs(), ids=lambda p: p.name)
def test_no_version_imports_a_later_one(package: Path) -> None:
    """A frozen version may build on earlier ones, never on a later one."""
    version = int(package.name[1:])
    for path in sorted(package.glob("*.py")):
        later = sorted(v for v in imported_versions(path) if v > version)
        assert not later, f"{path.relative_to(FIFO_DIR)} imports later versions {later}"


def test_shared_modules_import_no_version() -> None:
    """Version-neutral modules (codec, state, shared helpers, ...) depend on no version."""
    for path in sorted(FIFO_DIR.glob("*.py")):
        if path.name in VERSION_TABLES:
            continue
        assert not imported_versions(path), f"fifo/{path.name} imports a machine version"


@pytest.mark.parametrize("package", version_dirs(), ids=lambda p: p.name)
def test_no_version_asks_which_version_it_is(package: Path) -> None:
    """No `version >=` / `version <` tests inside a version: behaviour differs by module."""
    pattern = re.compile(r"version\s*(>=|<=|>|<)")
    for path in sorted(package.glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not pattern.search(line), f"{path.relative_to(FIFO_DIR)}:{number}: {line}"


def test_import_scan_sees_a_later_import() -> None:
    """The scanner is not vacuous: it reports `fifo.v2` imported from a file."""
    sample = FIFO_DIR / "v1" / "timers.py"
    assert imported_versions(sample) == set()
    assert 1 in imported_versions(FIFO_DIR / "v2" / "timers.py")
