"""One chaos run on real links (`scripts/chaos.py --netns`): the run of `cluster.chaos.run`,
with the nodes in network namespaces of their own (TLS bundles, `NetnsCluster`) and the
workload, the nemesis and the checks in the clients' namespace.

The same workload, schedule, drain, checker and report as `run.run` (its steps are reused
as they are); what differs: a kill or a pause hits a node process in its namespace, a
partition takes the node's link down (both directions, its clients' traffic too: every
partition shape is an isolation here, and the report says `isolate`), a membership fault
adds a host, issues its bundle and replaces a follower through `member add`/`member remove`.
Power-loss faults are refused (the page cache is the machine's, not the namespace's).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any, cast

from cluster.chaos import run as chaos_run
from cluster.chaos.control import LauncherCluster
from cluster.chaos.history import Recorder
from cluster.chaos.linkproxy import ProxyMesh
from cluster.chaos.nemesis import Nemesis, expand_faults, make_schedule
from cluster.chaos.netns import netns_lab, unavailable
from cluster.chaos.netns_cluster import NetnsCluster
from cluster.chaos.replicas import ReplicaCheck, check_replicas
from cluster.chaos.timeline import plotting_missing

UNSUPPORTED_PREFIXES = ("power-loss",)


class NetnsRefused(RuntimeError):
    """Raised before anything starts when a namespace run cannot be done here: no root, no
    iproute2, no matplotlib for the timeline, or a fault kind namespaces cannot inject."""


class LinkFaults:
    """The nemesis' partition verbs on namespace links (what `ProxyMesh` offers on proxies)."""

    def __init__(self, cluster: NetnsCluster) -> None:
        self.cluster = cluster
        self.down: set[str] = set()

    def isolate(self, node: str) -> None:
        """Take `node`'s link down."""
        self.cluster.partition(node)
        self.down.add(node)

    def cut(self, source: str, target: str) -> None:
        """One-way cuts need per-pair links; the schedule here has isolations only."""
        raise RuntimeError(f"one-way cut {source}->{target}: not on namespace links")

    def heal(self) -> None:
        """Bring every link taken down back up."""
        for node in sorted(self.down):
            self.cluster.heal(node)
        self.down.clear()


def run(params: chaos_run.RunParams) -> dict[str, Any]:
    """Run the whole experiment on namespaces; the report (also written to out_dir)."""
    kinds = expand_faults(params.faults)
    refused = [k for k in kinds if k.startswith(UNSUPPORTED_PREFIXES)]
    if refused:
        raise NetnsRefused(f"--netns cannot inject {', '.join(refused)} (the page cache is shared)")
    for why in (unavailable(), plotting_missing()):
        if why is not None:
            raise NetnsRefused(why)
    params.out_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="quorumq-chaos-netns-", dir="/tmp"))
    stage = chaos_run._Stage()
    recorder = Recorder(params.out_dir / "history.jsonl")
    replicas: ReplicaCheck | None = None
    workload_end_s = 0.0
    with netns_lab([]) as lab:
        cluster = NetnsCluster(lab, workdir, params.nodes)
        links = LinkFaults(cluster)
        nemesis = Nemesis(cluster, recorder, cast(ProxyMesh, links))
        stage.notes.append(f"netns: {_addresses(cluster)}; partitions take a link down")
        try:
            with cluster.client_side():  # this thread and every thread it starts
                workload_end_s, replicas = _experiment(
                    params, kinds, cluster, recorder, nemesis, stage
                )
        finally:
            with cluster.client_side():
                nemesis.heal_everything()
            cluster.shutdown()
            recorder.close()
            _keep_node_logs(cluster, params.out_dir / "nodes")
    if not params.keep_data:
        shutil.rmtree(workdir, ignore_errors=True)
    report = chaos_run._report(
        params, kinds, recorder, nemesis, replicas, stage, workload_end_s, workdir
    )
    chaos_run._write_json(params.out_dir / "report.json", report)
    return report


def _experiment(
    params: chaos_run.RunParams,
    kinds: list[str],
    cluster: NetnsCluster,
    recorder: Recorder,
    nemesis: Nemesis,
    stage: Any,
) -> tuple[float, ReplicaCheck]:
    """Start, load, fault, heal, drain and compare replicas (in the clients' namespace)."""
    # run.py's steps take a LauncherCluster; NetnsCluster has every member they use
    # (endpoints, key, tls, config, leader, start_all, shutdown)
    handle = cast(LauncherCluster, cluster)
    cluster.start_all()
    cluster.wait_leader(params.leader_timeout_s)
    chaos_run._declare_queues(
        handle, params.workload.queues, params.groups, params.queue_disconnected_timeout_ms
    )
    schedule = [
        dataclasses.replace(fault, shape="isolate")
        for fault in make_schedule(kinds, params.duration_s, params.seed, params.schedule)
    ]
    workload_end_s = chaos_run._run_workload(params, handle, recorder, nemesis, schedule, stage)
    chaos_run._recover(params, handle, nemesis, recorder, stage)
    chaos_run._drain(params, handle, recorder, stage)
    return workload_end_s, check_replicas(handle, params.workload.queues)


def _addresses(cluster: NetnsCluster) -> str:
    return ", ".join(f"{n} {cluster.members[n].client_address}" for n in cluster.node_ids())


def _keep_node_logs(cluster: NetnsCluster, into: Path) -> None:
    """Every node's node.log and stderr.log (replaced nodes too) into `into/<node>/`."""
    for node in sorted(cluster.processes):
        machine = cluster.machine(node)
        for source in (machine / node / "node.log", machine / "stderr.log"):
            if source.exists():
                (into / node).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, into / node / source.name)
