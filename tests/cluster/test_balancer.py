"""The leaderless balancer on a real 3-node cluster, driven through `quorumq consume --balance`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from cluster.balance.decision import app_of
from cluster.client import Client, LeaderlessBalancer
from cluster.launcher import LocalCluster, wait_until
from fifo.commands import QueueConfig

pytestmark = pytest.mark.cluster

GROUP = "orders"
QUEUES = [f"o{i}" for i in range(1, 7)]
ALONE_QUEUES = [f"alone{i}" for i in range(1, 4)]  # not the first test's: the cluster is reused
ROOT = Path(__file__).resolve().parents[2]
BALANCE_WITHIN_S = 60.0  # generous: 2 shared cores; the balancer needs a few 0.3 s polls


def active_per_app(client: Client) -> Counter[str]:
    """Active queues per app id, as the machine says (queues with nobody active count as '-')."""
    result = client.consumers()
    counts: Counter[str] = Counter()
    for q in QUEUES:
        holder = "-"
        for row in result.get(q) or []:
            app = app_of(GROUP, row.tag)
            if app is not None and row.active and row.status != "cancelled":
                holder = app
        counts[holder] += 1
    return counts


def consumer(data_dir: Path) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "cluster.cli", "--data-dir", str(data_dir), "-o", "jsonl"]
    args += ["consume", "--balance", GROUP, "--balance-poll", "0.3", *QUEUES]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def test_three_cli_consumers_end_2_2_2_and_3_3_after_one_is_killed(
    reused_cluster3: LocalCluster,
) -> None:
    """6 SAC queues, 3 `consume --balance` processes: 2/2/2; kill -9 one: the other two 3/3."""
    with Client.from_data_dir(reused_cluster3.data_dir) as client:
        for q in QUEUES:
            client.declare_queue(q, QueueConfig(single_active_consumer=True))
        procs = [consumer(reused_cluster3.data_dir) for _ in range(3)]
        try:

            def shape() -> list[int]:
                counts = active_per_app(client)
                return sorted(n for app, n in counts.items() if app != "-")

            wait_until(lambda: shape() == [2, 2, 2], BALANCE_WITHIN_S, "2/2/2")
            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait(10)
            wait_until(lambda: shape() == [3, 3], BALANCE_WITHIN_S, "3/3 after the kill")
            assert len(active_per_app(client)) == 2
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
            for proc in procs:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()


def test_an_app_alone_is_active_on_every_queue_and_releases_nothing(
    reused_cluster3: LocalCluster,
) -> None:
    """One balancer over 3 queues holds all three: its ideal is 3, it never releases."""
    with Client.from_data_dir(reused_cluster3.data_dir) as client:
        for q in ALONE_QUEUES:
            client.declare_queue(q, QueueConfig(single_active_consumer=True))
        with LeaderlessBalancer(client, GROUP, ALONE_QUEUES, poll_s=0.2) as balancer:
            balancer.start()
            wait_until(lambda: len(balancer.active_queues()) == 3, 20, "all active")
            assert balancer.step() is None
            assert balancer.releases == 0
            view = balancer.view()
            assert view.apps == (balancer.app_id,)


def test_bad_names_are_refused_before_anything_is_sent(reused_cluster3: LocalCluster) -> None:
    """A group containing the tag separator, or no queues at all, is a ValueError."""
    with Client.from_data_dir(reused_cluster3.data_dir) as client:
        with pytest.raises(ValueError):
            LeaderlessBalancer(client, "a/b", QUEUES)
        with pytest.raises(ValueError):
            LeaderlessBalancer(client, GROUP, [])
