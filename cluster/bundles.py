"""Bundles for a cluster whose nodes run on hosts of their own (`quorumq cluster init --hosts`).

`init_bundles(out, hosts)` writes, under `out`:

- `authority/` (0700): the CA (`ca.crt`, `ca.key`), the cluster secret, `client.key` and the
  whole `cluster.toml`. It issues bundles (`add_node_bundle`); keep it off the node hosts.
- `nX/` (0700), one per host: what node nX needs and nothing else: `cluster.toml` (binding the
  node's own address), `secret`, `node` (its id), `tls/ca.crt`, `tls/nX.crt`, `tls/nX.key`.
  Copied to the host, it is the node's data dir (`quorumq node start --bundle DIR`).
- `client/`: `ca.crt`, `client.key`, `endpoints` (one `host:port` a line) and `client.env`
  (QUORUMQ_ENDPOINTS, QUORUMQ_CREDENTIALS, QUORUMQ_TLS_CA for the CLI, paths relative to it).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from cluster import config as cluster_config
from cluster import tls as cluster_tls
from cluster.config import ClusterConfig, FsyncPolicy, NodeConfig
from cluster.errors import ConfigError

AUTHORITY_DIR = "authority"
CLIENT_DIR = "client"
NODE_ID_FILE = "node"
ENDPOINTS_FILE = "endpoints"
CLIENT_ENV_FILE = "client.env"
CLIENT_PORT_DEFAULT = 5701  # the raft (peer) port is the client port + 1
HOSTS_MAX = 15
HOST_NAME_BYTES_MAX = 253
DIR_MODE = 0o700
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


class HostListError(ValueError):
    """Raised when a `--hosts` list cannot be a cluster: empty items, bad names or ports, two
    nodes on one host:port, more than HOSTS_MAX hosts. The message names the item."""


class BundleError(ConfigError):
    """Raised when bundles cannot be written or read: the output dir is not empty, the
    authority dir is missing or damaged, a bundle is not a node's."""


@dataclass(frozen=True, slots=True)
class HostSpec:
    """One node's host (a name or an IP address) and its client port (peers: port + 1)."""

    host: str
    client_port: int = CLIENT_PORT_DEFAULT

    @property
    def raft_port(self) -> int:
        """The peer (Raft) port: the client port + 1."""
        return self.client_port + 1


def parse_host(item: str) -> HostSpec:
    """`HOST` or `HOST:PORT` (a name or an IPv4 address); HostListError says what is wrong."""
    text = item.strip()
    if not text:
        raise HostListError("an empty item in the host list (two commas, or one at an end?)")
    if text.startswith("[") or text.count(":") > 1:
        raise HostListError(
            f"{item!r}: IPv6 addresses are not supported yet (peer and client addresses are "
            "written host:port, unbracketed): use an IPv4 address or a host name"
        )
    host, sep, after = text.partition(":")
    return HostSpec(_valid_host(host, item), _valid_port(after if sep else None, item))


def _valid_port(port_text: str | None, item: str) -> int:
    if port_text is None:
        return CLIENT_PORT_DEFAULT
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65534:
        raise HostListError(
            f"{item!r}: the port must be a number from 1 to 65534 (the node also takes the "
            f"next one for its peers), got {port_text!r}"
        )
    return int(port_text)


def _valid_host(host: str, item: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    if len(host) > HOST_NAME_BYTES_MAX or not all(_LABEL.match(label) for label in labels):
        raise HostListError(
            f"{item!r}: {host!r} is neither an IP address nor a host name (letters, digits "
            "and hyphens in dot-separated labels)"
        )
    if host.replace(".", "").isdigit():
        raise HostListError(f"{item!r}: {host!r} is not a valid IPv4 address")
    return host.lower()


def parse_hosts(text: str) -> list[HostSpec]:
    """A comma-separated host list: 1 to HOSTS_MAX nodes, no two sharing a port on one host."""
    specs = [parse_host(item) for item in text.split(",")]
    if len(specs) > HOSTS_MAX:
        raise HostListError(f"{len(specs)} hosts: a cluster has at most {HOSTS_MAX} voters")
    taken: dict[tuple[str, int], str] = {}
    for spec in specs:
        for port in (spec.client_port, spec.raft_port):
            owner = taken.get((spec.host, port))
            if owner is not None:
                raise HostListError(
                    f"{spec.host}:{spec.client_port} and {owner} both need port {port} on "
                    f"{spec.host} (each node takes its client port and the next one): "
                    "give nodes on one host ports at least 2 apart"
                )
            taken[(spec.host, port)] = f"{spec.host}:{spec.client_port}"
    return specs


def _node(index: int, spec: HostSpec) -> NodeConfig:
    node_id = f"n{index}"
    return NodeConfig(node_id, spec.host, spec.raft_port, spec.client_port, Path(node_id))


def init_bundles(
    out: Path,
    hosts: list[HostSpec],
    *,
    name: str = "quorumq",
    bind: str | None = None,
    fsync: FsyncPolicy = "batch",
) -> ClusterConfig:
    """Write the authority, one bundle per host and the client bundle under `out` (which must
    be empty or absent); the cluster's config. `bind`: the address every node listens on
    (default: each node's own host)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BundleError(f"{out} is not an empty directory: give --out a new one")
    nodes = tuple(_node(i + 1, spec) for i, spec in enumerate(hosts))
    config = ClusterConfig(
        name=name, created_ms=int(time.time() * 1000), nodes=nodes, fsync=fsync, tls=True
    )
    authority = _private_dir(out / AUTHORITY_DIR)
    cluster_config.write(authority, config)
    cluster_config.create_secret(authority)
    ca = cluster_tls.create_authority(authority, name)
    for node in nodes:
        _write_node_bundle(out, config, node, ca, bind)
    _write_client_bundle(out, config, ca)
    return config


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=DIR_MODE, parents=True)
    os.chmod(path, DIR_MODE)
    return path


def _write_node_bundle(
    out: Path, config: ClusterConfig, node: NodeConfig, ca: cluster_tls.Authority, bind: str | None
) -> Path:
    """`out/<node>`: its config (binding `bind` or its own host), the secret, its TLS pair."""
    bundle = _private_dir(out / node.id)
    cluster_config.write(bundle, dataclasses.replace(config, bind=bind or node.host))
    shutil.copy2(out / AUTHORITY_DIR / cluster_config.SECRET_FILE, bundle)
    (bundle / NODE_ID_FILE).write_text(f"{node.id}\n", encoding="ascii")
    cluster_tls.issue_node_pair(_private_dir(cluster_tls.tls_dir(bundle)), config.name, node, ca)
    return bundle


def _write_client_bundle(out: Path, config: ClusterConfig, ca: cluster_tls.Authority) -> Path:
    bundle = _private_dir(out / CLIENT_DIR)
    cluster_tls.write_ca_cert(bundle / cluster_tls.CA_CERT_FILE, ca)
    shutil.copy2(out / AUTHORITY_DIR / cluster_config.CLIENT_KEY_FILE, bundle)
    endpoints = [_endpoint(node) for node in config.nodes]
    (bundle / ENDPOINTS_FILE).write_text("".join(f"{e}\n" for e in endpoints), "ascii")
    (bundle / CLIENT_ENV_FILE).write_text(
        f"QUORUMQ_ENDPOINTS={','.join(endpoints)}\n"
        f"QUORUMQ_CREDENTIALS={cluster_config.CLIENT_KEY_FILE}\n"
        f"QUORUMQ_TLS_CA={cluster_tls.CA_CERT_FILE}\n",
        "ascii",
    )
    return bundle


def _endpoint(node: NodeConfig) -> str:
    return f"{node.host}:{node.client_port}"


def add_node_bundle(out: Path, spec: HostSpec, bind: str | None = None) -> NodeConfig:
    """Issue a bundle for one more node (the next free id) from `out/authority` and record it
    in the authority's cluster.toml; the new node (then `member add` it, see docs/deploy.md)."""
    authority = Path(out) / AUTHORITY_DIR
    if not (authority / cluster_config.CONFIG_FILE).exists():
        raise BundleError(f"{authority} holds no cluster.toml: is {out} a `cluster init` dir?")
    config = cluster_config.load(authority)
    for known in config.nodes:
        if (known.host, known.client_port) == (spec.host, spec.client_port) or (
            known.host == spec.host and abs(known.client_port - spec.client_port) < 2
        ):
            raise HostListError(f"{spec.host}:{spec.client_port} clashes with {known.id}'s ports")
    numbers = [int(n.id[1:]) for n in config.nodes if n.id[1:].isdigit()]
    node = _node(max(numbers, default=0) + 1, spec)
    config = dataclasses.replace(
        config, nodes=(*config.nodes, node), founders=tuple(config.founder_ids())
    )
    ca = cluster_tls.load_authority(authority)
    _write_node_bundle(Path(out), config, node, ca, bind)
    cluster_config.write(authority, config)
    return node


def bundle_node_id(bundle: Path) -> str:
    """The node a bundle is for; BundleError when it is not a node bundle or holds the CA key."""
    bundle = Path(bundle)
    try:
        node_id = (bundle / NODE_ID_FILE).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise BundleError(
            f"{bundle} is not a node bundle (no readable {NODE_ID_FILE} file): give one of "
            "the nX dirs `quorumq cluster init` wrote"
        ) from err
    if (bundle / cluster_tls.TLS_DIR / cluster_tls.CA_KEY_FILE).exists():
        raise BundleError(
            f"{bundle} holds the CA key ({cluster_tls.TLS_DIR}/{cluster_tls.CA_KEY_FILE}): a "
            "node host must not; keep it in the authority dir only"
        )
    return node_id
