"""`quorumq cluster init --hosts`: a bundle per node holding only its own secrets, a client
bundle that is enough to connect over TLS, `node start --bundle`, clear errors."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from cluster.bundles import HostListError, HostSpec, add_node_bundle, parse_hosts
from cluster.launcher import wait_until

QUORUMQ = [sys.executable, "-m", "cluster.cli"]
# three addresses and one port, like 3 machines; the first by name (its certificate names it)
HOSTS = ("localhost", "127.0.0.2", "127.0.0.3")


def _cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QUORUMQ, *args], capture_output=True, text=True, timeout=60, cwd=cwd,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def _private_keys(directory: Path) -> dict[Path, bytes]:
    """Every PEM private key under `directory` -> its public key (DER)."""
    found = {}
    for path in directory.rglob("*"):
        if path.is_file() and b"PRIVATE KEY" in path.read_bytes():
            key = serialization.load_pem_private_key(path.read_bytes(), None)
            found[path] = key.public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            )
    return found


@pytest.mark.parametrize(
    ("hosts", "says"),
    [
        ("a,,b", "empty item"),
        ("a:0", "from 1 to 65534"),
        ("a:http", "from 1 to 65534"),
        ("fe80::1", "IPv6 addresses are not supported"),
        ("[fd00::3]:7000", "IPv6 addresses are not supported"),
        ("a:5701,a:5702", "ports at least 2 apart"),
        ("under_score", "neither an IP address nor a host name"),
        ("300.1.1.1", "not a valid IPv4 address"),
        (",".join(f"h{i}" for i in range(16)), "at most 15"),
    ],
)
def test_bad_host_lists_are_refused_with_the_reason(hosts: str, says: str) -> None:
    """Each malformed --hosts list raises HostListError naming what is wrong."""
    with pytest.raises(HostListError, match=says):
        parse_hosts(hosts)


def test_host_forms_parse_to_client_and_peer_ports() -> None:
    """Names and IPv4 addresses, with and without ports; the peer port is port + 1."""
    specs = parse_hosts("DB1.example.com, 10.0.0.2:6000,10.0.0.3")
    assert specs == [
        HostSpec("db1.example.com", 5701),
        HostSpec("10.0.0.2", 6000),
        HostSpec("10.0.0.3", 5701),
    ]
    assert specs[1].raft_port == 6001


def test_cli_init_refuses_a_bad_list_and_a_used_dir_before_writing(tmp_path: Path) -> None:
    """Exit 64 for a bad list (nothing written), 73 for an --out dir that holds files."""
    bad = _cli("cluster", "init", "--hosts", "a,,b", "--out", str(tmp_path / "x"))
    assert bad.returncode == 64 and "empty item" in bad.stderr
    assert not (tmp_path / "x").exists()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "file").write_text("mine")
    used = _cli("cluster", "init", "--hosts", "a,b,c", "--out", str(tmp_path / "used"))
    assert used.returncode == 73 and "not an empty directory" in used.stderr


def test_a_node_bundle_holds_only_its_own_key_and_no_ca_key(tmp_path: Path) -> None:
    """Of every private key `init` wrote (the CA's, each node's), n1's bundle holds only n1's;
    its certificate names its host; the client bundle holds no private key at all; a bundle
    issued later by add-host likewise."""
    out = tmp_path / "out"
    made = _cli(
        "cluster", "init", "--hosts", "10.0.0.1,db2.example.com,10.0.0.3", "--out", str(out)
    )
    assert made.returncode == 0, made.stderr
    add_node_bundle(out, HostSpec("10.0.0.4"))
    every_key = _private_keys(out)
    assert len(every_key) == 5  # the CA's and four nodes'
    for index, host in enumerate(["10.0.0.1", "db2.example.com", "10.0.0.3", "10.0.0.4"], 1):
        bundle = out / f"n{index}"
        held = _private_keys(bundle)
        assert list(held) == [bundle / "tls" / f"n{index}.key"]
        cert = x509.load_pem_x509_certificate((bundle / "tls" / f"n{index}.crt").read_bytes())
        assert cert.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        ) == next(iter(held.values()))
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert [str(name.value) for name in names] == [host]
        assert not (bundle / "tls" / "ca.key").exists()
        assert (bundle / "node").read_text().strip() == f"n{index}"
    assert _private_keys(out / "client") == {}
    assert sorted(p.name for p in (out / "client").iterdir()) == [
        "ca.crt", "client.env", "client.key", "endpoints"
    ]  # fmt: skip


def test_node_start_refuses_a_bundle_with_the_ca_key_or_of_another_node(tmp_path: Path) -> None:
    """`node start --bundle` exits 78 when the bundle holds the CA key, 64 for another id."""
    out = tmp_path / "out"
    assert (
        _cli(
            "cluster", "init", "--hosts", "10.0.0.1,10.0.0.2,10.0.0.3", "--out", str(out)
        ).returncode
        == 0
    )
    other = _cli("node", "start", "n2", "--bundle", str(out / "n1"))
    assert other.returncode == 64 and "n1's bundle, not n2's" in other.stderr
    shutil.copy2(out / "authority" / "ca.key", out / "n1" / "tls" / "ca.key")
    leaked = _cli("node", "start", "--bundle", str(out / "n1"))
    assert leaked.returncode == 78 and "holds the CA key" in leaked.stderr


def _free_port_on_every_host() -> int:
    """A port p with p and p + 1 free on each of HOSTS (tried in a small range)."""
    for port in range(20_000 + os.getpid() * 2 % 40_000, 65_000, 2):
        try:
            socks = []
            for host in HOSTS:
                for candidate in (port, port + 1):
                    sock = socket.socket()
                    socks.append(sock)
                    sock.bind((host, candidate))
            return port
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise AssertionError("no free port pair on the three loopback addresses")


@pytest.fixture
def bundle_nodes(tmp_path: Path) -> Iterator[Path]:
    """Three nodes started by `node start --bundle` on 127.0.0.1-3 (one port); the out dir."""
    port = _free_port_on_every_host()
    out = tmp_path / "out"
    hosts = ",".join(f"{host}:{port}" for host in HOSTS)
    made = _cli("cluster", "init", "--hosts", hosts, "--out", str(out))
    assert made.returncode == 0, made.stderr
    processes = []
    try:
        for index in (1, 2, 3):
            bundle = tmp_path / f"host{index}"  # as if copied to its machine
            shutil.copytree(out / f"n{index}", bundle, symlinks=True)
            processes.append(subprocess.Popen(
                [*QUORUMQ, "node", "start", "--bundle", str(bundle)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=(bundle / "stderr.log").open("wb"), start_new_session=True,
            ))  # fmt: skip
        yield out
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


@pytest.mark.cluster
def test_a_client_with_only_the_client_bundle_uses_the_cluster_over_tls(
    bundle_nodes: Path, tmp_path: Path
) -> None:
    """Three bundle nodes (localhost, 127.0.0.2, 127.0.0.3) elect a leader; from a copy of the
    client bundle alone (its client.env), the CLI declares, publishes, consumes and sees equal
    digests; the same without the CA is refused (78), so the connection was TLS."""
    client_dir = tmp_path / "client-host"
    shutil.copytree(bundle_nodes / "client", client_dir)
    env = dict(line.split("=", 1) for line in (client_dir / "client.env").read_text().splitlines())

    def status() -> list[dict[str, object]] | None:
        done = _cli("-o", "json", "cluster", "status", cwd=client_dir, env=env)
        rows: list[dict[str, object]] = json.loads(done.stdout) if done.returncode == 0 else []
        leaders = {row.get("leader") for row in rows}
        return rows if len(rows) == 3 and len(leaders) == 1 and None not in leaders else None

    wait_until(status, 30.0, "a leader all three bundle nodes agree on")
    assert _cli("queue", "declare", "jobs", cwd=client_dir, env=env).returncode == 0
    published = _cli("publish", "jobs", "--count", "50", cwd=client_dir, env=env)
    assert published.returncode == 0, published.stderr
    consumed = _cli("-o", "jsonl", "consume", "jobs", "--count", "50", cwd=client_dir, env=env)
    assert consumed.returncode == 0, consumed.stderr
    assert len(consumed.stdout.splitlines()) == 50
    rows = wait_until(
        lambda: r if (r := status()) and len({row["digest"] for row in r}) == 1 else None,
        15.0,
        "equal digests",
    )
    assert all(row["role"] in ("leader", "follower") for row in rows)
    plain = _cli("queue", "list", cwd=client_dir, env={**env, "QUORUMQ_TLS_CA": ""})
    assert plain.returncode == 78 and "speaks TLS" in plain.stderr


def test_add_host_refuses_a_clash_and_a_dir_init_did_not_write(tmp_path: Path) -> None:
    """`cluster add-host`: 64 for ports a member holds on that host, 78 for an --out without
    an authority; a good one prints the `member add` to run next."""
    out = tmp_path / "out"
    assert (
        _cli(
            "cluster", "init", "--hosts", "10.0.0.1,10.0.0.2,10.0.0.3", "--out", str(out)
        ).returncode
        == 0
    )
    clash = _cli("cluster", "add-host", "10.0.0.2:5702", "--out", str(out))
    assert clash.returncode == 64 and "clashes with n2" in clash.stderr
    (tmp_path / "other").mkdir()
    stray = _cli("cluster", "add-host", "10.0.0.4", "--out", str(tmp_path / "other"))
    assert stray.returncode == 78 and "cluster init" in stray.stderr
    added = _cli("cluster", "add-host", "10.0.0.4", "--out", str(out))
    assert added.returncode == 0, added.stderr
    assert (
        "member add n4 --raft-address 10.0.0.4:5702 --client-address 10.0.0.4:5701" in added.stdout
    )
