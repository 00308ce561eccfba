"""Elections are visible (issue 34): every role change is one `role_changed` line in node.log
with its cause, and counted in /metrics. Real node processes; the leader is killed."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from cluster.launcher import free_port_run, free_ports, start_cluster, wait_until

pytestmark = pytest.mark.cluster


def _role_changes(log_file: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log_file.read_text().splitlines() if line.strip()]
    return [line for line in lines if line.get("event") == "role_changed"]


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return str(answer.read().decode())


def _counter(text: str, name: str, labels: str = "") -> float:
    found = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_a_killed_leader_is_replaced_and_every_role_change_is_logged_with_its_cause_and_counted(
    tmp_path: Path,
) -> None:
    metrics_base = free_port_run(3)
    with start_cluster(tmp_path / "D", nodes=3, metrics_base_port=metrics_base) as cluster:
        old = cluster.leader()
        won = _role_changes(cluster.config.node(old).data_dir / "node.log")
        assert [(c["old"], c["new"]) for c in won][-1] == ("candidate", "leader"), won
        assert won[-1]["cause"] == f"won the election of term {won[-1]['term']}"
        cluster.kill(old)
        new = cluster.leader(exclude=old)
        node = cluster.config.node(new)
        changes = wait_until(
            lambda: (lambda c: c if c and c[-1]["new"] == "leader" else None)(
                _role_changes(node.data_dir / "node.log")
            ),
            10,
            "the new leader's role_changed line",
        )
        stood = [c for c in changes if c["new"] == "candidate"]
        assert stood and stood[-1]["cause"].startswith("election timeout: no leader heard from")
        assert changes[-1]["term"] > won[-1]["term"] and changes[-1]["node"] == new
        text = _scrape(node.metrics_port or 0)
        leader = '{from="candidate",to="leader"}'
        candidate = '{from="follower",to="candidate"}'
        assert _counter(text, "quorumq_raft_role_changes_total", leader) == 1, text
        assert _counter(text, "quorumq_raft_role_changes_total", candidate) >= 1, text
        assert _counter(text, "quorumq_raft_elections_total") >= 1, text


def test_local_ports_come_from_below_the_ephemeral_range() -> None:
    # a port from bind(0) is ephemeral: an outgoing connection could take it before the node
    # bound it ("address already in use" at start, twice in two full runs)
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [*free_ports(20), free_port_run(3)]
    assert all(port < low for port in ports) and len(set(ports)) == len(ports)
