"""TLS for the peer (Raft) and client traffic: the cluster CA, a certificate per node, contexts.

With `tls = true` in cluster.toml, `quorumq cluster start` creates `D/tls/` (0700) holding
`ca.crt`, `ca.key` (the cluster CA, EC P-256, self-signed) and `<node>.crt` / `<node>.key` for
each node (signed by the CA, subject CN = node id, a SAN for the node's host or IP, usable as
TLS server and client). Private keys are 0600. Existing files are reused, never overwritten; a
member with neither certificate nor key (added by `member add`) gets a pair from the CA; a set
that is otherwise incomplete or does not match cluster.toml is refused with the reason.

The contexts are mutual TLS 1.3: each side presents its node certificate and requires one
signed by the cluster CA. They are passed down to raft/ as plain `ssl.SSLContext` objects.
TLS gives confidentiality on the wire; peers still authenticate with the cluster secret
(the HMAC challenge-response of raft/transport.py) inside the TLS session.

The client port uses the same node certificate as a plain TLS server (1.2 at least, no client
certificate): clients verify it against `ca.crt` and authenticate with their client key inside
TLS (cluster/client/tls.py, cluster/node/client_tls.py).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cluster.config import ClusterConfig, NodeConfig
from cluster.errors import ConfigError, ConfigMissing
from raft.storage import fsync_dir

TLS_DIR = "tls"
CA_CERT_FILE = "ca.crt"
CA_KEY_FILE = "ca.key"
CA_VALIDITY_DAYS = 3650
NODE_VALIDITY_DAYS = 3650
CLOCK_SKEW_S = 300  # certificates are valid from 5 minutes before their creation
KEY_MODE = 0o600
DIR_MODE = 0o700


@dataclass(frozen=True, slots=True)
class NodeTlsFiles:
    """Where one node's TLS files are: the cluster CA certificate, its certificate and key."""

    ca_cert: Path
    cert: Path
    key: Path


def tls_dir(data_dir: Path) -> Path:
    """The TLS dir of a cluster data dir."""
    return Path(data_dir) / TLS_DIR


def node_files(data_dir: Path, node_id: str) -> NodeTlsFiles:
    """The paths of `node_id`'s TLS files in the data dir (they may not exist)."""
    base = tls_dir(data_dir)
    return NodeTlsFiles(base / CA_CERT_FILE, base / f"{node_id}.crt", base / f"{node_id}.key")


def expected_files(data_dir: Path, config: ClusterConfig) -> list[Path]:
    """Every file a TLS cluster needs: the CA's certificate and key, each node's pair."""
    base = tls_dir(data_dir)
    paths = [base / CA_CERT_FILE, base / CA_KEY_FILE]
    for node in config.nodes:
        files = node_files(data_dir, node.id)
        paths += [files.cert, files.key]
    return paths


# --- creating and checking the files ---------------------------------------------------------


def ensure_certificates(data_dir: Path, config: ClusterConfig) -> None:
    """Create the TLS files of a `tls = true` cluster that has none, and a certificate for a
    member that has neither certificate nor key (a node added by `member add`); then check
    them all. Nothing existing is ever replaced: a set that is incomplete otherwise (the CA, or
    half of a node's pair) or does not match the config is refused (ConfigMissing /
    ConfigError naming the files). A no-op for a cluster without TLS."""
    if not config.tls:
        return
    data_dir = Path(data_dir)
    if not any(path.exists() for path in expected_files(data_dir, config)):
        _create_all(data_dir, config)
    base = tls_dir(data_dir)
    _none_missing([base / CA_CERT_FILE, base / CA_KEY_FILE], data_dir)
    new_members = [
        node
        for node in config.nodes
        if not any(path.exists() for path in _pair(node_files(data_dir, node.id)))
    ]
    if new_members:
        ca_cert = _load_cert(base / CA_CERT_FILE)
        ca_key = _load_key(base / CA_KEY_FILE)
        now = datetime.datetime.now(datetime.UTC)
        for node in new_members:
            _issue(base, config.name, node, ca_cert, ca_key, now)
        fsync_dir(base)
    check_certificates(data_dir, config)


def _pair(files: NodeTlsFiles) -> tuple[Path, Path]:
    return files.cert, files.key


def _create_all(data_dir: Path, config: ClusterConfig) -> None:
    """Write the CA and every node's pair into a temp dir, then rename it to `D/tls` (all
    or nothing: a crash leaves no half-made set behind)."""
    if tls_dir(data_dir).exists() and any(tls_dir(data_dir).iterdir()):
        raise ConfigError(
            f"{tls_dir(data_dir)} holds files that are not this cluster's TLS files; "
            "move them away so that `cluster start` can create the CA and certificates"
        )
    staging = Path(tempfile.mkdtemp(prefix=".tls-", dir=data_dir))
    os.chmod(staging, DIR_MODE)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _ca_certificate(config.name, ca_key, now)
    _write(staging / CA_CERT_FILE, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(staging / CA_KEY_FILE, _key_pem(ca_key), KEY_MODE)
    for node in config.nodes:
        _issue(staging, config.name, node, ca_cert, ca_key, now)
    if tls_dir(data_dir).exists():
        tls_dir(data_dir).rmdir()  # empty (checked above)
    os.rename(staging, tls_dir(data_dir))
    fsync_dir(data_dir)


def _issue(
    base: Path,
    cluster_name: str,
    node: NodeConfig,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    now: datetime.datetime,
) -> None:
    """A new key and certificate for `node` in `base` (the key first: a crash in between
    leaves a key without its certificate, which is refused, never a certificate without
    its key silently replaced)."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _node_certificate(cluster_name, node, key, ca_cert, ca_key, now)
    _write(base / f"{node.id}.key", _key_pem(key), KEY_MODE)
    _write(base / f"{node.id}.crt", cert.public_bytes(serialization.Encoding.PEM), 0o644)


def _ca_certificate(
    cluster_name: str, key: ec.EllipticCurvePrivateKey, now: datetime.datetime
) -> x509.Certificate:
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "quorumq"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"quorumq cluster CA {cluster_name}"[:64]),
        ]
    )
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(seconds=CLOCK_SKEW_S))
        .not_valid_after(now + datetime.timedelta(days=CA_VALIDITY_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _node_certificate(
    cluster_name: str,
    node: NodeConfig,
    key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    now: datetime.datetime,
) -> x509.Certificate:
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, f"quorumq {cluster_name}"[:64]),
            x509.NameAttribute(NameOID.COMMON_NAME, node.id),
        ]
    )
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(seconds=CLOCK_SKEW_S))
        .not_valid_after(now + datetime.timedelta(days=NODE_VALIDITY_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([_san(node.host)]), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )


def _san(host: str) -> x509.GeneralName:
    """An IP address SAN for an IP host, a DNS name SAN otherwise."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def check_certificates(data_dir: Path, config: ClusterConfig) -> None:
    """Refuse a TLS file set that is incomplete or does not fit the cluster: ConfigMissing for
    missing files, ConfigError for a key readable by others, a certificate not signed by the
    cluster CA, a key that is not its certificate's, a node certificate without its node's
    host, or one outside its validity period."""
    data_dir = Path(data_dir)
    _none_missing(expected_files(data_dir, config), data_dir)
    base = tls_dir(data_dir)
    ca_cert = _load_cert(base / CA_CERT_FILE)
    _same_key(ca_cert, _load_key(base / CA_KEY_FILE), base / CA_KEY_FILE)
    _in_validity(ca_cert, base / CA_CERT_FILE)
    for node in config.nodes:
        _check_node(node, node_files(data_dir, node.id), ca_cert)


def check_node_files(data_dir: Path, node: NodeConfig) -> NodeTlsFiles:
    """Check what one node needs (the CA certificate, its own certificate and key; not the CA
    key, which need not be on the node's host); its file paths."""
    files = node_files(data_dir, node.id)
    _none_missing([files.ca_cert, files.cert, files.key], Path(data_dir))
    ca_cert = _load_cert(files.ca_cert)
    _in_validity(ca_cert, files.ca_cert)
    _check_node(node, files, ca_cert)
    return files


def _none_missing(paths: list[Path], data_dir: Path) -> None:
    missing = [str(path) for path in paths if not path.exists()]
    if missing:
        raise ConfigMissing(
            f"tls = true but these TLS files are missing: {', '.join(missing)}. Restore them "
            f"from a backup, or (every node stopped) move {tls_dir(data_dir)} away so that "
            "`quorumq cluster start` creates a new CA and certificates for every node"
        )


def _check_node(node: NodeConfig, files: NodeTlsFiles, ca_cert: x509.Certificate) -> None:
    cert = _load_cert(files.cert)
    _same_key(cert, _load_key(files.key), files.key)
    _signed_by(cert, ca_cert, files.cert)
    _names_host(cert, node, files.cert)
    _in_validity(cert, files.cert)


def _load_cert(path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read the certificate {path}: {err}") from err


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise ConfigError(
                f"the private key {path} is readable by others (mode {mode:04o}); chmod 600 {path}"
            )
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as err:
        raise ConfigError(f"cannot read the private key {path}: {err}") from err
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{path} is not an EC private key")
    return key


def _same_key(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, key_path: Path) -> None:
    if cert.public_key() != key.public_key():
        raise ConfigError(f"the private key {key_path} does not belong to its certificate")


def _signed_by(cert: x509.Certificate, ca_cert: x509.Certificate, path: Path) -> None:
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature) as err:
        raise ConfigError(f"{path} is not signed by this cluster's CA ({err})") from err


def _names_host(cert: x509.Certificate, node: NodeConfig, path: Path) -> None:
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound as err:
        raise ConfigError(f"{path} has no subject alternative name") from err
    if _san(node.host) not in names:
        raise ConfigError(
            f"{path} is not valid for {node.id}'s host {node.host} (its names: "
            f"{[str(name.value) for name in names]}); was the host changed in cluster.toml?"
        )


def _in_validity(cert: x509.Certificate, path: Path) -> None:
    now = datetime.datetime.now(datetime.UTC)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise ConfigError(
            f"{path} is valid from {cert.not_valid_before_utc:%Y-%m-%d} to "
            f"{cert.not_valid_after_utc:%Y-%m-%d}, not now"
        )


# --- SSL contexts ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeerContexts:
    """The two sides of a node's peer connections: accepting (server) and dialing (client)."""

    server: ssl.SSLContext
    client: ssl.SSLContext


def peer_contexts(files: NodeTlsFiles) -> PeerContexts:
    """Mutual TLS 1.3 contexts for one node: it presents its certificate on both sides and
    requires the peer's, signed by the cluster CA. The dialing side checks that the peer's
    certificate names the host it dials (`server_hostname`, the peer's raft host)."""
    contexts = []
    for purpose in (ssl.PROTOCOL_TLS_SERVER, ssl.PROTOCOL_TLS_CLIENT):
        context = ssl.SSLContext(purpose)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        try:
            context.load_cert_chain(files.cert, files.key)
            context.load_verify_locations(cafile=files.ca_cert)
        except (OSError, ssl.SSLError) as err:
            raise ConfigError(f"cannot load the TLS files {files}: {err}") from err
        context.verify_mode = ssl.CERT_REQUIRED
        contexts.append(context)
    return PeerContexts(server=contexts[0], client=contexts[1])


def node_peer_contexts(data_dir: Path, config: ClusterConfig, node_id: str) -> PeerContexts | None:
    """The peer contexts of `node_id` when the cluster has `tls = true` (None otherwise),
    after checking the data dir's TLS files (ConfigError / ConfigMissing say what is wrong)."""
    if not config.tls:
        return None
    return peer_contexts(check_node_files(data_dir, config.node(node_id)))


def client_port_context(files: NodeTlsFiles) -> ssl.SSLContext:
    """The server context of a node's client port: its certificate (the same pair as its peer
    port), TLS 1.2 at least (1.3 when the client has it), no client certificate asked for
    (clients authenticate with their client key inside TLS)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert, files.key)
    except (OSError, ssl.SSLError) as err:
        raise ConfigError(f"cannot load the TLS files {files}: {err}") from err
    return context


def node_client_port_context(
    data_dir: Path, config: ClusterConfig, node_id: str
) -> ssl.SSLContext | None:
    """The client port's context of `node_id` when the cluster has `tls = true` (None
    otherwise), after checking its TLS files."""
    if not config.tls:
        return None
    return client_port_context(check_node_files(data_dir, config.node(node_id)))


# --- an authority for hosts of their own (`quorumq cluster init --hosts`) ---------------------


@dataclass(frozen=True, slots=True)
class Authority:
    """A cluster CA kept apart from the nodes (`DIR/authority`): it issues their pairs."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def create_authority(directory: Path, cluster_name: str) -> Authority:
    """A new CA written as `ca.crt` (0644) and `ca.key` (0600) into `directory` (which must
    not hold them already: the files are created exclusively)."""
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _ca_certificate(cluster_name, key, now)
    _write(directory / CA_CERT_FILE, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(directory / CA_KEY_FILE, _key_pem(key), KEY_MODE)
    return Authority(cert, key)


def load_authority(directory: Path) -> Authority:
    """The CA in `directory` (`ca.crt` and `ca.key`, checked to belong together)."""
    _none_missing([directory / CA_CERT_FILE, directory / CA_KEY_FILE], directory.parent)
    cert = _load_cert(directory / CA_CERT_FILE)
    key = _load_key(directory / CA_KEY_FILE)
    _same_key(cert, key, directory / CA_KEY_FILE)
    return Authority(cert, key)


def issue_node_pair(directory: Path, cluster_name: str, node: NodeConfig, ca: Authority) -> None:
    """Write `node`'s key and certificate (SAN: its host) into `directory`, plus `ca.crt`:
    the TLS dir of that node's bundle, nothing of any other node and not the CA key."""
    now = datetime.datetime.now(datetime.UTC)
    _write(directory / CA_CERT_FILE, ca.cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _issue(directory, cluster_name, node, ca.cert, ca.key, now)


def write_ca_cert(path: Path, ca: Authority) -> None:
    """The CA certificate alone (public): what a client needs to verify the nodes."""
    _write(path, ca.cert.public_bytes(serialization.Encoding.PEM), 0o644)
