"""Real node processes on machine v4 with one node's wall clock stepped (issue 31, item 1).

Each node reads its clock offset from `clock_offset_ms` in its data dir (the test hook
`QUORUMQ_CLOCK_OFFSET_FILE`, `raft.machine_clock`): the host's clock is never touched. The
issue's reproduction: a follower restarted with its clock a day ahead (its hello and a publish
through it carry that clock), then set right and restarted; then the leader's clock stepped back
an hour while it runs; then every clock an hour back and the whole cluster restarted (the
issue's "across restarts"). After each, a queue's message TTL and a consumer's timeout must fire on
time (neither at once nor never), and `/metrics` counts each node's rejected steps.
"""

from __future__ import annotations

import dataclasses
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster import config
from cluster.launcher import LocalCluster, free_ports, init_cluster, wait_until
from cluster.rawclient import RawClient
from fifo.commands import (
    Checkout,
    ConsumerId,
    DeclareQueue,
    Enqueue,
    QueueConfig,
    SimplePrefetch,
)
from fifo.effects import Deliver, Released
from fifo.replies import CheckoutOk, DeclareOk, Ok
from raft.machine_clock import CLOCK_OFFSET_FILE_ENV

pytestmark = pytest.mark.cluster

OFFSET_FILE = "clock_offset_ms"  # relative: the launcher starts each node in its data dir
DAY_MS = 86_400_000
HOUR_MS = 3_600_000
TTL_MS = 5000
LOCK_MS = 3000
MESSAGES = 10
HELD = 5
EARLY_SLACK_S = 0.3  # the machine time at the enqueue is a little before this process's t0
LATE_SLACK_S = 3.0  # leader timer period (0.1 s), commit latency, a loaded 2-core host
FIRE_WAIT_S = 25.0  # "never" (a day, an hour) is far beyond this


def step_clock(cluster: LocalCluster, node_id: str, offset_ms: int) -> None:
    """Set `node_id`'s wall-clock offset (the node re-reads it within 0.1 s)."""
    (cluster.config.node(node_id).data_dir / OFFSET_FILE).write_text(f"{offset_ms}\n")


def scrape_steps(port: int) -> dict[str, float]:
    """`quorumq_clock_steps_rejected_total` by node, from http://127.0.0.1:PORT/metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode("utf-8")
    return {
        sample.labels["node"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "quorumq_clock_steps_rejected_total"
    }


def counted_steps(port: int, nodes: tuple[str, ...], timeout_s: float = 10.0) -> dict[str, float]:
    """The rejected steps by node, once each of `nodes` has one (or as they are at `timeout_s`:
    the assertion that follows says what is missing)."""
    deadline = time.monotonic() + timeout_s
    steps = scrape_steps(port)
    while any(steps.get(node, 0) < 1 for node in nodes) and time.monotonic() < deadline:
        time.sleep(0.2)
        steps = scrape_steps(port)
    return steps


def fire_times(raw: RawClient, tag: str) -> tuple[float | None, float | None]:
    """Seconds from publishing until a TTL of TTL_MS expired every message, and until a consumer
    timeout of LOCK_MS released the held deliveries (None: not within FIRE_WAIT_S)."""
    ttl_queue, lock_queue = f"{tag}-ttl", f"{tag}-locks"
    for queue, queue_config in (
        (ttl_queue, QueueConfig(message_ttl_ms=TTL_MS)),
        (lock_queue, QueueConfig(consumer_timeout_ms=LOCK_MS)),
    ):
        assert isinstance(raw.command(DeclareQueue(queue, queue_config)), DeclareOk)
    consumer = ConsumerId(tag, raw.connection)
    assert isinstance(raw.command(Checkout(lock_queue, consumer, SimplePrefetch(HELD))), CheckoutOk)
    raw.effects.clear()
    started = time.monotonic()
    for number in range(MESSAGES):
        assert raw.command(Enqueue(ttl_queue, b"ttl %d" % number)) == Ok()
    for number in range(HELD):
        assert raw.command(Enqueue(lock_queue, b"held %d" % number)) == Ok()
    ttl_s = lock_s = None
    deadline = started + FIRE_WAIT_S
    while (ttl_s is None or lock_s is None) and time.monotonic() < deadline:
        effects = raw.read_effects(len(raw.effects) + 1, 0.1)
        now = time.monotonic() - started
        if lock_s is None and any(isinstance(e, Released) for e in effects):
            lock_s = now
        if ttl_s is None and raw.query("overview", queue=ttl_queue)["total"] == 0:
            ttl_s = now
    delivered = sum(len(e.messages) for e in raw.effects if isinstance(e, Deliver))
    assert delivered == HELD, f"{tag}: {delivered} of {HELD} messages delivered"
    return ttl_s, lock_s


def assert_on_time(tag: str, fired: tuple[float | None, float | None]) -> None:
    """Both fired, neither early nor late."""
    ttl_s, lock_s = fired
    for what, took, due_ms in (("message TTL", ttl_s, TTL_MS), ("consumer timeout", lock_s,
                                                                  LOCK_MS)):  # fmt: skip
        assert took is not None, f"{tag}: the {what} ({due_ms} ms) did not fire in {FIRE_WAIT_S}s"
        due_s = due_ms / 1000
        assert due_s - EARLY_SLACK_S <= took <= due_s + LATE_SLACK_S, (tag, what, took)


def test_ttl_and_consumer_timeouts_fire_on_time_after_one_node_s_clock_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """+1 day on a restarted follower, then set right; -1 hour on the running leader; then every
    clock -1 hour and the whole cluster restarted: after each, a 5 s TTL and a 3 s consumer
    timeout fire on time; the two single-node steps are counted."""
    monkeypatch.setenv(CLOCK_OFFSET_FILE_ENV, OFFSET_FILE)
    data_dir = tmp_path / "D"
    cfg = init_cluster(data_dir, nodes=3)
    ports = dict(zip(cfg.node_ids(), free_ports(3), strict=True))
    cfg = dataclasses.replace(
        cfg, nodes=tuple(dataclasses.replace(n, metrics_port=ports[n.id]) for n in cfg.nodes)
    )
    config.write(data_dir, cfg)
    cluster = LocalCluster(data_dir, cfg)
    try:
        for node in cfg.nodes:
            cluster.start_node(node.id)
        leader = cluster.leader()
        follower = next(node.id for node in cfg.nodes if node.id != leader)
        raw = cluster.raw_client(leader)
        wait_until(lambda: raw.query("machine")["effective_version"] == 4, 30, "machine v4")
        raw.close()

        step_clock(cluster, follower, DAY_MS)  # the issue: restarted a day ahead, for a while
        cluster.restart(follower)
        probe = cluster.raw_client(follower)
        assert isinstance(probe.command(DeclareQueue("probe")), DeclareOk)
        assert probe.command(Enqueue("probe", b"stamped a day ahead")) == Ok()
        probe.close()
        step_clock(cluster, follower, 0)  # then set right, and restarted again
        cluster.restart(follower)
        leader = cluster.leader()
        raw = cluster.raw_client(leader)
        after_day = fire_times(raw, "day")
        raw.close()

        step_clock(cluster, leader, -HOUR_MS)  # the leader's clock an hour back, running
        time.sleep(0.3)  # it re-reads the offset within 0.1 s
        raw = cluster.raw_client(leader)
        after_hour = fire_times(raw, "hour")
        raw.close()

        steps = counted_steps(ports[leader], (follower, leader))

        for node in cfg.nodes:  # every clock an hour behind, across a whole-cluster restart
            step_clock(cluster, node.id, -HOUR_MS)
        cluster.stop()
        for node in cfg.nodes:
            cluster.start_node(node.id)
        raw = cluster.raw_client(cluster.leader())
        after_restart = fire_times(raw, "restart")
        raw.close()
        print(
            f"fired (ttl s, consumer timeout s): after +1 day {after_day}, -1 h {after_hour}, "
            f"all -1 h and restarted {after_restart}"
        )
        assert_on_time("+1 day on a follower", after_day)
        assert_on_time("-1 hour on the leader", after_hour)
        assert_on_time("every clock -1 hour, the cluster restarted", after_restart)
        print(f"quorumq_clock_steps_rejected_total on {leader} before the restart: {steps}")
        assert steps.get(follower, 0) >= 1 and steps.get(leader, 0) >= 1, steps

    finally:
        cluster.stop()
