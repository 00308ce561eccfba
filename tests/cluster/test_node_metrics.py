"""Prometheus metrics: a 3-node cluster with `metrics_port`s, a known workload through one node,
then `/metrics` scraped over HTTP and parsed with prometheus-client's parser."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")

import functools

from prometheus_client.parser import text_string_to_metric_families

from cluster import config
from cluster.client import Client
from cluster.launcher import LocalCluster, free_ports, init_cluster, start_cluster, wait_until
from fifo.commands import QueueConfig
from tests.cluster.client_cluster import on_latest_machine

ROOT = Path(__file__).resolve().parents[2]  # the checkout

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def metered(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalCluster, dict[str, int]]]:
    """A 3-node cluster whose nodes serve metrics (shared: tests use their own queues)."""
    data_dir = tmp_path_factory.mktemp("metered") / "D"
    cfg = init_cluster(data_dir, 3)
    ports = dict(zip(cfg.node_ids(), free_ports(3), strict=True))
    nodes = tuple(dataclasses.replace(n, metrics_port=ports[n.id]) for n in cfg.nodes)
    cfg = dataclasses.replace(cfg, nodes=nodes)
    config.write(data_dir, cfg)
    assert config.load(data_dir).node("n2").metrics_port == ports["n2"]
    # start_cluster reuses the written cluster.toml and waits until every node answers and
    # one leader serves reads (started bare, a client could give up before a loaded host's
    # nodes listened: "no quorumq node reachable" in the fixture)
    cluster = start_cluster(data_dir, 3)
    try:
        # the workload's counts are exact only after the first upgrade: a settle that overlaps
        # it is answered `unavailable` (outcome unknown) and resent
        yield on_latest_machine(cluster), ports
    finally:
        cluster.stop()


def scrape(port: int) -> Samples:
    """Every sample of http://127.0.0.1:PORT/metrics, by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain")
        text = answer.read().decode("utf-8")
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_match_a_known_workload(metered: tuple[LocalCluster, dict[str, int]]) -> None:
    cluster, ports = metered
    node = "n2"  # every client command of the workload goes through this node
    address = cluster.config.node(node).client_address
    with Client([address], cluster.key, prefer_leader=False) as client:
        client.declare_queue("m-dead")
        client.declare_queue("m-jobs", QueueConfig(dead_letter_queue="m-dead"))
        with client.publisher("m-jobs", window=50) as publisher:
            publisher.publish_many(b"job %d" % i for i in range(100))
        consumer = client.consume("m-jobs", prefetch=10)
        first_seen: set[int] = set()
        settled = 0
        while settled < 100:
            message = consumer.get(timeout_s=10)
            assert message is not None
            number = int(message.body.split()[1])
            if number % 10 == 1 and number not in first_seen:
                first_seen.add(number)
                message.nack(requeue=True)  # 10 returns, each delivered once more
                continue
            if number % 5 == 2:
                message.reject()  # 20 dead-lettered into m-dead
            else:
                message.ack()  # 80 acks
            settled += 1
        assert consumer.wait_settled(10)
        consumer.cancel()
        client.publish("m-jobs", b"left")  # one ready message stays
        client.declare_queue("m-held")
        with client.publisher("m-held") as publisher:
            publisher.publish_many([b"a", b"b", b"c"])
        held = client.consume("m-held", prefetch=3)
        wait_until(lambda: held.delivered == 3, 10, "3 deliveries held")

        samples = scrape(ports[node])
        assert value(samples, "quorumq_queue_messages_published_total", queue="m-jobs") == 101
        assert value(samples, "quorumq_queue_messages_delivered_total", queue="m-jobs") == 110
        assert value(samples, "quorumq_queue_messages_acked_total", queue="m-jobs") == 80
        assert value(samples, "quorumq_queue_messages_returned_total", queue="m-jobs") == 10
        assert value(samples, "quorumq_queue_messages_rejected_total", queue="m-jobs") == 20
        assert value(samples, "quorumq_queue_messages_delivered_total", queue="m-held") == 3
        assert value(samples, "quorumq_client_connections") >= 1
        assert value(samples, "quorumq_client_connections_opened_total") >= 1
        # commands in entries: 101 enqueues, 30 single returns and rejects, batched settles...
        assert value(samples, "quorumq_group_commit_batch_size_sum") >= 101 + 30
        assert value(samples, "quorumq_group_commit_batch_size_count") >= 1

        # the replicated view: the same queue gauges and dead-letter counts on every node
        def caught_up(port: int) -> Samples | None:
            found = scrape(port)
            ok = value(found, "quorumq_queue_messages_ready", queue="m-dead") == 20
            return found if ok and value(found, "quorumq_queue_consumers", queue="m-held") else None

        for other, port in ports.items():
            found = wait_until(functools.partial(caught_up, port), 10, f"{other} caught up")
            dead = value(
                found,
                "quorumq_queue_messages_dead_lettered_total",
                queue="m-jobs",
                reason="rejected",
            )
            assert dead == 20, other
            assert value(found, "quorumq_queue_messages_ready", queue="m-jobs") == 1
            assert value(found, "quorumq_queue_messages_unacked", queue="m-jobs") == 0
            assert value(found, "quorumq_queue_messages_unacked", queue="m-held") == 3
            assert value(found, "quorumq_queue_messages", queue="m-held") == 3
            assert value(found, "quorumq_queue_consumers", queue="m-held") == 1
            assert value(found, "quorumq_queues") >= 3
            if other != node:  # node-local counters: nothing went through the others
                assert value(found, "quorumq_queue_messages_published_total", queue="m-jobs") == 0

    statuses = {n: scrape(p) for n, p in ports.items()}
    leaders = [n for n, s in statuses.items() if value(s, "quorumq_raft_is_leader") == 1]
    assert len(leaders) == 1
    for name, found in statuses.items():
        assert value(found, "quorumq_raft_leader", leader=leaders[0]) == 1, name
        assert value(found, "quorumq_raft_term") >= 1
        commit = value(found, "quorumq_raft_log_commit_index")
        applied = value(found, "quorumq_raft_log_last_applied_index")
        assert commit >= applied > 10  # entries: group-committed batches of commands
        assert value(found, "quorumq_raft_log_entries") >= 1
        assert value(found, "quorumq_raft_fsync_seconds_count") >= 1
        assert value(found, "quorumq_raft_apply_seconds_count") > 10
        assert value(found, "quorumq_raft_has_quorum") == 1


def test_a_dead_letter_into_a_missing_queue_is_counted_and_logged(
    metered: tuple[LocalCluster, dict[str, int]],
) -> None:
    """Issue 34 item 1 at run time: a queue whose dead-letter queue was deleted drops what it
    dead-letters (the machine has nowhere to put it). The node counts every dropped message in
    `quorumq_queue_messages_dropped_total` and the leader logs it, naming the missing queue."""
    cluster, ports = metered
    with cluster.client() as client:
        client.declare_queue("d-jobs", QueueConfig(dead_letter_queue="d-jobs.dlq"))
        client.delete_queue("d-jobs.dlq")
        client.declare_queue("d-plain")  # no dead-letter queue: a reject drops, as configured
        for queue in ("d-jobs", "d-plain"):
            with client.publisher(queue) as publisher:
                publisher.publish_many([b"x", b"y", b"z"])
            consumer = client.consume(queue, prefetch=3)
            for _ in range(3):
                message = consumer.get(timeout_s=10)
                assert message is not None
                message.reject()
            assert consumer.wait_settled(10)
            consumer.cancel()

    def counted(port: int) -> Samples | None:
        found = scrape(port)
        plain = value(
            found, "quorumq_queue_messages_dropped_total", queue="d-plain", reason="rejected"
        )
        return found if plain == 3 else None

    for name, port in ports.items():
        found = wait_until(functools.partial(counted, port), 10, f"{name} counted the drops")
        dropped = value(
            found, "quorumq_queue_messages_dropped_total", queue="d-jobs", reason="rejected"
        )
        assert dropped == 3, name
    leader = cluster.config.node(cluster.leader())
    log_text = (leader.data_dir / "node.log").read_text()
    lines = [line for line in log_text.splitlines() if "dead_letter_dropped" in line]
    assert lines, "the leader logged no dropped dead-letter"
    assert all("d-jobs.dlq" in line and "d-plain" not in line for line in lines), lines


def test_dashboard_queries_only_exposed_metrics(
    metered: tuple[LocalCluster, dict[str, int]],
) -> None:
    cluster, ports = metered
    with Client([cluster.config.nodes[0].client_address], cluster.key) as client:
        client.declare_queue("d-any")  # a queue, so per-queue series exist
        client.publish("d-any", b"x")
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['n1']}/metrics", timeout=5) as answer:
        families = {f.name for f in text_string_to_metric_families(answer.read().decode())}
    dashboard = json.loads((ROOT / "docs" / "grafana-quorumq.json").read_text(encoding="utf-8"))
    queried = set(re.findall(r"quorumq_[a-z_]+", json.dumps(dashboard)))
    assert len(queried) > 15
    missing = {q for q in queried if re.sub(r"_(total|bucket|sum|count)$", "", q) not in families}
    assert not missing, sorted(missing)


def test_metrics_port_taken_is_a_clear_error(tmp_path: Path) -> None:
    data_dir = tmp_path / "D"
    cfg = init_cluster(data_dir, 1)
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "cluster.node", "--data-dir", str(data_dir)]
        command += ["--node-id", cfg.nodes[0].id, "--metrics-port", str(port)]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 69, done.stderr
    assert f"cannot serve metrics on 127.0.0.1:{port}" in done.stderr
