"""Raft transport benchmark: pysyncobj's transport against quorumq's, alternating, same run.

Each repetition starts a fresh 3-node cluster with each transport in turn (the nodes inherit
QUORUMQ_RAFT_TRANSPORT), and measures with `scripts/bench_cluster.py`'s phases: one-at-a-time
confirmed publish (p50 / p99) and confirmed publish at window 100 and 1000. Prints JSON (medians
per transport and the ratios quorumq / pysyncobj) and writes `bench_transport.json` into --out
(default: a fresh temp dir). Example: `python scripts/bench_transport.py --reps 3`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cluster import publish_latency, publish_rate

from cluster.launcher import local_cluster
from raft.node import TRANSPORT_ENV, TRANSPORTS


def one_run(transport: str, args: argparse.Namespace) -> dict[str, Any]:
    """A fresh cluster with `transport`: latency, then window 100 and 1000."""
    os.environ[TRANSPORT_ENV] = transport
    with (
        tempfile.TemporaryDirectory(prefix="qq-bench-transport-") as tmp,
        local_cluster(Path(tmp) / "D", 3, fsync=args.fsync) as cluster,
    ):
        leader = cluster.leader()
        with cluster.client(leader) as client:
            latency = publish_latency(client, "latency", args.latency_messages)
            w100 = publish_rate(client, "w100", args.messages, 100)
            w1000 = publish_rate(client, "w1000", args.messages * 2, 1000)
    return {
        "p50_ms": latency["p50_ms"],
        "p99_ms": latency["p99_ms"],
        "window_100_msg_per_s": w100["msg_per_s"],
        "window_1000_msg_per_s": w1000["msg_per_s"],
    }


def main() -> None:
    """Parse flags, alternate the transports, print and save the results."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--messages", type=int, default=10_000, help="Messages at window 100.")
    parser.add_argument("--latency-messages", type=int, default=1000)
    parser.add_argument("--fsync", choices=["always", "batch", "never"], default="batch")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in TRANSPORTS}
    for rep in range(args.reps):
        order = TRANSPORTS if rep % 2 == 0 else tuple(reversed(TRANSPORTS))
        for name in order:
            runs[name].append(one_run(name, args))
            print(f"rep {rep} {name}: {runs[name][-1]}", file=sys.stderr)
    medians = {
        name: {key: statistics.median(r[key] for r in results) for key in results[0]}
        for name, results in runs.items()
    }
    new, old = medians["quorumq"], medians["pysyncobj"]
    results = {
        "runs": runs,
        "medians": medians,
        "quorumq_over_pysyncobj": {key: round(new[key] / old[key], 3) for key in new},
        "config": {"reps": args.reps, "fsync": args.fsync, "load": os.getloadavg()},
    }
    out = args.out or Path(tempfile.mkdtemp(prefix="quorumq-bench-")) / "bench_transport.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {out}", file=sys.stderr)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
