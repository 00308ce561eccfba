"""The shape of `cluster.client`: a pure sans-IO core, no import cycle, no `Any` in its API."""

from __future__ import annotations

import ast
import inspect
import re
import typing
from pathlib import Path

import cluster.client

PACKAGE = Path(cluster.client.__file__).parent
SANS_IO = ("sansio.py", "_state.py", "_wire.py", "results.py", "_requests.py")
IO_MODULES = {"socket", "threading", "asyncio", "time", "selectors", "ssl", "select"}


def imports(path: Path) -> set[str]:
    """Every module a file imports (absolute names)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_the_sans_io_core_imports_no_socket_thread_clock_or_event_loop() -> None:
    for name in SANS_IO:
        used = {module.split(".")[0] for module in imports(PACKAGE / name)}
        assert not used & IO_MODULES, f"{name} imports {sorted(used & IO_MODULES)}"


def test_the_client_modules_import_each_other_without_a_cycle() -> None:
    graph = {
        f"cluster.client.{path.stem}": {
            module for module in imports(path) if module.startswith("cluster.client.")
        }
        for path in PACKAGE.glob("*.py")
        if path.stem != "__init__"
    }

    def visit(module: str, trail: tuple[str, ...]) -> None:
        assert module not in trail, f"import cycle: {' -> '.join((*trail, module))}"
        for imported in graph.get(module, ()):
            visit(imported, (*trail, module))

    for module in graph:
        visit(module, ())


def mentions_any(function: object) -> bool:
    """True if a resolved annotation of `function` (aliases expanded) contains typing.Any."""
    if not callable(function) or not hasattr(function, "__annotations__"):
        return False
    hints = typing.get_type_hints(function)
    return any(re.search(r"\bAny\b", repr(hint)) for hint in hints.values())


LeakyFrame = dict[str, typing.Any]


def _leaky(frame: LeakyFrame) -> None: ...


def _clean(frame: dict[str, object]) -> None: ...


def test_the_any_check_sees_through_aliases() -> None:
    assert mentions_any(_leaky) and not mentions_any(_clean)


def test_no_public_signature_of_the_client_mentions_any() -> None:
    offenders: list[str] = []
    for name in cluster.client.__all__:
        exported = getattr(cluster.client, name)
        members = [(name, exported)]
        if inspect.isclass(exported):
            members += [
                (f"{name}.{attr}", value)
                for attr, value in vars(exported).items()
                if not attr.startswith("_") or attr in ("__init__", "__aenter__", "__enter__")
            ]
        for label, member in members:
            if mentions_any(member.fget if isinstance(member, property) else member):
                offenders.append(label)
    assert not offenders, f"Any in public signatures: {offenders}"


def foreign_privates(source: str) -> list[str]:
    """`obj._name` uses in a source where `obj` is not `self` / `cls` (dunders aside)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__") or (
            isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        ):
            continue
        found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_private_check_catches_a_reach_into_another_object() -> None:
    source = "def f(self, c):\n    self._x = c._core\n    return self.client._lock\n"
    assert foreign_privates(source) == ["2: c._core", "3: self.client._lock"]


def test_no_client_module_touches_another_objects_private_names() -> None:
    """Handles use the shells' public port (`core`, `flush`, `request`, ...), never privates."""
    offenders = [
        f"{path.name}:{use}"
        for path in sorted(PACKAGE.glob("*.py"))
        for use in foreign_privates(path.read_text())
    ]
    assert not offenders, "\n".join(offenders)
