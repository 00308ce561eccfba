"""`python -m cluster.node --data-dir D --node-id ID [--max-machine-version N]
[--metrics-port P [--metrics-bind ADDR]]` (foreground)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cluster.node.server import run_node


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and run the node."""
    parser = argparse.ArgumentParser(prog="python -m cluster.node", description=__doc__)
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--max-machine-version", type=int, default=None)
    parser.add_argument("--metrics-port", type=int, default=None)
    parser.add_argument("--metrics-bind", default=None)
    args = parser.parse_args(argv)
    return run_node(
        args.data_dir, args.node_id, args.max_machine_version, args.metrics_port, args.metrics_bind
    )


if __name__ == "__main__":
    sys.exit(main())
