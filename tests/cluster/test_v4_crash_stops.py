"""Real node processes running machine v4: a command whose handler raises (a bug) stops applying
on every node at that entry, each saying so (index, traceback) in its log and status, with equal
digests: the state never forks. The bug is planted in the node processes only, through a
`sitecustomize` module on their PYTHONPATH (test-only; no hook in the product)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cluster.launcher import start_cluster, wait_until
from fifo.commands import DeclareQueue, Enqueue, Purge
from fifo.replies import Ok

pytestmark = pytest.mark.cluster

MARKER_QUEUE = "crash-marker"
PLANT = textwrap.dedent(f'''
    """Test-only: machine v4's Purge raises on the queue {MARKER_QUEUE!r} (a planted bug)."""
    import fifo
    from fifo.commands import Purge

    _handlers = fifo.machine_for(4).queue_handlers
    _real_purge = _handlers[Purge]

    def _purge(ctx, queue, cmd):
        if queue.name == {MARKER_QUEUE!r}:
            raise RuntimeError("planted crash")
        return _real_purge(ctx, queue, cmd)

    _handlers[Purge] = _purge
''')


def test_a_raising_v4_handler_stops_every_node_at_that_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Purge entry is never applied past: every node is `stopped` with the entry index and
    the error in `reason`, the traceback in its status and log, and the same digest."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(PLANT)
    monkeypatch.setenv("PYTHONPATH", str(hook))
    cluster = start_cluster(tmp_path / "D", 3)
    try:
        client = cluster.raw_client(cluster.leader())
        wait_until(lambda: client.query("machine")["effective_version"] == 4, 30, "machine v4")
        assert client.command(DeclareQueue(MARKER_QUEUE)) is not None
        assert client.command(Enqueue(MARKER_QUEUE, b"kept")) == Ok()
        assert client.command(Purge("other")) is not None  # an unknown queue: no crash
        client.sock.settimeout(3)
        with pytest.raises(OSError):  # the reply never comes: no node applies the entry
            client.command(Purge(MARKER_QUEUE))
        client.close()

        def all_stopped() -> dict[str, Any] | None:
            statuses = cluster.statuses()
            stopped = all(s is not None and s["role"] == "stopped" for s in statuses.values())
            return statuses if stopped else None

        statuses = wait_until(all_stopped, 30, "every node to stop")
        reasons = {s["reason"] for s in statuses.values() if s is not None}
        assert len(reasons) == 1, reasons  # the same entry everywhere
        reason = reasons.pop()
        assert reason.startswith("applying entry ") and "RuntimeError('planted crash')" in reason
        index = reason.split()[2]
        for status in statuses.values():
            assert status is not None and "planted crash" in status["traceback"]
        digests = cluster_status_digests(tmp_path / "D")
        assert len(set(digests.values())) == 1, digests  # no fork
        for node in cluster.config.nodes:
            logged = (node.data_dir / "stderr.log").read_text() + (
                node.data_dir / "stdout.log").read_text()  # fmt: skip
            assert "apply_crashed" in logged and index in logged and "Traceback" in logged
    finally:
        cluster.stop()


def cluster_status_digests(data_dir: Path) -> dict[str, str]:
    """`quorumq cluster status --digest` (JSON): each node's digest, with its reason shown."""
    result = subprocess.run(
        [sys.executable, "-m", "cluster.cli", "-o", "json", "cluster", "status",
         "--data-dir", str(data_dir), "--digest"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    rows = json.loads(result.stdout)
    assert all("applying entry" in str(row.get("reason")) for row in rows), rows
    assert all(row.get("digest") for row in rows), rows
    return {row["id"]: row["digest"] for row in rows}
