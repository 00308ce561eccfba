"""`scripts/chaos.py --queue-disconnected-timeout-ms` (issue 24, acceptance 2): the queues of a
run (plain queues, or a groups run's partitions) are declared with that disconnected timeout, so
a paused or cut-off node's consumers lose their messages after it (1 s in the sweep) while the
node may still deliver them. Unit tests: no cluster runs (`run` and the client are stand-ins)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from cluster.chaos import group_workload
from cluster.chaos import run as chaos_run
from cluster.chaos.group_workload import GroupParams
from cluster.chaos.run import RunParams
from fifo.commands import QueueConfig

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "chaos.py"


@pytest.fixture(scope="module")
def chaos_script() -> ModuleType:
    """scripts/chaos.py loaded as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("chaos_script_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _params_of(chaos_script: ModuleType, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    """The RunParams the CLI builds from `args` (the run itself replaced by a valid report)."""
    seen: list[RunParams] = []

    def fake_run(params: RunParams) -> dict[str, Any]:
        seen.append(params)
        return {"valid": True}

    monkeypatch.setattr(chaos_script, "run", fake_run)
    result = CliRunner().invoke(chaos_script.main, ["--faults", "none", "--json", *args])
    assert result.exit_code == 0, result.output
    assert len(seen) == 1
    return seen[0]


def test_the_flag_reaches_the_run_parameters(
    chaos_script: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--queue-disconnected-timeout-ms 1000 sets it for the run; without it the machine's
    default is kept (None)."""
    out = ["--out", str(tmp_path / "out")]
    args = ["--workload", "queues", "--queue-disconnected-timeout-ms", "1000", *out]
    assert _params_of(chaos_script, monkeypatch, *args).queue_disconnected_timeout_ms == 1000
    assert _params_of(chaos_script, monkeypatch, *out).queue_disconnected_timeout_ms is None


def test_a_negative_timeout_is_a_usage_error(chaos_script: ModuleType) -> None:
    """A negative timeout is refused by the CLI (exit 2) before anything starts."""
    result = CliRunner().invoke(chaos_script.main, ["--queue-disconnected-timeout-ms", "-1"])
    assert result.exit_code == 2
    assert "--queue-disconnected-timeout-ms" in result.output


class _RecordingClient:
    """Stands in for the library client: records the queues declared and their config."""

    declared: dict[str, QueueConfig] = {}

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    def __enter__(self) -> _RecordingClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def declare_queue(self, queue: str, config: QueueConfig) -> None:
        self.declared[queue] = config


def _fake_cluster() -> Any:
    return SimpleNamespace(endpoints=lambda: {"n1": "127.0.0.1:1"}, key=b"k", tls=False)


def test_plain_queues_are_declared_with_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every queue of a queues run is declared with the 1 s disconnected timeout."""
    _RecordingClient.declared = {}
    monkeypatch.setattr(chaos_run, "Client", _RecordingClient)
    chaos_run._declare_queues(_fake_cluster(), ("chaos-1", "chaos-2"), None, 1000)
    assert _RecordingClient.declared == {
        "chaos-1": QueueConfig(disconnected_timeout_ms=1000),
        "chaos-2": QueueConfig(disconnected_timeout_ms=1000),
    }
    chaos_run._declare_queues(_fake_cluster(), ("chaos-1",), None)
    assert _RecordingClient.declared["chaos-1"] == QueueConfig()


def test_a_groups_run_declares_its_partitions_with_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A groups run hands the timeout to the partitioned queue's declaration (single active
    consumer kept)."""
    calls: list[tuple[GroupParams, int | None]] = []

    def fake_declare(
        _client: Any, params: GroupParams, disconnected_timeout_ms: int | None = None
    ) -> None:
        calls.append((params, disconnected_timeout_ms))

    monkeypatch.setattr(chaos_run, "Client", _RecordingClient)
    monkeypatch.setattr(group_workload, "declare", fake_declare)  # run.py calls it by module
    groups = GroupParams(partitions=2, members=2)
    chaos_run._declare_queues(_fake_cluster(), groups.partition_queues(), groups, 1000)
    assert calls == [(groups, 1000)]
