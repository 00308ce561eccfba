"""A program holding a `local_cluster` that is stopped with SIGTERM stops its nodes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.launcher import wait_until

PROGRAM = """
import sys, time
from pathlib import Path
from cluster.launcher import local_cluster
with local_cluster(Path(sys.argv[1]), 1) as cluster:
    cluster.leader()
    print(" ".join(str(p.pid) for p in cluster.procs.values()), flush=True)
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is gone for our purpose
        return stat.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.timeout(120)
def test_a_program_stopped_with_sigterm_stops_the_nodes_of_its_local_cluster(
    tmp_path: Path,
) -> None:
    """A benchmark stopped with `kill` (SIGTERM) left its three nodes running for half an hour,
    holding their ports (RabbitMQ's benchmark cluster then failed to start on one). While a
    `local_cluster` is open, SIGTERM (if the program does not handle it) exits through the
    `with` block, which stops the nodes."""
    program = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, str(tmp_path / "D")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert program.stdout is not None
    pids = [int(pid) for pid in program.stdout.readline().split()]
    try:
        assert pids and all(_alive(pid) for pid in pids)
        program.send_signal(signal.SIGTERM)
        assert program.wait(timeout=60) == 128 + signal.SIGTERM
        wait_until(lambda: not any(_alive(pid) for pid in pids), 30, "the nodes to stop")
    finally:
        program.kill()
        for pid in pids:  # (a failed run must not leave them either)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
