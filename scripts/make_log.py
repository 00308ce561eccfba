"""Generate a realistic `quorumq log export` file of a given size from a seeded workload.

The workload runs through the replicated machine exactly as a node applies entries (see
`pipeline/workload.py`): independent services, each a work queue dead-lettering into its own DLQ
(every third one single-active-consumer), publishers, consumers that ack / return / reject /
time out, consumer churn and dropped connections. Same seed and size, same file. Prints JSON.
The default is the newest released version (v4: bodies stay in the log); an unreleased one
needs QUORUMQ_ALLOW_UNRELEASED_MACHINE=1, as a node does.

    python scripts/make_log.py --mib 64 --seed 1 --services 8 --out /tmp/qq-64.log
    python scripts/make_log.py --mib 1 --machine-version 3 --out /tmp/qq-v3.log
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

import fifo
from pipeline.workload import check_machine_version, write_log

UNRELEASED_FLAG = "QUORUMQ_ALLOW_UNRELEASED_MACHINE"  # as cluster.node.server's


def main(argv: list[str] | None = None) -> None:
    """Write the log and print what was written."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, required=True, help="target size in MiB")
    parser.add_argument("--seed", type=int, default=1, help="workload seed")
    parser.add_argument("--services", type=int, default=8, help="independent queue groups")
    parser.add_argument("--out", type=Path, required=True, help="the log file to write")
    parser.add_argument(
        "--machine-version", type=int, default=fifo.LATEST_VERSION,
        help=f"the machine version the cluster upgrades to (default {fifo.LATEST_VERSION})",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.mib <= 0 or args.services < 1:
        parser.error("--mib must be positive and --services at least 1")
    try:
        check_machine_version(args.machine_version)
    except ValueError as err:
        parser.error(str(err))
    if args.machine_version in fifo.UNRELEASED_VERSIONS and os.environ.get(UNRELEASED_FLAG) != "1":
        parser.error(
            f"machine version {args.machine_version} is unreleased: set {UNRELEASED_FLAG}=1"
        )
    stats = write_log(
        args.out, int(args.mib * 1024 * 1024), args.seed, args.services, args.machine_version
    )
    print(json.dumps(dataclasses.asdict(stats), indent=2))


if __name__ == "__main__":
    main()
