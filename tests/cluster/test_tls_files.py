"""cluster/tls.py: the cluster CA and node certificates in D/tls (created once, reused, refused
when incomplete or not matching), and mutual TLS 1.3 contexts tried over real sockets."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest
from cryptography import x509

from cluster import config as cluster_config
from cluster import tls
from cluster.config import ClusterConfig
from cluster.errors import ConfigError, ConfigMissing
from cluster.launcher import LaunchRefused, init_cluster, start_cluster


def tls_cluster(data_dir: Path, nodes: int = 3) -> ClusterConfig:
    """A new data dir with tls = true and its certificates (no node started)."""
    config = init_cluster(data_dir, nodes, tls=True)
    tls.ensure_certificates(data_dir, config)
    return config


def test_tls_is_written_to_and_read_from_cluster_toml(tmp_path: Path) -> None:
    """tls = true round-trips through cluster.toml; it defaults to false and must be a bool."""
    config = init_cluster(tmp_path / "D", 1, tls=True)
    assert "tls = true" in (tmp_path / "D" / "cluster.toml").read_text()
    assert cluster_config.load(tmp_path / "D").tls is True
    plain = init_cluster(tmp_path / "P", 1)
    assert cluster_config.load(tmp_path / "P").tls is False and not plain.tls
    text = cluster_config.dumps(config).replace("tls = true", 'tls = "yes"')
    (tmp_path / "D" / "cluster.toml").write_text(text)
    with pytest.raises(ConfigError, match="'tls' must be a bool"):
        cluster_config.load(tmp_path / "D")


def test_the_first_start_creates_a_ca_and_a_certificate_per_node_with_private_keys(
    tmp_path: Path,
) -> None:
    """D/tls holds ca.crt, ca.key and n1..n3 .crt/.key; keys and the dir are the owner's only;
    each node certificate is signed by the CA, names its node and its host's IP."""
    data_dir = tmp_path / "D"
    config = tls_cluster(data_dir)
    base = data_dir / "tls"
    assert stat.S_IMODE(base.stat().st_mode) == 0o700
    names = sorted(path.name for path in base.iterdir())
    assert names == ["ca.crt", "ca.key", "n1.crt", "n1.key", "n2.crt", "n2.key", "n3.crt", "n3.key"]
    for name in names:
        mode = stat.S_IMODE((base / name).stat().st_mode)
        assert mode == (0o600 if name.endswith(".key") else 0o644), name
    ca = x509.load_pem_x509_certificate((base / "ca.crt").read_bytes())
    for node in config.nodes:
        cert = x509.load_pem_x509_certificate((base / f"{node.id}.crt").read_bytes())
        cert.verify_directly_issued_by(ca)
        common_name = cert.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)
        assert common_name[0].value == node.id
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == [node.host]


def test_a_restart_reuses_the_files_and_never_overwrites_them(tmp_path: Path) -> None:
    """A second ensure_certificates changes no byte and no mtime."""
    data_dir = tmp_path / "D"
    config = tls_cluster(data_dir)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (data_dir / "tls").iterdir()}
    tls.ensure_certificates(data_dir, config)
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (data_dir / "tls").iterdir()}
    assert after == before


def test_a_missing_file_is_refused_by_name_and_nothing_is_created(tmp_path: Path) -> None:
    """One node's key gone: ConfigMissing naming it; no new key or CA is written."""
    data_dir = tmp_path / "D"
    config = tls_cluster(data_dir)
    (data_dir / "tls" / "n2.key").unlink()
    ca_before = (data_dir / "tls" / "ca.crt").read_bytes()
    with pytest.raises(ConfigMissing, match=r"n2\.key"):
        tls.ensure_certificates(data_dir, config)
    assert not (data_dir / "tls" / "n2.key").exists()
    assert (data_dir / "tls" / "ca.crt").read_bytes() == ca_before


def test_a_missing_ca_is_refused_and_not_recreated(tmp_path: Path) -> None:
    """The CA key gone while node certificates exist: refused; no new CA would match them."""
    data_dir = tmp_path / "D"
    config = tls_cluster(data_dir)
    (data_dir / "tls" / "ca.key").unlink()
    with pytest.raises(ConfigMissing, match=r"ca\.key"):
        tls.ensure_certificates(data_dir, config)
    assert not (data_dir / "tls" / "ca.key").exists()


def test_a_member_added_later_gets_a_pair_from_the_same_ca(tmp_path: Path) -> None:
    """A node in cluster.toml with neither certificate nor key (after `member add`) gets both,
    signed by the existing CA; the other files are untouched."""
    data_dir = tmp_path / "D"
    config = tls_cluster(data_dir)
    before = {p.name: p.read_bytes() for p in (data_dir / "tls").iterdir()}
    grown = cluster_config.with_member_added(
        config, "n4", "127.0.0.1:45001", "127.0.0.1:45002", data_dir
    )
    tls.ensure_certificates(data_dir, grown)
    after = {p.name: p.read_bytes() for p in (data_dir / "tls").iterdir()}
    assert {name: after[name] for name in before} == before
    assert set(after) - set(before) == {"n4.crt", "n4.key"}
    assert stat.S_IMODE((data_dir / "tls" / "n4.key").stat().st_mode) == 0o600
    ca = x509.load_pem_x509_certificate(after["ca.crt"])
    x509.load_pem_x509_certificate(after["n4.crt"]).verify_directly_issued_by(ca)


def test_a_certificate_from_another_ca_is_refused(tmp_path: Path) -> None:
    """n1's pair replaced by another cluster's n1 pair: 'not signed by this cluster's CA'."""
    config = tls_cluster(tmp_path / "D")
    tls_cluster(tmp_path / "Other")
    for name in ("n1.crt", "n1.key"):
        shutil.copy2(tmp_path / "Other" / "tls" / name, tmp_path / "D" / "tls" / name)
    with pytest.raises(ConfigError, match="not signed by this cluster's CA"):
        tls.ensure_certificates(tmp_path / "D", config)


def test_a_key_that_is_not_the_certificates_is_refused(tmp_path: Path) -> None:
    """n1.key swapped with n2.key: the key does not belong to its certificate."""
    data_dir = tmp_path / "D"
    config = tls_cluster(data_dir)
    shutil.copy2(data_dir / "tls" / "n2.key", data_dir / "tls" / "n1.key")
    with pytest.raises(ConfigError, match=r"n1\.key does not belong to its certificate"):
        tls.ensure_certificates(data_dir, config)


def test_a_host_changed_in_cluster_toml_is_refused(tmp_path: Path) -> None:
    """A node whose host no longer matches its certificate's SAN: refused, saying so."""
    data_dir = tmp_path / "D"
    config = tls_cluster(data_dir)
    moved = dataclasses.replace(config.nodes[0], host="127.0.0.9")
    config = dataclasses.replace(config, nodes=(moved, *config.nodes[1:]))
    with pytest.raises(ConfigError, match=r"not valid for n1's host 127\.0\.0\.9"):
        tls.ensure_certificates(data_dir, config)


def test_a_private_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    """chmod 644 on a node key: refused with the chmod to run."""
    data_dir = tmp_path / "D"
    config = tls_cluster(data_dir)
    os.chmod(data_dir / "tls" / "n3.key", 0o644)
    with pytest.raises(ConfigError, match=r"readable by others.*chmod 600"):
        tls.ensure_certificates(data_dir, config)


def test_a_node_needs_only_its_own_files_and_the_ca_certificate(tmp_path: Path) -> None:
    """Without the CA key and the other nodes' files, n1's contexts still load."""
    data_dir = tmp_path / "D"
    config = tls_cluster(data_dir)
    for name in ("ca.key", "n2.crt", "n2.key", "n3.crt", "n3.key"):
        (data_dir / "tls" / name).unlink()
    contexts = tls.node_peer_contexts(data_dir, config, "n1")
    assert contexts is not None
    assert contexts.server.minimum_version == ssl.TLSVersion.TLSv1_3
    assert contexts.client.verify_mode == contexts.server.verify_mode == ssl.CERT_REQUIRED
    plain = init_cluster(tmp_path / "P", 1)
    assert tls.node_peer_contexts(tmp_path / "P", plain, "n1") is None


def _handshake(
    server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, hostname: str = "127.0.0.1"
) -> tuple[str | None, BaseException | None, BaseException | None]:
    """One TLS handshake over a real loopback connection: (client's TLS version, the
    client's error, the server's error)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)  # the serving thread ends even if the client never dials
    port = listener.getsockname()[1]
    server_error: list[BaseException] = []

    def serve() -> None:
        try:
            conn, _ = listener.accept()
            conn.settimeout(10)
            with server_ctx.wrap_socket(conn, server_side=True) as tls_conn:
                tls_conn.sendall(b"ok")
                tls_conn.recv(1)
        except (ssl.SSLError, OSError) as err:
            server_error.append(err)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    version, client_error = None, None
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            client_ctx.wrap_socket(raw, server_hostname=hostname) as conn,
        ):
            assert conn.recv(2) == b"ok"
            version = conn.version()
    except (ssl.SSLError, OSError) as err:
        client_error = err
    thread.join(10)
    listener.close()
    return version, client_error, (server_error[0] if server_error else None)


def test_two_nodes_of_one_cluster_complete_a_mutual_tls_13_handshake(tmp_path: Path) -> None:
    """n1 dialing n2 over loopback: TLS 1.3, both sides verified."""
    data_dir = tmp_path / "D"
    config = tls_cluster(data_dir)
    n1 = tls.node_peer_contexts(data_dir, config, "n1")
    n2 = tls.node_peer_contexts(data_dir, config, "n2")
    assert n1 is not None and n2 is not None
    version, client_error, server_error = _handshake(n2.server, n1.client)
    assert (version, client_error, server_error) == ("TLSv1.3", None, None)


def test_a_peer_with_a_certificate_from_another_ca_is_refused_both_ways(tmp_path: Path) -> None:
    """Another cluster's node can neither dial this one nor be dialed by it."""
    ours_config = tls_cluster(tmp_path / "D")
    other_config = tls_cluster(tmp_path / "Other")
    ours = tls.node_peer_contexts(tmp_path / "D", ours_config, "n1")
    other = tls.node_peer_contexts(tmp_path / "Other", other_config, "n2")
    assert ours is not None and other is not None
    _, _, server_error = _handshake(ours.server, other.client)
    assert isinstance(server_error, ssl.SSLError)
    _, client_error, _ = _handshake(other.server, ours.client)
    assert isinstance(client_error, ssl.SSLCertVerificationError)


def test_a_peer_without_a_client_certificate_is_refused(tmp_path: Path) -> None:
    """A TLS client that presents no certificate (but trusts the CA) is refused by the node."""
    data_dir = tmp_path / "D"
    config = tls_cluster(data_dir)
    node = tls.node_peer_contexts(data_dir, config, "n1")
    assert node is not None
    anonymous = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    anonymous.load_verify_locations(cafile=data_dir / "tls" / "ca.crt")
    _, _, server_error = _handshake(node.server, anonymous)
    assert isinstance(server_error, ssl.SSLError) and "certificate" in str(server_error).lower()


def test_tls_12_is_refused(tmp_path: Path) -> None:
    """A peer that offers at most TLS 1.2 cannot connect."""
    data_dir = tmp_path / "D"
    config = tls_cluster(data_dir)
    node = tls.node_peer_contexts(data_dir, config, "n1")
    dialer = tls.node_peer_contexts(data_dir, config, "n2")
    assert node is not None and dialer is not None
    dialer.client.maximum_version = ssl.TLSVersion.TLSv1_2
    dialer.client.minimum_version = ssl.TLSVersion.TLSv1_2
    _, _, server_error = _handshake(node.server, dialer.client)
    assert isinstance(server_error, ssl.SSLError)


def test_starting_tls_on_an_existing_plain_cluster_with_the_flag_is_refused(
    tmp_path: Path,
) -> None:
    """`cluster start --tls` on a data dir created without TLS says to edit cluster.toml."""
    init_cluster(tmp_path / "D", 1)
    with pytest.raises(LaunchRefused, match="tls = true"):
        start_cluster(tmp_path / "D", 1, tls=True)
    assert not (tmp_path / "D" / "tls").exists()
