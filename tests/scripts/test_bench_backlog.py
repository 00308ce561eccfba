"""scripts/bench_backlog.py: its ratios to the RabbitMQ script's JSON, the snapshots it reads
from node.log and the memory it reads from /proc (pure functions only; no cluster)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_backlog.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_backlog_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _load()


def _rss(rss: float, peak: float) -> dict[str, dict[str, float]]:
    return {node: {"VmRSS": rss, "VmHWM": peak} for node in ("n1", "n2", "n3")}


def _peer() -> dict[str, Any]:
    """What ../shared/bench/rabbitmq/bench_backlog.py prints (its field names)."""
    return {
        "broker": "rabbitmq",
        "body": 1024,
        "published": 100,
        "slices": [
            {"backlog_after": 50, "msg_per_s": 1000.0, "load": 1.0, "rss_mib": _rss(200, 400)},
            {"backlog_after": 100, "msg_per_s": 800.0, "load": 1.0, "rss_mib": _rss(300, 500)},
        ],
        "drain": {"messages": 100, "msg_per_s": 2000.0},
        "rss_after_drain_mib": _rss(250, 500),
    }


def _ours() -> dict[str, Any]:
    return {
        "slices": [
            {"backlog_after": 50, "msg_per_s": 2000.0, "rss_mib": _rss(100, 100)},
            {"backlog_after": 100, "msg_per_s": 1900.0, "rss_mib": _rss(150, 125)},
        ],
        "drain": {"msg_per_s": 5000.0},
        "rss_after_drain_mib": _rss(50, 125),
    }


def test_the_ratios_are_ours_over_rabbitmqs_per_slice_drain_and_after_it(tmp_path: Path) -> None:
    path = tmp_path / "rmq.json"
    path.write_text(json.dumps(_peer()))
    ratios = bench.ratios(_ours(), bench.load_peer(path))
    assert ratios["slices"] == [
        {"backlog_after": 50, "publish_rate": 2.0, "peak_rss": 0.25, "rss": 0.5},
        {"backlog_after": 100, "publish_rate": 2.375, "peak_rss": 0.25, "rss": 0.5},
    ]
    assert (ratios["drain_rate"], ratios["rss_after_drain"]) == (2.5, 0.2)
    assert ratios["last_over_first_publish_rate"] == {"quorumq": 0.95, "rabbitmq": 0.8}


def test_a_file_that_is_not_the_rabbitmq_scripts_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"runs": []}))
    with pytest.raises(ValueError, match=r"not the JSON of bench/rabbitmq/bench_backlog\.py"):
        bench.load_peer(path)


def test_snapshots_are_counted_from_every_node_log_with_their_durations(tmp_path: Path) -> None:
    lines = [
        {"event": "snapshot_written", "index": 5000, "bytes": 10},
        {"event": "role_changed"},
        {"event": "snapshot_written", "index": 10000, "duration_ms": 12.5},
    ]
    (tmp_path / "node.log.1").write_text(json.dumps(lines[0]) + "\nnot json snapshot_written\n")
    (tmp_path / "node.log").write_text("".join(json.dumps(line) + "\n" for line in lines[1:]))
    found = bench.snapshots_written(tmp_path)
    assert sorted(found, key=str) == sorted([None, 12.5], key=str)
    seen: dict[str, int] = {}
    assert bench._new_snapshots({"n1": found}, seen) == {"n1": {"count": 2, "durations_ms": found}}
    assert bench._new_snapshots({"n1": found}, seen) == {"n1": {"count": 0, "durations_ms": []}}


def test_memory_and_disk_are_read_for_a_process_and_a_dir(tmp_path: Path) -> None:
    memory = bench.proc_memory_mib(os.getpid())
    assert set(memory) == {"VmRSS", "VmHWM"} and 0 < memory["VmRSS"] <= memory["VmHWM"]
    (tmp_path / "a").write_bytes(b"x" * 1024 * 1024)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"x" * 512 * 1024)
    assert bench.disk_mib(tmp_path) == 1.5
