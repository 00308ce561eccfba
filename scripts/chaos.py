"""Chaos run against a real local 3-node cluster: workload + nemeses + total-queue checker.

    python scripts/chaos.py --duration 120 --faults kill,pause,partition --seed 1 --json

Writes history.jsonl, report.json and timeline.png into --out (default: a fresh temp dir),
prints a summary (or the whole report with --json) and exits 0 when the run is valid (nothing
lost, nothing unexpected, equal digests, every queue empty after the drain), 1 otherwise.
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
import structlog

import fifo
from cluster.chaos import group_workload
from cluster.chaos.backlog import BODY_BYTES_MAX, BODY_BYTES_MIN, MESSAGES_MAX, BacklogParams
from cluster.chaos.nemesis import FAULT_KINDS, LEADER_TOKEN, expand_faults
from cluster.chaos.run import RunParams, run
from cluster.chaos.workload import WorkloadParams


def _quiet_logs(verbose: bool) -> None:
    """Logs go to stderr so that --json leaves stdout to the report."""
    level = logging.INFO if verbose else logging.WARNING
    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(level),
    )


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--duration",
    "duration_s",
    type=click.FloatRange(10, 3600),
    default=60.0,
    show_default=True,
    help="Seconds of workload under faults.",
)
@click.option(
    "--faults",
    default="kill,pause,partition",
    show_default=True,
    help=f"Comma-separated: {', '.join([*FAULT_KINDS, LEADER_TOKEN])} (or 'none').",
)
@click.option("--seed", type=int, default=1, show_default=True, help="Fault schedule seed.")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Output dir (default: a fresh temp dir, never the checkout).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the whole report as JSON.")
@click.option(
    "--workload",
    type=click.Choice(["queues", "groups"]),
    default="queues",
    show_default=True,
    help="queues: consumers per queue; groups: a consumer group over a partitioned queue.",
)
@click.option(
    "--partitions",
    type=click.IntRange(1, 64),
    default=8,
    show_default=True,
    help="groups: partitions of the partitioned queue (producers publish to its base name).",
)
@click.option(
    "--members", type=click.IntRange(1, 32), default=3, show_default=True, help="groups: members."
)
@click.option("--producers", type=click.IntRange(1, 32), default=3, show_default=True)
@click.option("--consumers", type=click.IntRange(1, 32), default=3, show_default=True)
@click.option("--queues", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option(
    "--rate",
    type=click.FloatRange(1, 2000),
    default=40.0,
    show_default=True,
    help="Total publishes per second over every producer (upper bound).",
)
@click.option(
    "--fsync",
    type=click.Choice(["always", "batch", "never"]),
    default=None,
    help="Journal fsync policy (default: the cluster's default).",
)
@click.option(
    "--snapshot-every",
    type=click.IntRange(10, 10_000_000),
    default=5000,
    show_default=True,
    help="Compact the Raft log every N entries (small: lagging nodes catch up by snapshot).",
)
@click.option(
    "--queue-disconnected-timeout-ms",
    "queue_disconnected_timeout_ms",
    type=click.IntRange(0, 3_600_000),
    default=None,
    help="The queues' disconnected timeout (default: the machine's). Short (e.g. 1000): a "
    "paused or cut-off node's consumers lose their messages while it may still deliver them.",
)
@click.option(
    "--backlog",
    type=click.IntRange(1, MESSAGES_MAX),
    default=None,
    help="A standing backlog of N messages in a queue of its own, published before the faults "
    "and drained after them through every node in turn, each body checked byte for byte "
    "(at machine v4, the default, the bodies live only in the journal's live entries).",
)
@click.option(
    "--backlog-body",
    type=click.IntRange(BODY_BYTES_MIN, BODY_BYTES_MAX),
    default=1024,
    show_default=True,
    help="Bytes per backlog message.",
)
@click.option(
    "--machine-version",
    type=click.IntRange(1, max(fifo.UNRELEASED_VERSIONS or (fifo.LATEST_VERSION,))),
    default=None,
    help="The nodes' machine version cap (default: the newest released); the run waits until "
    "the cluster applies it. An unreleased version is allowed here, for these nodes only.",
)
@click.option("--keep-data", is_flag=True, help="Keep the cluster data dir under /tmp.")
@click.option(
    "--tls",
    is_flag=True,
    help="tls = true: peer and client traffic over TLS (the certificates made in the data dir).",
)
@click.option(
    "--netns",
    is_flag=True,
    help="Nodes in network namespaces of their own (TLS bundles), clients in another; a "
    "partition takes a node's link down. Needs root and iproute2 (cluster/chaos/netns_run.py).",
)
@click.option("--verbose", is_flag=True, help="Log fault and client events to stderr.")
def main(
    duration_s: float,
    faults: str,
    seed: int,
    out_dir: Path | None,
    as_json: bool,
    workload: str,
    partitions: int,
    members: int,
    producers: int,
    consumers: int,
    queues: int,
    rate: float,
    fsync: str | None,
    snapshot_every: int,
    queue_disconnected_timeout_ms: int | None,
    backlog: int | None,
    backlog_body: int,
    machine_version: int | None,
    keep_data: bool,
    tls: bool,
    netns: bool,
    verbose: bool,
) -> None:
    """Run one chaos experiment and check it.

    \b
    Example:
      python scripts/chaos.py --duration 60 --faults kill,pause --seed 7 --json
      python scripts/chaos.py --netns --faults kill,partition,membership --duration 120
      python scripts/chaos.py --backlog 200000 --faults kill,partition,power-loss \\
          --duration 120 --json
    """
    tokens = [] if faults.strip() in ("", "none") else [t.strip() for t in faults.split(",")]
    try:
        expand_faults(tokens)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--faults") from err
    if workload == "groups" and (why := group_workload.unavailable_reason()):
        click.echo(f"--workload groups: {why}", err=True)
        sys.exit(69)  # EX_UNAVAILABLE
    _quiet_logs(verbose)
    groups = None
    queue_names = tuple(f"chaos-{i + 1}" for i in range(queues))
    if workload == "groups":
        groups = group_workload.GroupParams(partitions=partitions, members=members)
        queue_names = groups.partition_queues()
    params = RunParams(
        duration_s=duration_s,
        faults=tuple(tokens),
        seed=seed,
        out_dir=out_dir or Path(tempfile.mkdtemp(prefix=f"quorumq-chaos-seed{seed}-")),
        fsync=fsync,  # type: ignore[arg-type]  # click.Choice checked the value
        workload=WorkloadParams(
            producers=producers,
            consumers=consumers,
            queues=queue_names,
            rate_per_s=rate,
        ),
        keep_data=keep_data,
        tls=tls,
        snapshot_every_entries=snapshot_every,
        groups=groups,
        queue_disconnected_timeout_ms=queue_disconnected_timeout_ms,
        backlog=None if backlog is None else BacklogParams(backlog, backlog_body),
        machine_version=machine_version,
    )
    report = _run_netns(params) if netns else run(params)
    click.echo(json.dumps(report, indent=2, default=str) if as_json else _summary(report))
    sys.exit(0 if report["valid"] else 1)


def _run_netns(params: RunParams) -> dict[str, Any]:
    """The run on namespaces (--netns): refused with its reason (69) where it cannot be."""
    from cluster.chaos import netns_run

    try:
        return netns_run.run(params)
    except netns_run.NetnsRefused as err:
        click.echo(f"--netns: {err}", err=True)
        sys.exit(69)  # EX_UNAVAILABLE


def _summary(report: dict[str, Any]) -> str:
    ops = report["operations"]["publish"]
    replicas = report.get("replicas") or {}
    lines = [
        f"valid: {report['valid']}",
        f"publishes: ok {ops['ok']}, failed {ops['failed']}, unknown {ops['unknown']}",
        f"lost {report['lost']}, unexpected {report['unexpected']}, "
        f"duplicated {report['duplicated']}, recovered {report['recovered']}, "
        f"late deliveries {report['late_deliveries']}",
        f"digests equal: {replicas.get('digests_equal')}, "
        f"queues empty: {replicas.get('queues_empty_on_every_replica')}",
        f"max unavailability: {report['availability']['max_unavailability_s']} s",
    ]
    for fault in report["faults"]:
        lines.append(
            f"  {fault['kind']:<17} {','.join(fault['nodes']):<9} "
            f"(leader {fault['leader']}) {fault.get('shape') or '':<11} "
            f"{fault['start_s']:7.2f}-{fault['end_s']:7.2f} s  recovery {fault['recovery_s']} s"
        )
    if report.get("groups"):
        g = report["groups"]
        lines.append(
            f"groups: double ownership {g['double_ownership_count']}, order violations "
            f"{g['order_violation_count']}, zombie overlaps {g['zombie_overlap_count']}, "
            f"crash recovery max {g['crash_recovery_max_s']} s over {len(g['crash_recovery'])} "
            "crashes"
        )
        lines.append(
            f"routing: keyed {g['keyed_publishes']}, keyless {g['keyless_publishes']}, "
            f"resends {g['resends']}; misrouted {g['routing_violation_count']}, key order "
            f"violations {g['key_order_violation_count']}, duplicated {g['duplicated_count']} "
            f"(of resent {g['resend_duplicated_count']}), lost {g['lost_count']}, "
            f"unexpected {g['unexpected_count']}"
        )
    if report.get("backlog"):
        b = report["backlog"]
        lines.append(
            f"backlog: {b['confirmed']} of {b['messages']} x {b['body_bytes']} B confirmed; "
            f"lost {b['lost']}, unexpected {b['unexpected']}, bad bodies {b['bad_bodies']}, "
            f"duplicates {b['duplicates']}; delivered per node {b['delivered_per_node']}; "
            f"snapshots installed per node {b['restored_by_snapshot']}"
        )
    lines += [f"note: {note}" for note in report["notes"]]
    lines.append(f"report: {report['files']['report']}  timeline: {report['files']['timeline']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
