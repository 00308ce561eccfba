"""Chaos-only shim, loaded by node processes the harness starts (PYTHONPATH=this dir).

Until `cluster.toml` can say where a node dials each peer (`peer_addresses`), this makes a
node dial its peers through the chaos link proxies: pysyncobj's TCPNode keeps the canonical
address as the peer's identity and only `ip`/`port` (used solely to connect) are redirected.
The table comes from the JSON file named by QUORUMQ_CHAOS_DIAL_FILE:
{"<node id>": {"<peer raft address>": "<proxy host:port>"}}; the node id is read from the
command line (`--node-id ID`). Without the variable, or for an unknown node, nothing changes.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _node_id(argv: list[str]) -> str | None:
    for index, arg in enumerate(argv):
        if arg.startswith("--node-id="):
            return arg.split("=", 1)[1]
        if arg == "--node-id" and index + 1 < len(argv):
            return argv[index + 1]
    return None


def _install(table: dict[str, str]) -> None:
    from pysyncobj.node import TCPNode

    original_ip, original_port = TCPNode.ip, TCPNode.port

    def ip(self: Any) -> Any:
        dial = table.get(self.address)
        return dial.rsplit(":", 1)[0] if dial else original_ip.fget(self)

    def port(self: Any) -> Any:
        dial = table.get(self.address)
        return int(dial.rsplit(":", 1)[1]) if dial else original_port.fget(self)

    TCPNode.ip = property(ip)
    TCPNode.port = property(port)


def _main() -> None:
    path = os.environ.get("QUORUMQ_CHAOS_DIAL_FILE")
    node = _node_id(sys.argv)
    if not path or node is None:
        return
    with open(path, encoding="utf-8") as handle:
        table = json.load(handle).get(node, {})
    if table:
        _install(table)


_main()
