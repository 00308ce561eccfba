"""A leader added by `member add` is found by clients that know only the old nodes' endpoints.

The old nodes loaded their cluster.toml before n4 existed: they know its address only from the
replicated member set (the `member add` change recorded it). They must name the leader by that
address (welcome, status `leader_address`, the not-leader refusal), and the client library and
the CLI must follow it.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from click.testing import CliRunner

from cluster.cli import common
from cluster.cli import member as member_cli
from cluster.cli.exits import CliError
from cluster.cli.main import cli
from cluster.client import AsyncClient, Client
from cluster.launcher import LocalCluster, free_ports, start_cluster, wait_until
from cluster.tls import node_files, tls_dir

pytestmark = pytest.mark.cluster

OLD = ("n1", "n2", "n3")
QUEUE = "after-add"


@pytest.fixture(params=[False, True], ids=["plain", "tls"])
def old3(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalCluster]:
    """n1..n3 on loopback, without and with TLS (the redirect must pass the CA and host check)."""
    cluster = start_cluster(tmp_path / "D", nodes=3, tls=request.param)
    try:
        yield cluster
    finally:
        cluster.stop()


def cli_with_endpoints(
    endpoints: list[str], credentials: Path, ca: Path | None, *args: str
) -> tuple[int, str]:
    """Run the CLI with --endpoints (no data dir): (exit code, output and error message)."""
    root = ["--endpoints", ",".join(endpoints), "--credentials", str(credentials)]
    root += ["--tls-ca", str(ca)] if ca is not None else []
    result = CliRunner().invoke(cli, [*root, *args], standalone_mode=False)
    if isinstance(result.exception, CliError):
        return result.exception.exit_code, result.output + str(result.exception)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def n4_ports_ranking_last(cluster: LocalCluster) -> tuple[str, str]:
    """Raft and client addresses for n4, its raft address above the others' as strings
    (pysyncobj hands leadership, among equally caught-up followers, to the highest address):
    a free port among 9999 down to 9000, which sort above any 5-digit port."""
    highest = max(cluster.config.node(n).raft_address for n in OLD)
    (client_port,) = free_ports(1)
    for port in range(9999, 8999, -1):
        raft = f"127.0.0.1:{port}"
        if raft <= highest or port == client_port:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return raft, f"127.0.0.1:{client_port}"
    raise AssertionError(f"no free port ranking above {highest}")


async def publish_async(endpoints: list[str], key: bytes, ca: Path | None) -> str | None:
    """Publish 20 messages with confirms through an AsyncClient; the node it ended up on."""
    async with AsyncClient(endpoints, key, request_timeout_s=10.0, tls=ca) as client:
        node = client.node
        publisher = client.publisher(QUEUE)
        for number in range(20):
            await publisher.publish(b"a%d" % number)
        await publisher.wait_for_confirms(10.0)
    return node


def n4_leads(cluster: LocalCluster) -> bool:
    """True once n4 leads; else ask the leader to hand leadership over (a leader asked to
    remove itself does that, and removes nothing)."""
    leader = cluster.leader()
    if leader == "n4":
        return True
    raw = cluster.raw_client(leader)
    try:
        raw.admin("member_remove", node=leader, force=True)
    finally:
        raw.close()
    return False


def test_clients_given_only_the_old_endpoints_reach_a_leader_added_later(
    old3: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n4 added and made leader: the old nodes name its address (status, refusal); a client
    with only n1..n3's endpoints (threaded and asyncio) moves to it (prefer_leader) and
    publishes with confirms; `member remove` with only those endpoints (following a refusal)
    and `member add` with a data dir whose cluster.toml predates n4 reach it and commit."""
    stale = tmp_path / "stale"  # an operator's data dir from before n4: key, config, CA
    stale.mkdir()
    for name in ("cluster.toml", "client.key"):
        shutil.copy2(old3.data_dir / name, stale / name)
    if old3.config.tls:
        shutil.copytree(tls_dir(old3.data_dir), tls_dir(stale))
    raft, client_address = n4_ports_ranking_last(old3)
    ca = node_files(old3.data_dir, "n1").ca_cert if old3.config.tls else None
    result = CliRunner().invoke(
        cli,
        ["--data-dir", str(old3.data_dir), "member", "add", "n4",
         "--raft-address", raft, "--client-address", client_address],
        standalone_mode=False,
    )  # fmt: skip
    assert result.exception is None, result.output
    old3.reload()
    old3.start_node("n4")
    wait_until(lambda: len(old3.converged(timeout_s=30)) == 4, 60, "n4 caught up")
    wait_until(lambda: n4_leads(old3), 60, "n4 leading")
    old = [old3.config.node(n).client_address for n in OLD]

    raw = old3.raw_client("n1")
    try:
        assert raw.query("status")["leader_address"] == client_address
        refusal = raw.admin("member_remove", node="n3")
    finally:
        raw.close()
    assert refusal["changed"] is False and refusal["leader"] == "n4", refusal
    assert refusal["leader_address"] == client_address, refusal

    with Client(old, old3.key, prefer_leader=True, request_timeout_s=10.0, tls=ca) as client:
        assert client.node == "n4"
        client.declare_queue(QUEUE)
        publisher = client.publisher(QUEUE)
        for number in range(20):
            publisher.publish(b"m%d" % number)
        publisher.wait_for_confirms(10.0)
    assert asyncio.run(publish_async(old, old3.key, ca)) == "n4"

    # the CLI's client kept on n1 (as when n1 named no leader yet): it follows n1's refusal
    monkeypatch.setattr(member_cli, "connect", partial(common.connect, prefer_leader=False))
    code, out = cli_with_endpoints(old, stale / "client.key", ca, "member", "remove", "n3")
    assert code == 0, out
    statuses = old3.statuses()
    assert statuses["n4"] is not None and statuses["n4"]["members"] == ["n1", "n2", "n4"]

    # a data dir whose cluster.toml predates n4: the leader's address comes from a node's status
    raft_port, client_port = free_ports(2)
    n5 = [f"--raft-address=127.0.0.1:{raft_port}", f"--client-address=127.0.0.1:{client_port}"]
    result = CliRunner().invoke(
        cli,
        ["--data-dir", str(stale), "member", "add", "n5", *n5],
        standalone_mode=False,
    )  # fmt: skip
    assert result.exception is None, f"{result.output}{result.exception}"
    wait_until(lambda: "n5" in (old3.statuses()["n4"] or {}).get("members", ()), 30, "n5")
