"""Machine versions through the log: gated upgrades, refusal, older code stops applying."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import fifo
from cluster import protocol
from cluster.errors import ProtocolError
from cluster.launcher import start_cluster, wait_until
from fifo.commands import DeclareQueue, Enqueue
from fifo.replies import Ok

pytestmark = pytest.mark.cluster


def test_upgrade_waits_for_every_member_then_switches_everywhere(tmp_path: Path) -> None:
    """With n3 capped at v1 the upgrade is refused; after n3 restarts with v2 it happens."""
    cluster = start_cluster(tmp_path / "D", 3, caps={"n3": 1})
    try:
        cluster.leader()
        client = cluster.raw_client("n1")  # not n3, which is restarted below (it may lead)
        client.command(DeclareQueue("up"))
        wait_until(lambda: client.query("machine")["supported"].get("n3") == 1, 10, "hellos")
        with pytest.raises(ProtocolError) as info:
            client.admin("machine_upgrade", to=2)
        assert info.value.code == protocol.REFUSED and "n3 supports 1" in info.value.message
        assert client.query("machine")["effective_version"] == 1
        assert client.command(Enqueue("up", b"v1 message")) == Ok()

        cluster.restart("n3", max_machine_version=2)

        def switched() -> Any:
            try:
                machine = client.query("machine")
            except ProtocolError as err:  # n3 may have led: n1 refuses reads until a new leader
                if err.code != protocol.UNAVAILABLE:
                    raise
                return None
            return machine if machine["effective_version"] == 2 else None

        machine = wait_until(switched, 15, "v2")
        assert [s["version"] for s in machine["switches"]] == [2]
        statuses = cluster.converged()
        assert {s["effective_machine_version"] for s in statuses.values() if s} == {2}
        assert client.query("overview", queue="up")["total"] == 1
        client.close()
    finally:
        cluster.stop()


def test_a_node_with_older_code_stops_applying_and_never_leads(tmp_path: Path) -> None:
    """After the switch to the latest version, a node restarted with v1 code stops and says why;
    the rest go on."""
    cluster = start_cluster(tmp_path / "D", 3)
    try:
        leader = cluster.leader()
        client = cluster.raw_client(leader)
        latest = fifo.LATEST_VERSION
        wait_until(lambda: client.query("machine")["effective_version"] == latest, 10, "latest")
        client.command(DeclareQueue("old"))
        stale = next(n for n in ("n1", "n2", "n3") if n != leader)
        cluster.restart(stale, max_machine_version=1)

        def stopped() -> dict[str, object] | None:
            status = cluster.statuses()[stale]
            return status if status and status["role"] == "stopped" else None

        status = wait_until(stopped, 15, "the stale node to stop")
        assert "supports only up to 1" in str(status["reason"])
        assert client.command(Enqueue("old", b"still works")) == Ok()
        cluster.kill(leader)  # the stale node must not take over
        survivor = next(n for n in ("n1", "n2", "n3") if n not in (leader, stale))
        cluster.start_node(leader)
        new_leader = cluster.leader()  # (leader(20) passed 20 as `exclude`)
        assert new_leader in (leader, survivor)
        assert cluster.statuses()[stale]["role"] == "stopped"  # type: ignore[index]
        client.close()
    finally:
        cluster.stop()
