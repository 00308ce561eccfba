"""Message groups through the `quorumq` CLI on a 3-node cluster (issue 9, acceptance 1).

A sequenced queue, 1,000 messages over 50 groups published with `--group`, three consumer
processes with `--timestamps`: from their JSON lines alone, every group is consumed in publish
order, a group passes from one consumer to another only after the first one settled its last
message of it (never two holders), and all three consumers take part.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest

import fifo

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

QUORUMQ = [sys.executable, "-m", "cluster.cli"]
MESSAGES, GROUPS, CONSUMERS = 1000, 50, 3


def quorumq(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([*QUORUMQ, *args], capture_output=True, text=True, timeout=180,
                            check=False)  # fmt: skip
    if check and result.returncode != 0:
        raise AssertionError(f"quorumq {' '.join(args)} exited {result.returncode}: "
                             f"{result.stdout}{result.stderr}")  # fmt: skip
    return result


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One cluster for the module's two tests (they kill no node and use their own queues)."""
    path = tmp_path_factory.mktemp("groups-cli") / "D"
    quorumq("cluster", "start", "--nodes", "3", "--data-dir", str(path))
    try:
        # a new cluster starts on v1 and switches once every node said hello: groups need v3
        deadline = time.monotonic() + 60
        while json.loads(quorumq("--data-dir", str(path), "-o", "json", "machine", "status")
                         .stdout)["effective_version"] != fifo.LATEST_VERSION:  # fmt: skip
            assert time.monotonic() < deadline, "the cluster did not switch to v3"
            time.sleep(0.2)
        yield str(path)
    finally:
        quorumq("cluster", "stop", "--data-dir", str(path), "--grace", "2", check=False)


def number(row: dict[str, Any]) -> int:
    """The message number `publish` wrote into a generated body (`<run>-<n> xxx...`)."""
    return int(str(row["body"]).split(" ")[0].rsplit("-", 1)[1])


def test_sequenced_groups_via_cli_keep_order_and_one_holder(data_dir: str) -> None:
    d = data_dir
    quorumq("--data-dir", d, "queue", "declare", "orders", "--group-policy", "sequenced")
    consumers = [
        subprocess.Popen(
            [*QUORUMQ, "--data-dir", d, "-o", "jsonl", "consume", "orders", "--prefetch", "5",
             "--timestamps", "--timeout", "8"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(CONSUMERS)
    ]
    try:
        out = quorumq("--data-dir", d, "-o", "json", "publish", "orders", "--count",
                      str(MESSAGES), "--group", "g", "--spread-groups", str(GROUPS))  # fmt: skip
        assert json.loads(out.stdout)["confirmed"] == MESSAGES
        outputs = [proc.communicate(timeout=180) for proc in consumers]
    finally:
        for proc in consumers:
            if proc.poll() is None:
                proc.kill()
    rows_by_consumer = []
    for index, (stdout, stderr) in enumerate(outputs):
        assert consumers[index].returncode == 0, stderr
        rows_by_consumer.append([json.loads(line) for line in stdout.splitlines() if line])

    # all three take part, nothing lost, nothing delivered twice
    assert all(rows for rows in rows_by_consumer), [len(r) for r in rows_by_consumer]
    every = [(c, row) for c, rows in enumerate(rows_by_consumer) for row in rows]
    assert sorted(number(row) for _, row in every) == list(range(MESSAGES))
    assert not any(row["redelivered"] for _, row in every)

    per_group: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for consumer, row in every:
        assert row["group"] == f"g{number(row) % GROUPS}"  # the group travelled with it
        per_group[row["group"]].append((consumer, row))
    assert len(per_group) == GROUPS
    handoffs = 0
    for group, taken in per_group.items():
        taken.sort(key=lambda item: item[1]["received_ns"])
        numbers = [number(row) for _, row in taken]
        assert numbers == sorted(numbers), f"{group} consumed out of publish order: {numbers}"
        for (before, first), (after, second) in pairwise(taken):
            if before != after:
                handoffs += 1
                # the next holder got it only after the previous one began settling its last
                assert first["settling_ns"] < second["received_ns"], (
                    f"{group}: consumer {after} got #{number(second)} while consumer {before} "
                    f"still held #{number(first)}")  # fmt: skip
    assert handoffs > 0  # groups did move between consumers, so the check above had work


def test_groups_listing_and_purge_by_group_via_cli(data_dir: str) -> None:
    d = data_dir
    quorumq("--data-dir", d, "queue", "declare", "jobs", "--group-policy", "exclusive",
            "--group-key", "x-group-id", "--rebalance-groups-on-join")  # fmt: skip
    quorumq("--data-dir", d, "publish", "jobs", "--count", "6", "--group", "a")
    quorumq("--data-dir", d, "publish", "jobs", "--count", "4", "--group", "b")
    quorumq("--data-dir", d, "publish", "jobs", "--count", "1")  # the default group
    rows = json.loads(quorumq("--data-dir", d, "-o", "json", "queue", "groups", "jobs").stdout)
    assert [(r["group"], r["ready"], r["checked_out"], r["owner"]) for r in rows] == [
        ("a", 6, 0, None), ("b", 4, 0, None), (None, 1, 0, None)]  # fmt: skip
    assert all(isinstance(r["oldest_age_ms"], int) for r in rows)
    table = quorumq("--data-dir", d, "queue", "groups", "jobs").stdout
    assert table.splitlines()[0].split() == ["GROUP", "READY", "CHECKED_OUT", "OWNER",
                                             "OLDEST_AGE_MS"]  # fmt: skip
    out = json.loads(quorumq("--data-dir", d, "-o", "json", "queue", "purge", "jobs",
                             "--group", "a").stdout)  # fmt: skip
    assert out == {"queue": "jobs", "purged": 6, "group": "a"}
    out = json.loads(quorumq("--data-dir", d, "-o", "json", "queue", "purge", "jobs",
                             "--default-group").stdout)  # fmt: skip
    assert out["purged"] == 1
    rows = json.loads(quorumq("--data-dir", d, "-o", "json", "queue", "groups", "jobs").stdout)
    assert [(r["group"], r["ready"]) for r in rows] == [("b", 4)]
    refused = quorumq("--data-dir", d, "queue", "declare", "bad", "--group-policy", "sequenced",
                      "--rebalance-groups-on-join", check=False)  # fmt: skip
    assert refused.returncode == 64 and "needs --group-policy exclusive" in refused.stderr
