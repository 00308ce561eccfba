"""Machine v4 is a flat copy of v3: it imports no earlier version, defines each method once, is
released (the unreleased mechanism is tested with a test-only machine past it), and replays
v3's pinned corpus exactly (`v4_equivalence.py` says how it compares).
"""

from __future__ import annotations

import ast
import inspect
from functools import cache
from pathlib import Path

import pytest

import fifo
import tests.fifo.replay_corpus as rc
import tests.fifo.unreleased_machine as unreleased_machine
import tests.fifo.v4_equivalence as eq
from fifo.v4 import machine as v4_machine
from fifo.v4 import registry as v4_registry

V4_DIR = Path(__file__).resolve().parents[2] / "fifo" / "v4"
EARLIER = ("fifo.v1", "fifo.v2", "fifo.v3")


@cache
def v3_logs() -> list[rc.CorpusLog]:
    """v3's pinned corpus, decoded once."""
    return rc.decode_corpus(rc.corpus_path(3).read_bytes())[1]


def imports_of(path: Path) -> list[str]:
    """Every module a file imports, at any depth (`from fifo.v3 import x` gives fifo.v3.x too)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return names


def test_v4_imports_nothing_from_earlier_versions() -> None:
    """No module of fifo/v4 imports fifo.v1, fifo.v2 or fifo.v3 (v4 is a copy, not a subclass)."""
    files = sorted(V4_DIR.glob("*.py"))
    assert len(files) >= 10
    for path in files:
        bad = [name for name in imports_of(path) if name.startswith(EARLIER)]
        assert not bad, f"fifo/v4/{path.name} imports {bad}"


def test_the_import_check_sees_an_earlier_version() -> None:
    """The scan is not vacuous: v3's registry imports v2 by its name."""
    v3_registry = V4_DIR.parent / "v3" / "registry.py"
    assert any(name.startswith("fifo.v2") for name in imports_of(v3_registry))


def test_every_v4_method_is_defined_once() -> None:
    """Flat: no method of the v4 machine is defined in two of its classes (nothing overrides)."""
    for top in (v4_machine.QueueMachine, v4_registry.MachineV4):
        seen: dict[str, str] = {}
        for cls in inspect.getmro(top):
            if cls is object:
                continue
            assert cls.__module__.startswith("fifo.v4."), f"{top.__name__} extends {cls}"
            for name, value in vars(cls).items():
                if callable(value) or isinstance(value, staticmethod):
                    assert name not in seen, f"{name} defined in {cls.__name__} and {seen[name]}"
                    seen[name] = cls.__name__


def test_v4_is_released(monkeypatch: pytest.MonkeyPatch) -> None:
    """v4 is shipped (its corpus pinned), the latest released version, and what a node runs by
    default; `--max-machine-version 4` needs no flag."""
    from cluster.node.server import UNRELEASED_FLAG, supported_version

    monkeypatch.delenv(UNRELEASED_FLAG, raising=False)
    assert fifo.machine_for(4).version == 4
    assert fifo.init_state(4).version == 4
    assert 4 in rc.shipped() and rc.FIRST_SEED[4] == 4_000_000
    assert fifo.LATEST_VERSION == 4 == max(fifo.SUPPORTED_VERSIONS)
    assert 4 not in fifo.UNRELEASED_VERSIONS
    assert supported_version(None) == 4 and supported_version(4) == 4


def test_an_unreleased_version_is_selectable_but_a_node_runs_it_only_with_the_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mechanism kept for the next version (a test-only machine past v4): machine_for,
    init_state and convert select it; a node's default stays the latest released, and
    `--max-machine-version` names it only with the dev flag."""
    from cluster.errors import ConfigError
    from cluster.node.server import UNRELEASED_FLAG, supported_version

    monkeypatch.delenv(UNRELEASED_FLAG, raising=False)
    version = unreleased_machine.register(monkeypatch)
    assert version not in fifo.SUPPORTED_VERSIONS and (version,) == fifo.UNRELEASED_VERSIONS
    assert fifo.machine_for(version).version == version
    assert fifo.init_state(version).version == version
    state = fifo.init_state(fifo.LATEST_VERSION)
    assert fifo.convert(state, fifo.LATEST_VERSION, version, fifo.Meta(1, 1, 0, version)).version \
        == version  # fmt: skip
    assert supported_version(None) == fifo.LATEST_VERSION
    with pytest.raises(ConfigError, match=UNRELEASED_FLAG):
        supported_version(version)
    monkeypatch.setenv(UNRELEASED_FLAG, "1")
    assert supported_version(version) == version
    assert supported_version(None) == fifo.LATEST_VERSION
    with pytest.raises(ConfigError):
        supported_version(version + 1)


def test_v3_corpus_replays_equal_through_v4() -> None:
    """Every log of v3's pinned corpus gives, through v4 (converted at the start), the same
    replies and effects at every entry, and the same state, timers and next deadline at every
    checkpoint."""
    logs = v3_logs()
    assert len(logs) >= rc.SEEDS_PER_VERSION
    for log in logs:
        found = eq.first_divergence(log)
        assert found is None, f"v4 diverges from v3: {found}"


def test_a_divergence_names_seed_entry_and_what(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison is not vacuous: v4 made to return messages as failed deliveries differs,
    and the report names the seed, the first entry and what differs."""
    queues = fifo.machine_for(4).queues  # type: ignore[attr-defined]
    original = queues.return_msgs

    def failed(
        ctx: object,
        queue: object,
        consumer: object,
        ids: object,
        delivery_failed: bool,
        annotations: object = (),
    ) -> int:
        return int(original(ctx, queue, consumer, ids, True, annotations))

    monkeypatch.setattr(queues, "return_msgs", failed)
    found = next(filter(None, (eq.first_divergence(log) for log in v3_logs()[:20])), None)
    assert found is not None
    assert found.seed >= rc.FIRST_SEED[3] and found.entry_index >= 1
    assert f"seed {found.seed}: entry {found.entry_index} differs in" in str(found)


def test_a_v4_state_compares_by_v3_digest() -> None:
    """convert_v3_to_v4 only changes the version: v3's digest of the copy is the original's."""
    state = fifo.init_state(3)
    for entry in v3_logs()[0].entries[:120]:
        fifo.apply(entry[0], entry[1], state)
    converted = fifo.convert(state, 3, 4, fifo.Meta(1000, 1, 0, 4))
    assert converted.version == 4
    assert eq.digest_as_v3(converted) == fifo.digest(state)
