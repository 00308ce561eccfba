"""End to end through the `quorumq` console script: the acceptance flow of issue 3, auth, demo."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

QUORUMQ = [sys.executable, "-m", "cluster.cli"]


def quorumq(
    *args: str, check: bool = True, timeout_s: float = 120.0
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*QUORUMQ, *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"quorumq {' '.join(args)} exited {result.returncode}: {result.stderr}"
        )
    return result


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "D"
    yield path
    if (path / "cluster.toml").exists():
        quorumq("cluster", "stop", "--data-dir", str(path), "--grace", "2", check=False)


def status(data_dir: Path) -> list[dict[str, object]]:
    rows = json.loads(
        quorumq("cluster", "status", "--data-dir", str(data_dir), "-o", "json").stdout
    )
    assert isinstance(rows, list)
    return rows


def test_acceptance_flow_kill_the_leader_consume_everything_restart_equal_digests(
    data_dir: Path,
) -> None:
    d = str(data_dir)
    quorumq("cluster", "start", "--nodes", "3", "--data-dir", d)
    quorumq("--data-dir", d, "queue", "declare", "q1")
    out = quorumq("--data-dir", d, "publish", "q1", "--count", "2000").stdout
    assert "confirmed 2000 messages" in out
    (leader,) = [row for row in status(data_dir) if row["role"] == "leader"]
    assert isinstance(leader["pid"], int)
    os.kill(leader["pid"], signal.SIGKILL)
    out = quorumq("--data-dir", d, "publish", "q1", "--count", "500").stdout
    assert "confirmed 500 messages" in out
    lines = quorumq("--data-dir", d, "consume", "q1", "--count", "2500", "-o", "jsonl").stdout
    messages = [json.loads(line) for line in lines.splitlines()]
    assert len(messages) == 2500
    assert len({m["body"] for m in messages}) == 2500
    assert len({m["msg_id"] for m in messages}) == 2500
    rows = status(data_dir)
    assert [r["role"] for r in rows if r["id"] == leader["id"]] == ["down"]
    quorumq("--data-dir", d, "node", "restart", str(leader["id"]))
    deadline = time.monotonic() + 30
    while True:
        rows = status(data_dir)
        applied = {r.get("last_applied") for r in rows}
        if all(r["role"] != "down" for r in rows) and len(applied) == 1:
            break
        assert time.monotonic() < deadline, f"nodes did not converge: {rows}"
        time.sleep(0.2)
    assert len({r["digest"] for r in rows}) == 1, rows


def test_wrong_credentials_exit_77_with_a_clear_message(data_dir: Path, tmp_path: Path) -> None:
    d = str(data_dir)
    quorumq("cluster", "start", "--nodes", "1", "--data-dir", d)
    endpoint = json.loads(quorumq("-o", "json", "cluster", "status", "--data-dir", d).stdout)[0][
        "address"
    ]
    wrong = tmp_path / "wrong.key"
    wrong.write_text("00" * 32)
    result = quorumq(
        "--endpoints", str(endpoint), "--credentials", str(wrong), "queue", "list", check=False
    )
    assert result.returncode == 77
    assert "authentication failed" in result.stderr
    right = quorumq(
        "--endpoints", str(endpoint), "--credentials", f"{d}/client.key", "queue", "list"
    )
    assert right.returncode == 0
    unknown = quorumq("--data-dir", d, "queue", "purge", "nope", check=False)
    assert unknown.returncode == 65
    assert "unknown_queue" in unknown.stderr


def test_cluster_start_refuses_a_running_cluster_and_restarts_a_stopped_one(data_dir: Path) -> None:
    d = str(data_dir)
    quorumq("cluster", "start", "--nodes", "1", "--data-dir", d)
    again = quorumq("cluster", "start", "--data-dir", d, check=False)
    assert again.returncode == 64
    assert "running cluster" in again.stderr
    quorumq("--data-dir", d, "queue", "declare", "kept")
    quorumq("--data-dir", d, "publish", "kept", "--count", "10")
    quorumq("cluster", "stop", "--data-dir", d)
    assert all(
        r["role"] == "down"
        for r in json.loads(
            quorumq("-o", "json", "cluster", "status", "--data-dir", d, check=False).stdout
        )
    )
    quorumq("cluster", "start", "--data-dir", d)
    info = json.loads(quorumq("-o", "json", "--data-dir", d, "queue", "info", "kept").stdout)
    assert info["total"] == 10, "a restarted cluster keeps its confirmed messages"


def test_demo_tells_its_story_and_exits_0(tmp_path: Path) -> None:
    result = quorumq("demo", "--data-dir", str(tmp_path / "demo"))
    for step in ("[1/6]", "[2/6]", "[3/6]", "[4/6]", "[5/6]", "[6/6]"):
        assert step in result.stdout
    assert "1000 distinct messages consumed" in result.stdout
    assert "demo finished" in result.stdout
