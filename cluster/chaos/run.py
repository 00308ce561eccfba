"""One chaos run: start a local cluster, run the workload under the nemesis schedule, heal,
drain every queue through every node, check the history and write the report and timeline.

Files in `out_dir`: `history.jsonl` (see `cluster.chaos.history`), `report.json`,
`timeline.png`. The cluster lives in a fresh data dir under /tmp and is stopped at the end.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import structlog

import fifo
from cluster import config as cluster_config
from cluster import launcher
from cluster import tls as cluster_tls
from cluster.chaos import availability, group_workload
from cluster.chaos.availability import FaultWindow
from cluster.chaos.backlog import QUEUE as BACKLOG_QUEUE
from cluster.chaos.backlog import BacklogCheck, BacklogParams
from cluster.chaos.checker import check
from cluster.chaos.control import LauncherCluster, route_through_proxies
from cluster.chaos.group_workload import GroupMember, GroupParams, GroupProducer, MemberCrasher
from cluster.chaos.groups import check_groups
from cluster.chaos.history import Recorder
from cluster.chaos.linkproxy import ProxyMesh
from cluster.chaos.nemesis import Nemesis, ScheduleParams, expand_faults, make_schedule
from cluster.chaos.replicas import ReplicaCheck, check_replicas, queue_total
from cluster.chaos.timeline import plot_timeline, plotting_missing
from cluster.chaos.workload import (
    Drainer,
    Producer,
    QueueConsumer,
    Worker,
    WorkloadParams,
)
from cluster.client import Client
from cluster.client.errors import ClusterError
from cluster.client.groups import join_group
from cluster.config import SNAPSHOT_EVERY_ENTRIES_DEFAULT, FsyncPolicy
from fifo.commands import QueueConfig
from raft import durability

log = structlog.get_logger(__name__)

CONSUMER_TAIL_S = 3.0  # consumers keep going this long after producers stop
JOIN_TIMEOUT_S = 20.0
# how long the workload may run past --duration for faults a slow heal pushed back
LATE_FAULTS_S_MAX = 60.0


@dataclass(frozen=True, slots=True)
class RunParams:
    """Everything a run depends on; the seed fixes the fault schedule."""

    duration_s: float = 60.0
    faults: tuple[str, ...] = ("kill", "pause", "partition")
    seed: int = 1
    out_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="quorumq-chaos-")))
    nodes: int = 3
    fsync: FsyncPolicy | None = None  # None: the cluster's default policy
    workload: WorkloadParams = field(default_factory=WorkloadParams)
    schedule: ScheduleParams = field(default_factory=ScheduleParams)
    leader_timeout_s: float = 30.0
    drain_idle_s: float = 2.0
    drain_timeout_s: float = 60.0
    gap_s: float = 1.0  # a pause between publish confirms longer than this is unavailability
    keep_data: bool = False
    tls: bool = False  # `tls = true`: peer and client traffic over TLS (certificates in D/tls)
    # compact the log this often: small values make lagging nodes catch up by snapshot
    snapshot_every_entries: int = SNAPSHOT_EVERY_ENTRIES_DEFAULT
    # the consumer-group workload (issue 10): producers publish to the partitioned queue's base
    # name (keyed, or round robin), members of one group consume instead of queue consumers;
    # workload.queues are then the partition queues (drained and compared)
    groups: GroupParams | None = None
    # the queues' disconnected timeout (None: the machine's default); short ones return a
    # paused or cut-off node's consumers' messages while that node still has them to deliver
    queue_disconnected_timeout_ms: int | None = None
    # a standing backlog (issue 32): published before the faults, drained after them through
    # every node, each body checked against what was published (cluster/chaos/backlog.py)
    backlog: BacklogParams | None = None
    # the nodes' machine version cap (None: the newest released); an unreleased one is
    # allowed for the run's nodes only (UNRELEASED_FLAG in their environment)
    machine_version: int | None = None


@dataclass(slots=True)
class _Stage:
    """Mutable state of a run, for the report."""

    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    drained: dict[str, int] = field(default_factory=dict)
    drain_errors: list[str] = field(default_factory=list)
    proxy_bytes: dict[str, int] | None = None  # bytes through each link proxy (None: no mesh)


# Called in its own thread while the workload runs: an extra actor (tests use it to sabotage).
DuringHook = Callable[[LauncherCluster, Recorder], None]


def run(params: RunParams, during: DuringHook | None = None) -> dict[str, Any]:
    """Run the whole experiment and return the report (also written to out_dir)."""
    if (missing := plotting_missing()) is not None:
        raise RuntimeError(missing)  # say so now, not after the whole run
    out_dir = params.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    kinds = expand_faults(params.faults)
    data_dir = _init_data_dir(params, kinds)
    stage = _Stage()
    mesh = _make_mesh(data_dir, kinds, stage)
    if mesh is None:
        kinds = [k for k in kinds if not k.startswith("partition")]
    cluster = LauncherCluster(data_dir)
    cluster.mesh = mesh  # a member added by a membership fault gets proxied links too
    recorder = Recorder(out_dir / "history.jsonl")
    nemesis = Nemesis(cluster, recorder, mesh)
    replicas: ReplicaCheck | None = None
    backlog = BacklogCheck(params.backlog) if params.backlog is not None else None
    try:
        _prepare(params, cluster, backlog)
        schedule = make_schedule(kinds, params.duration_s, params.seed, params.schedule)
        if during is not None:
            threading.Thread(target=during, args=(cluster, recorder), daemon=True).start()
        workload_end_s = _run_workload(params, cluster, recorder, nemesis, schedule, stage)
        _recover(params, cluster, nemesis, recorder, stage)
        _drain(params, cluster, recorder, stage)
        queues = params.workload.queues
        if backlog is not None:
            backlog.drain(cluster.endpoints(), cluster.key, cluster.tls)
            queues = (*queues, BACKLOG_QUEUE)
        replicas = check_replicas(cluster, queues)
    finally:
        nemesis.heal_everything()
        cluster.shutdown()
        _close_mesh(mesh, stage)
        recorder.close()
        _keep_node_logs(data_dir, out_dir / "nodes")
        if not params.keep_data:
            shutil.rmtree(data_dir, ignore_errors=True)
    report = _report(params, kinds, recorder, nemesis, replicas, stage, workload_end_s, data_dir)
    if backlog is not None:
        report["backlog"] = backlog.to_dict(out_dir / "nodes")
        report["valid"] = report["valid"] and backlog.valid
    _write_json(out_dir / "report.json", report)
    return report


def _init_data_dir(params: RunParams, kinds: list[str]) -> Path:
    """A fresh cluster data dir under /tmp (config, secret, certificates), and what the node
    processes need in their environment for the faults and the machine version asked for."""
    data_dir = Path(tempfile.mkdtemp(prefix="quorumq-chaos-", dir="/tmp"))
    if any(kind.startswith("power-loss") for kind in kinds):
        # the nodes record how much of their journal is fsynced (test-only layer), so that
        # the power-loss fault can drop the rest
        os.environ[durability.FAULT_POWER_LOSS_ENV] = "1"
    if params.machine_version in fifo.UNRELEASED_VERSIONS:
        os.environ[cluster_config.UNRELEASED_FLAG] = "1"
    fsync: dict[str, Any] = {} if params.fsync is None else {"fsync": params.fsync}
    config = launcher.init_cluster(
        data_dir,
        params.nodes,
        snapshot_every_entries=params.snapshot_every_entries,
        tls=params.tls,
        max_machine_version=params.machine_version,
        **fsync,
    )
    cluster_tls.ensure_certificates(data_dir, config)
    return data_dir


def _prepare(params: RunParams, cluster: LauncherCluster, backlog: BacklogCheck | None) -> None:
    """Start the nodes, wait for a leader (and the machine version asked for), declare the
    queues and publish the standing backlog, if any: everything before the faults."""
    cluster.start_all()
    launcher.wait_for_leader(cluster.config, cluster.key, params.leader_timeout_s, tls=cluster.tls)
    if params.machine_version is not None:
        _wait_for_machine(cluster, params.machine_version, params.leader_timeout_s)
    _declare_queues(
        cluster, params.workload.queues, params.groups, params.queue_disconnected_timeout_ms
    )
    if backlog is not None:
        backlog.fill(list(cluster.endpoints().values()), cluster.key, cluster.tls)


def _close_mesh(mesh: ProxyMesh | None, stage: _Stage) -> None:
    """Close the link proxies, keeping the bytes each forwarded for the report."""
    if mesh is not None:
        stage.proxy_bytes = {
            f"{source}->{target}": sum(proxy.bytes_forwarded())
            for (source, target), proxy in mesh.proxies.items()
        }
        mesh.close()


def _wait_for_machine(cluster: LauncherCluster, version: int, timeout_s: float) -> None:
    """Wait until the cluster applies machine `version` (the leader upgrades a new cluster once
    every node said what it supports): the workload runs on the version asked for."""

    def effective() -> bool:
        with Client(
            list(cluster.endpoints().values()), cluster.key, name="chaos-machine", tls=cluster.tls
        ) as client:
            return int(str(client.machine()["effective_version"])) >= version

    launcher.wait_until(effective, timeout_s, f"machine version {version}")


def _keep_node_logs(data_dir: Path, into: Path) -> None:
    """Copy every node's `node.log` and `stderr.log` (a few KiB each) into `into/<node>/`: a
    failed run can be read after its data dir is gone."""
    for log_file in sorted(data_dir.glob("*/*.log")):
        if log_file.name in ("node.log", "stderr.log"):
            target = into / log_file.parent.name
            target.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(log_file, target / log_file.name)


def _make_mesh(data_dir: Path, kinds: list[str], stage: _Stage) -> ProxyMesh | None:
    """Proxies between the peers (via cluster.toml `peer_addresses`) when partitions are asked."""
    if not any(k.startswith("partition") for k in kinds):
        return None
    config = cluster_config.load(data_dir)
    mesh = ProxyMesh({node.id: node.raft_address for node in config.nodes})
    if route_through_proxies(data_dir, mesh):
        return mesh
    mesh.close()
    stage.notes.append(
        "partition faults skipped: cluster.toml cannot carry peer_addresses, so nodes "
        "cannot dial their peers through the link proxies"
    )
    return None


def _declare_queues(
    cluster: LauncherCluster,
    queues: tuple[str, ...],
    groups: GroupParams | None,
    disconnected_timeout_ms: int | None = None,
) -> None:
    endpoints = list(cluster.endpoints().values())
    with Client(endpoints, cluster.key, name="chaos-setup", tls=cluster.tls) as client:
        if groups is not None:
            group_workload.declare(client, groups, disconnected_timeout_ms=disconnected_timeout_ms)
            return
        config = QueueConfig()
        if disconnected_timeout_ms is not None:
            config = QueueConfig(disconnected_timeout_ms=disconnected_timeout_ms)
        for queue in queues:
            client.declare_queue(queue, config)


def _client_factory(cluster: LauncherCluster, params: WorkloadParams) -> Callable[[str], Client]:
    """Clients spread over the nodes: each new one starts with the next node in turn.

    Every other client keeps the library default and moves to the leader; the rest stay on the
    node they dialed, so follower faults and command forwarding are exercised too (with only
    leader-bound clients, every client stalls together when the leader is cut off).
    The members are read at each call: after a membership fault replaced every original node,
    a new client must know the new ones (its nodes' welcomes list only what they started with).
    """
    turn = itertools.count()

    def make(name: str) -> Client:
        number = next(turn)
        endpoints = list(cluster.endpoints().values())
        first = number % len(endpoints)
        ordered = endpoints[first:] + endpoints[:first]
        return Client(
            ordered,
            cluster.key,
            name=name,
            connect_timeout_s=5.0,
            request_timeout_s=params.confirm_timeout_s,
            reconnect_timeout_s=10.0,
            prefer_leader=number % 2 == 0,
            tls=cluster.tls,
        )

    return make


def _run_workload(
    params: RunParams,
    cluster: LauncherCluster,
    recorder: Recorder,
    nemesis: Nemesis,
    schedule: list[Any],
    stage: _Stage,
) -> float:
    """Producers, consumers and the nemesis for `duration_s`; returns the workload end (s)."""
    wl = params.workload
    factory = _client_factory(cluster, wl)
    produce_stop, consume_stop, nemesis_stop = (
        threading.Event(),
        threading.Event(),
        threading.Event(),
    )
    run_id = f"s{params.seed}-{int(time.time())}"
    producers: list[Worker] = [
        Producer(i, wl.queues[i % len(wl.queues)], factory, recorder, produce_stop, wl, run_id)
        if params.groups is None
        else GroupProducer(
            i, factory, recorder, produce_stop, params.groups, wl, run_id, params.seed
        )
        for i in range(wl.producers)
    ]
    consumers: list[Worker] = [
        QueueConsumer(
            i,
            wl.queues[i % len(wl.queues)],
            factory,
            recorder,
            consume_stop,
            wl,
            credited=i % 2 == 1,
        )
        for i in range(wl.consumers if params.groups is None else 0)
    ]
    if params.groups is not None:
        members = [
            GroupMember(i, factory, recorder, consume_stop, params.groups, wl)
            for i in range(params.groups.members)
        ]
        consumers += members
        MemberCrasher(members, params.groups, params.seed, nemesis_stop).start()
    nemesis_thread = threading.Thread(
        target=nemesis.run, args=(schedule, nemesis_stop), name="nemesis", daemon=True
    )
    for worker in [*consumers, *producers]:
        worker.start()
    nemesis_thread.start()
    time.sleep(max(0.0, params.duration_s - recorder.now_ns() / 1e9))
    # slow fault actions shift the schedule (nemesis.run): every scheduled fault is played at
    # its full length, so the workload runs on until the last one is healed (bounded)
    nemesis_thread.join(LATE_FAULTS_S_MAX)
    nemesis_stop.set()
    nemesis_thread.join(JOIN_TIMEOUT_S)
    produce_stop.set()
    _join(producers, stage)
    workload_end_s = recorder.now_ns() / 1e9
    time.sleep(CONSUMER_TAIL_S)
    consume_stop.set()
    _join(consumers, stage)
    for worker in [*producers, *consumers]:
        if worker.errors:
            stage.notes.append(
                f"{worker.name}: {len(worker.errors)} errors, first: {worker.errors[0]}"
            )
    return workload_end_s


def _join(workers: list[Worker], stage: _Stage) -> None:
    for worker in workers:
        worker.join(JOIN_TIMEOUT_S)
        if worker.is_alive():
            stage.notes.append(f"{worker.name} did not stop within {JOIN_TIMEOUT_S:.0f}s")


def _recover(
    params: RunParams, cluster: LauncherCluster, nemesis: Nemesis, recorder: Recorder, stage: _Stage
) -> None:
    """Heal everything, then wait for a leader; the wait is reported."""
    nemesis.heal_everything()
    healed = recorder.now_ns() / 1e9
    launcher.wait_for_leader(cluster.config, cluster.key, params.leader_timeout_s, tls=cluster.tls)
    stage.timings["leader_after_heal_s"] = round(recorder.now_ns() / 1e9 - healed, 3)


def _drain(params: RunParams, cluster: LauncherCluster, recorder: Recorder, stage: _Stage) -> None:
    """Drain every queue through every node in turn, in rounds until they hold nothing.

    Messages still checked out to a connection that died with a fault come back only when its
    node notices (a restart, a resumed process), which may be after a round went idle: hence
    rounds until empty (counting checked-out messages too), bounded by `drain_timeout_s`.
    """
    deadline = time.monotonic() + params.drain_timeout_s
    started = recorder.now_ns() / 1e9
    rounds = 0
    while time.monotonic() < deadline:
        rounds += 1
        for node_id, endpoint in cluster.endpoints().items():
            _drain_through(params, cluster, recorder, stage, node_id, endpoint, deadline)
        if _queues_empty(cluster, params.workload.queues):
            break
        time.sleep(1.0)  # let pending returns land before the next round
    stage.timings["drain_s"] = round(recorder.now_ns() / 1e9 - started, 3)
    stage.timings["drain_rounds"] = rounds


def _drain_through(
    params: RunParams,
    cluster: LauncherCluster,
    recorder: Recorder,
    stage: _Stage,
    node_id: str,
    endpoint: str,
    deadline: float,
) -> None:
    """One drain pass over every queue through one node."""
    drainer = Drainer(node_id, recorder, params.workload)
    try:
        with Client(
            [endpoint],
            cluster.key,
            name=f"chaos-drain-{node_id}",
            reconnect=False,
            request_timeout_s=10.0,
            tls=cluster.tls,
        ) as client:
            if params.groups is not None:
                got = _drain_group(params.groups, drainer, client, node_id, params, deadline)
                stage.drained[node_id] = stage.drained.get(node_id, 0) + got
                return
            for queue in params.workload.queues:
                got = drainer.drain(client, queue, params.drain_idle_s, deadline)
                stage.drained[node_id] = stage.drained.get(node_id, 0) + got
    except (ClusterError, OSError) as err:
        stage.drain_errors.append(f"{node_id}: {type(err).__name__}: {err}")


def _drain_group(
    groups: GroupParams,
    drainer: Drainer,
    client: Client,
    node_id: str,
    params: RunParams,
    deadline: float,
) -> int:
    """Drain the partitions as a member of the group (plain consumers are refused there)."""
    process = f"drain-{node_id}"
    member = join_group(client, groups.group, groups.queue, member=process, prefetch=50)
    count = 0
    try:
        while time.monotonic() < deadline:
            message = member.get(timeout_s=params.drain_idle_s)
            if message is None:
                break
            drainer.acker.settle(client, cast(Any, _DrainTag(member.tag)), message, process)
            count += 1
    finally:
        drainer.acker.wait()
        member.leave()
    return count


class _DrainTag:
    def __init__(self, tag: str) -> None:
        self.tag = tag


def _queues_empty(cluster: LauncherCluster, queues: tuple[str, ...]) -> bool:
    """True when the replica a client lands on holds no message in any of `queues`."""
    try:
        with Client(
            list(cluster.endpoints().values()),
            cluster.key,
            name="chaos-drain-check",
            request_timeout_s=5.0,
            tls=cluster.tls,
        ) as client:
            return all(
                queue_total(client.query("overview", {"queue": queue})) == 0 for queue in queues
            )
    except (ClusterError, OSError):
        return False


def _report(
    params: RunParams,
    kinds: list[str],
    recorder: Recorder,
    nemesis: Nemesis,
    replicas: ReplicaCheck | None,
    stage: _Stage,
    workload_end_s: float,
    data_dir: Path,
) -> dict[str, Any]:
    """Check the history and assemble the JSON report (and draw the timeline)."""
    events = recorder.events()
    verdict = check(events)
    windows = availability.unavailable_windows(
        events, params.schedule.warmup_s / 2, workload_end_s, params.gap_s
    )
    fault_windows = [
        FaultWindow(r.kind, r.start_s, r.end_s if r.end_s is not None else r.start_s)
        for r in nemesis.records
    ]
    faults = _fault_rows(nemesis, fault_windows, windows)
    end_s = recorder.now_ns() / 1e9
    series = availability.throughput(events, end_s)
    png = plot_timeline(
        series,
        fault_windows,
        windows,
        params.out_dir / "timeline.png",
        title=f"quorumq chaos: faults {','.join(kinds) or 'none'}, seed {params.seed}",
    )
    acks = _ack_counts(events)
    replica_dict = replicas.to_dict() if replicas is not None else None
    groups = (
        check_groups(events, params.groups.queue, params.groups.partitions)
        if params.groups is not None
        else None
    )
    return {
        "valid": verdict.valid
        and bool(replicas and replicas.ok)
        and (groups is None or groups.valid),
        "groups": groups.to_dict() if groups is not None else None,
        "seed": params.seed,
        "duration_s": params.duration_s,
        "faults_requested": list(params.faults),
        "fault_kinds": kinds,
        "params": _params_dict(params),
        "faults": faults,
        "operations": {
            "publish": {
                "attempted": verdict.attempted,
                "ok": verdict.ok,
                "failed": verdict.failed,
                "unknown": verdict.unknown,
            },
            "ack": acks,
            "delivered": verdict.delivered,
        },
        "lost": len(verdict.lost),
        "unexpected": len(verdict.unexpected),
        "duplicated": len(verdict.duplicated),
        "recovered": len(verdict.recovered),
        # issue 24: deliveries after an ack of the same message completed ok (any flag)
        "late_deliveries": len(verdict.delivered_after_ack),
        "checker": verdict.to_dict(),
        "availability": _availability(windows, fault_windows, params.gap_s),
        "replicas": replica_dict,
        "drain": {"consumed_per_node": stage.drained, "errors": stage.drain_errors},
        "timings": stage.timings,
        "peer_links": _peer_links(stage),
        "notes": stage.notes,
        "files": {
            "history": str(params.out_dir / "history.jsonl"),
            "timeline": str(png),
            "report": str(params.out_dir / "report.json"),
            "data_dir": str(data_dir) if params.keep_data else None,
            "node_logs": str(params.out_dir / "nodes"),
        },
    }


def _fault_rows(
    nemesis: Nemesis, fault_windows: list[FaultWindow], windows: list[availability.Window]
) -> list[dict[str, Any]]:
    """Each fault as recorded, with its recovery time and the unavailability blamed on it."""
    rows = []
    for index, (record, window) in enumerate(zip(nemesis.records, fault_windows, strict=True)):
        # the next fault's start bounds what this one is blamed for
        later = fault_windows[index + 1 :]
        next_start = later[0].start_s if later else None
        recovery_s, unavailable_s = availability.recovery(window, windows, next_start_s=next_start)
        rows.append(
            {
                **record.to_dict(),
                "recovery_s": round(recovery_s, 3),
                "unavailable_s": round(unavailable_s, 3),
            }
        )
    return rows


def _availability(
    windows: list[availability.Window], fault_windows: list[FaultWindow], gap_s: float
) -> dict[str, Any]:
    """Max unavailability, every unavailable window and those that no fault explains."""
    return {
        "max_unavailability_s": round(max((w.length_s for w in windows), default=0.0), 3),
        "unavailable_windows": [w.to_dict() for w in windows],
        "unexpected_unavailability": [
            w.to_dict() for w in availability.unexpected(windows, fault_windows)
        ],
        "gap_s": gap_s,
    }


def _peer_links(stage: _Stage) -> dict[str, Any] | None:
    """Bytes through every link proxy; a partition run without any means nothing was cut."""
    if stage.proxy_bytes is None:
        return None
    return {"routed": sum(stage.proxy_bytes.values()) > 0, "bytes": stage.proxy_bytes}


def _ack_counts(events: list[Any]) -> dict[str, int]:
    counts = {"ok": 0, "failed": 0, "unknown": 0}
    invoked = 0
    for event in events:
        if event.f != "ack":
            continue
        if event.type == "invoke":
            invoked += 1
        elif event.type == "ok":
            counts["ok"] += 1
        elif event.type == "fail":
            counts["failed"] += 1
    counts["unknown"] = invoked - counts["ok"] - counts["failed"]
    return counts


def _params_dict(params: RunParams) -> dict[str, Any]:
    raw = asdict(params)
    raw["out_dir"] = str(params.out_dir)
    return raw


def _write_json(path: Path, report: dict[str, Any]) -> None:
    import json

    path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
