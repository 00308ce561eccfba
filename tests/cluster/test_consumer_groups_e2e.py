"""Issue 10, acceptance 1, with the `quorumq` CLI and member processes on a 3-node cluster: a
queue with 8 partitions, three members (3/3/2), one member killed: 4/4 within the detection time,
exactly the dead member's 3 partitions moved, and per-partition order kept in the members' output.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.client import Client

pytestmark = pytest.mark.cluster

QUORUMQ = [sys.executable, "-m", "cluster.cli"]
PARTITIONS = 8
PER_PARTITION = 40

MEMBER = """
import json, sys, time
from pathlib import Path
from cluster.client import Client
from cluster.client.groups import join_group
data_dir, name = Path(sys.argv[1]), sys.argv[2]
def note(kind, partitions):
    print(json.dumps({"t": time.monotonic_ns(), "member": name, "event": kind,
                      "partitions": partitions}), flush=True)
with Client.from_data_dir(data_dir, name=name) as client:
    member = join_group(client, "billing", "orders", member=name, prefetch=5,
                        on_assign=lambda p: note("assigned", p),
                        on_revoke=lambda p: note("revoked", p))
    for message in member:
        print(json.dumps({"t": time.monotonic_ns(), "member": name, "event": "message",
                          "partition": message.queue, "body": message.body.decode(),
                          "redelivered": message.redelivered}), flush=True)
        time.sleep(0.005)
        message.ack()
"""


def quorumq(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([*QUORUMQ, *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"quorumq {' '.join(args)} exited {result.returncode}: "
                             f"{result.stderr}")  # fmt: skip
    return result


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "D"
    yield path
    if (path / "cluster.toml").exists():
        quorumq("cluster", "stop", "--data-dir", str(path), "--grace", "2", check=False)


def describe(data_dir: Path) -> dict[str, Any]:
    out = quorumq("--data-dir", str(data_dir), "-o", "json", "group", "describe", "billing",
                  check=False)  # fmt: skip
    if out.returncode != 0:
        return {"members": [], "pending": 1}
    found: dict[str, Any] = json.loads(out.stdout)
    return found


def counts(found: dict[str, Any]) -> dict[str, int]:
    return {m["member"]: len(m["partitions"]) for m in found["members"]}


def wait_for(
    data_dir: Path, ok: Callable[[dict[str, Any]], bool], timeout_s: float = 30.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = describe(data_dir)
        if ok(found) and not found["pending"]:
            return found
        assert time.monotonic() < deadline, found
        time.sleep(0.1)


def publish(data_dir: Path, start: int) -> None:
    """PER_PARTITION numbered messages into every partition, `index:n` bodies."""
    with Client.from_data_dir(data_dir, name="publisher") as client:
        for index in range(PARTITIONS):
            with client.publisher(f"orders.{index}", window=50) as publisher:
                for n in range(start, start + PER_PARTITION):
                    publisher.publish(f"{index}:{n}".encode())
                publisher.wait_for_confirms(30.0)


def delivered(outputs: dict[str, Path]) -> list[dict[str, Any]]:
    rows = []
    for path in outputs.values():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row["event"] == "message":
                rows.append(row)
    return rows


@pytest.mark.timeout(240)
def test_eight_partitions_three_members_kill_one_gives_four_four_with_three_moves_in_order(
    data_dir: Path, tmp_path: Path
) -> None:
    """3/3/2 in join order; SIGKILL a member with 3: 4/4, 3 partitions reassigned, none taken
    from a survivor; every message consumed, first deliveries of each partition in order."""
    d = str(data_dir)
    quorumq("cluster", "start", "--nodes", "3", "--data-dir", d)
    deadline = time.monotonic() + 30  # a new cluster upgrades to the latest machine by itself
    while json.loads(quorumq("--data-dir", d, "-o", "json", "machine", "status").stdout)[
        "effective_version"
    ] < 3:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    quorumq("--data-dir", d, "queue", "declare", "orders", "--partitions", str(PARTITIONS))
    members: dict[str, subprocess.Popen[str]] = {}
    outputs: dict[str, Path] = {}
    try:
        for name in ("alpha", "beta", "gamma"):
            outputs[name] = tmp_path / f"{name}.jsonl"
            with outputs[name].open("w") as out:
                members[name] = subprocess.Popen(
                    [sys.executable, "-c", MEMBER, d, name], stdout=out, text=True
                )
            wait_for(data_dir, lambda found, n=name: n in counts(found))  # type: ignore[misc]
        found = wait_for(data_dir, lambda found: len(counts(found)) == 3)
        assert list(counts(found).items()) == [("alpha", 3), ("beta", 3), ("gamma", 2)]
        listed = json.loads(quorumq("--data-dir", d, "-o", "json", "group", "list").stdout)
        assert [(g["group"], g["queue"], g["partitions"], g["members"]) for g in listed] == [
            ("billing", "orders", PARTITIONS, 3)
        ]
        table = quorumq("--data-dir", d, "group", "describe", "billing").stdout
        assert "alpha" in table and "orders.7" in table
        publish(data_dir, 0)
        victim = next(name for name, count in counts(found).items() if count == 3)
        time.sleep(0.5)  # the victim holds some messages when it dies
        os.kill(members[victim].pid, signal.SIGKILL)
        killed_at = time.monotonic()
        found = wait_for(data_dir, lambda found: victim not in counts(found), timeout_s=20.0)
        detection_s = time.monotonic() - killed_at
        assert sorted(counts(found).values()) == [4, 4], found
        assert found["last_reassigned"] == 3, found
        assert found["last_moves"] == 0, found  # no partition taken from a survivor
        publish(data_dir, PER_PARTITION)
        deadline = time.monotonic() + 60
        while len({(r["partition"], r["body"]) for r in delivered(outputs)}) < (
            2 * PER_PARTITION * PARTITIONS
        ):
            assert time.monotonic() < deadline, len(delivered(outputs))
            time.sleep(0.3)
    finally:
        for process in members.values():
            process.kill()
            process.wait()
    rows = sorted(delivered(outputs), key=lambda row: row["t"])
    firsts: dict[str, list[int]] = {}
    for row in rows:
        n = int(row["body"].split(":")[1])
        seen = firsts.setdefault(row["partition"], [])
        if n not in seen:
            seen.append(n)
    for partition, seen in firsts.items():
        assert seen == list(range(2 * PER_PARTITION)), (partition, seen)
    print(f"member {victim} killed; 4/4 again after {detection_s:.2f} s")
