"""Cluster configuration: `D/cluster.toml`, the cluster secret and the client key.

Layout of a data dir `D` (written by `quorumq cluster start`, read by every node):
`D/cluster.toml`, `D/secret` (0600, 32 random bytes hex: pysyncobj's password),
`D/client.key` (0600, HMAC-SHA256(secret, b"quorumq client v1") hex), one dir per node and,
with `tls = true`, `D/tls/` (the cluster CA and each node's certificate: cluster/tls.py).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from cluster.errors import ConfigError, ConfigMissing

FsyncPolicy = Literal["always", "batch", "never"]
FSYNC_POLICIES: tuple[FsyncPolicy, ...] = ("always", "batch", "never")
UserRights = Literal["read", "admin"]
USER_RIGHTS: tuple[UserRights, ...] = ("read", "admin")
USERS_MAX = 100
CONFIG_FILE = "cluster.toml"
SNAPSHOT_EVERY_ENTRIES_DEFAULT = 5000
# set to 1 in a node's environment, lets `--max-machine-version` name an unreleased machine
# version (development and tests only; never the default)
UNRELEASED_FLAG = "QUORUMQ_ALLOW_UNRELEASED_MACHINE"
SNAPSHOT_EVERY_ENTRIES_MIN = 10
SNAPSHOT_EVERY_ENTRIES_MAX = 10_000_000
# ... and at the latest this long after the last one (pysyncobj's logCompactionMinTime)
SNAPSHOT_EVERY_S_DEFAULT = 300
SNAPSHOT_EVERY_S_MIN = 1
SNAPSHOT_EVERY_S_MAX = 7 * 24 * 3600
# client connections one node serves at once, and of them from one source address (host);
# a node also caps the first by its open-file limit (cluster/node/limits.py)
CONNECTIONS_MAX_DEFAULT = 4096
CONNECTIONS_PER_SOURCE_MAX_DEFAULT = 1024
CONNECTIONS_MAX_LIMIT = 1_000_000
# past this resident set a node refuses new publishes (`memory_alarm`) until it falls back below:
# a share of the machine's RAM (a float, RabbitMQ's vm_memory_high_watermark) or a size in bytes
# (an int, or a string with a unit: "512MiB", "2GB"); cluster/node/memory.py
MEMORY_HIGH_WATERMARK_DEFAULT = 0.4
MEMORY_HIGH_WATERMARK_BYTES_MIN = 16 * 1024 * 1024
MEMORY_HIGH_WATERMARK_BYTES_MAX = 2**50
MEMORY_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 1000,
    "kib": 1024,
    "mb": 1000**2,
    "mib": 1024**2,
    "gb": 1000**3,
    "gib": 1024**3,
    "tb": 1000**4,
    "tib": 1024**4,
}
_MEMORY_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", re.IGNORECASE)
LOG_FILE_BYTES_MAX_DEFAULT = 64 * 1024 * 1024
LOG_FILE_BYTES_MIN = 64 * 1024
LOG_FILES_KEPT_DEFAULT = 5
LOG_FILES_KEPT_MAX = 100
SECRET_FILE = "secret"
CLIENT_KEY_FILE = "client.key"
CLIENT_KEY_LABEL = b"quorumq client v1"
SECRET_BYTES = 32


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """One node: its id, where it listens (peer and client ports) and its own data dir."""

    id: str
    host: str
    raft_port: int
    client_port: int
    data_dir: Path
    max_machine_version: int | None = None
    # peer id -> "host:port" this node dials instead of the peer's raft address (a proxy, for
    # chaos partitions); the peer keeps its raft address as its identity
    peer_addresses: dict[str, str] = field(default_factory=dict)
    metrics_port: int | None = None  # Prometheus /metrics (off when None)
    http_port: int | None = None  # the management HTTP API and web UI (off when None)
    amqp_port: int | None = None  # AMQP 0-9-1 (cluster/amqp; off when None)

    @property
    def raft_address(self) -> str:
        """The pysyncobj address `host:raft_port`."""
        return f"{self.host}:{self.raft_port}"

    @property
    def client_address(self) -> str:
        """The client endpoint `host:client_port`."""
        return f"{self.host}:{self.client_port}"


@dataclass(frozen=True, slots=True)
class UserConfig:
    """A management user from a `[[users]]` table: its name, its password's hash (written by
    `python -m cluster.management hash-password`) and its rights."""

    name: str
    password_hash: str
    rights: UserRights = "read"


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """The whole cluster: name, fsync policy, bind address and its nodes in id order."""

    name: str
    created_ms: int
    nodes: tuple[NodeConfig, ...]
    fsync: FsyncPolicy = "batch"
    bind: str = "127.0.0.1"
    # compact the Raft log into a snapshot once it holds this many entries
    snapshot_every_entries: int = SNAPSHOT_EVERY_ENTRIES_DEFAULT
    # ... or once this many seconds passed since the last one (raise both to keep traffic in the
    # log for `log export`, the upgrade dry run and the analytics: docs/upgrades.md)
    snapshot_every_s: int = SNAPSHOT_EVERY_S_DEFAULT
    metrics_bind: str = "127.0.0.1"  # where nodes with a metrics_port serve /metrics
    # the members the cluster was created with, once membership changed (empty: `nodes` are
    # the founders); a node that joins starts its replicated member set from these
    founders: tuple[str, ...] = ()
    # mutual TLS on the peer (Raft) connections, with the certificates in D/tls (cluster.tls)
    tls: bool = False
    connections_max: int = CONNECTIONS_MAX_DEFAULT
    connections_per_source_max: int = CONNECTIONS_PER_SOURCE_MAX_DEFAULT
    # node.log rotates past this size, keeping this many older files (cluster/node/logs.py)
    log_file_bytes_max: int = LOG_FILE_BYTES_MAX_DEFAULT
    log_files_kept: int = LOG_FILES_KEPT_DEFAULT
    http_bind: str = "127.0.0.1"  # where nodes with an http_port serve the management API
    # management users besides `admin` (whose password is the client key): [[users]] tables
    users: tuple[UserConfig, ...] = ()
    # AMQP: RabbitMQ's guest/guest is accepted from loopback addresses (bench scripts, demos)
    amqp_guest: bool = False
    # a float in (0, 1]: that share of the machine's RAM; an int: bytes (memory_watermark_bytes)
    memory_high_watermark: float | int = MEMORY_HIGH_WATERMARK_DEFAULT

    def founder_ids(self) -> list[str]:
        """The members the cluster was created with."""
        return list(self.founders) if self.founders else self.node_ids()

    def node(self, node_id: str) -> NodeConfig:
        """The node called `node_id`; ConfigError if there is none."""
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise ConfigError(f"no node {node_id!r} in the cluster config (have {self.node_ids()})")

    def node_ids(self) -> list[str]:
        """Every node id, in config order."""
        return [node.id for node in self.nodes]

    def endpoints(self) -> dict[str, str]:
        """Client endpoints by node id."""
        return {node.id: node.client_address for node in self.nodes}


def load(data_dir: Path) -> ClusterConfig:
    """Read and validate `data_dir/cluster.toml`."""
    path = Path(data_dir) / CONFIG_FILE
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise ConfigMissing(f"{path} not found: is this a quorumq data dir?") from err
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read {path}: {err}") from err
    return _parse(raw, path)


def _parse(raw: dict[str, Any], path: Path) -> ClusterConfig:
    section = raw.get("cluster")
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: missing [cluster] table")
    fsync = section.get("fsync", "batch")
    if fsync not in FSYNC_POLICIES:
        raise ConfigError(f"{path}: fsync must be one of {FSYNC_POLICIES}, got {fsync!r}")
    nodes_raw = raw.get("nodes")
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise ConfigError(f"{path}: at least one [[nodes]] table is required")
    nodes = tuple(_parse_node(item, path) for item in nodes_raw)
    ids = [node.id for node in nodes]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{path}: duplicate node ids in {ids}")
    every = _typed(section, "snapshot_every_entries", int, path, SNAPSHOT_EVERY_ENTRIES_DEFAULT)
    if not SNAPSHOT_EVERY_ENTRIES_MIN <= every <= SNAPSHOT_EVERY_ENTRIES_MAX:
        raise ConfigError(
            f"{path}: snapshot_every_entries must be within "
            f"[{SNAPSHOT_EVERY_ENTRIES_MIN}, {SNAPSHOT_EVERY_ENTRIES_MAX}], got {every}"
        )
    every_s = _typed(section, "snapshot_every_s", int, path, SNAPSHOT_EVERY_S_DEFAULT)
    if not SNAPSHOT_EVERY_S_MIN <= every_s <= SNAPSHOT_EVERY_S_MAX:
        raise ConfigError(
            f"{path}: snapshot_every_s must be within "
            f"[{SNAPSHOT_EVERY_S_MIN}, {SNAPSHOT_EVERY_S_MAX}], got {every_s}"
        )
    founders = section.get("founders", [])
    if not isinstance(founders, list) or not all(isinstance(f, str) for f in founders):
        raise ConfigError(f"{path}: founders must be a list of node ids")
    if len(set(founders)) != len(founders):
        raise ConfigError(f"{path}: duplicate node ids in founders {founders}")
    return ClusterConfig(
        founders=tuple(founders),
        name=_typed(section, "name", str, path, "quorumq"),
        created_ms=_typed(section, "created_ms", int, path, 0),
        nodes=nodes,
        fsync=fsync,
        bind=_typed(section, "bind", str, path, "127.0.0.1"),
        snapshot_every_entries=every,
        snapshot_every_s=every_s,
        metrics_bind=_typed(section, "metrics_bind", str, path, "127.0.0.1"),
        tls=_typed(section, "tls", bool, path, False),
        http_bind=_typed(section, "http_bind", str, path, "127.0.0.1"),
        users=_parse_users(raw.get("users", []), path),
        connections_max=_bounded(section, "connections_max", CONNECTIONS_MAX_DEFAULT, path),
        connections_per_source_max=_bounded(
            section, "connections_per_source_max", CONNECTIONS_PER_SOURCE_MAX_DEFAULT, path
        ),
        log_file_bytes_max=_bounded(
            section, "log_file_bytes_max", LOG_FILE_BYTES_MAX_DEFAULT, path,
            low=LOG_FILE_BYTES_MIN, high=2**40,
        ),
        log_files_kept=_bounded(
            section, "log_files_kept", LOG_FILES_KEPT_DEFAULT, path, high=LOG_FILES_KEPT_MAX
        ),
        amqp_guest=_typed(section, "amqp_guest", bool, path, False),
        memory_high_watermark=parse_memory_watermark(
            section.get("memory_high_watermark", MEMORY_HIGH_WATERMARK_DEFAULT), path
        ),
    )  # fmt: skip


def parse_memory_watermark(value: Any, path: Path | str) -> float | int:
    """`memory_high_watermark` as given: a float in (0, 1] (a share of the machine's RAM), or
    a size in bytes (an int, or a string such as "512MiB", "2GB", "1.5GiB"); ConfigError else."""
    where = f"{path}: memory_high_watermark"
    if isinstance(value, float):
        if not 0.0 < value <= 1.0:
            raise ConfigError(
                f"{where} as a share of the machine's RAM must be within (0, 1], got {value} "
                '(an absolute size is an integer of bytes or a string such as "512MiB")'
            )
        return value
    if isinstance(value, str):
        value = _memory_size(value, where)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(
            f'{where} must be a share of RAM (0.4) or a size (1073741824, "1GiB"), got {value!r}'
        )
    low, high = MEMORY_HIGH_WATERMARK_BYTES_MIN, MEMORY_HIGH_WATERMARK_BYTES_MAX
    if not low <= value <= high:
        raise ConfigError(
            f"{where} must be within [{low}, {high}] bytes, got {value} (a share of the "
            "machine's RAM is written as a float: 0.4)"
        )
    return value


def _memory_size(text: str, where: str) -> int:
    """Bytes of a size written with a unit (B, kB, KiB, MB, MiB, GB, GiB, TB, TiB)."""
    match = _MEMORY_SIZE.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in MEMORY_UNITS:
        units = ", ".join(("B", "kB", "KiB", "MB", "MiB", "GB", "GiB", "TB", "TiB"))
        raise ConfigError(
            f"{where}: cannot read {text!r} as a size: a number and one of the units {units}"
        )
    return int(float(match.group(1)) * MEMORY_UNITS[unit])


def memory_watermark_bytes(watermark: float | int, ram_bytes: int) -> int:
    """The watermark in bytes on a machine with `ram_bytes` of RAM."""
    return int(watermark * ram_bytes) if isinstance(watermark, float) else watermark


def _bounded(
    section: dict[str, Any],
    key: str,
    default: int,
    path: Path,
    low: int = 1,
    high: int = CONNECTIONS_MAX_LIMIT,
) -> int:
    value: int = _typed(section, key, int, path, default)
    if not low <= value <= high:
        raise ConfigError(f"{path}: {key} must be within [{low}, {high}], got {value}")
    return value


def _parse_users(items: Any, path: Path) -> tuple[UserConfig, ...]:
    """The `[[users]]` tables: unique names (never `admin`), a hash, rights read | admin."""
    if not isinstance(items, list) or len(items) > USERS_MAX:
        raise ConfigError(f"{path}: users must be at most {USERS_MAX} [[users]] tables")
    users = []
    for item in items:
        if not isinstance(item, dict):
            raise ConfigError(f"{path}: each [[users]] entry must be a table")
        rights = item.get("rights", "read")
        if rights not in USER_RIGHTS:
            raise ConfigError(f"{path}: rights must be one of {USER_RIGHTS}, got {rights!r}")
        name = _typed(item, "name", str, path, None)
        users.append(UserConfig(name, _typed(item, "password_hash", str, path, None), rights))
    names = [user.name for user in users]
    if len(set(names)) != len(names) or {"admin", "quorumq"} & set(names):
        raise ConfigError(
            f"{path}: user names must be unique and not 'admin' or 'quorumq', got {names}"
        )
    return tuple(users)


def _parse_node(item: Any, path: Path) -> NodeConfig:
    if not isinstance(item, dict):
        raise ConfigError(f"{path}: each [[nodes]] entry must be a table")
    data_dir = _typed(item, "data_dir", str, path, None)
    cap = item.get("max_machine_version")
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise ConfigError(f"{path}: max_machine_version must be a positive integer")
    node_id = _typed(item, "id", str, path, None)
    peers = item.get("peer_addresses", {})
    if not isinstance(peers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and ":" in v for k, v in peers.items()
    ):
        raise ConfigError(f"{path}: peer_addresses must map peer ids to 'host:port' strings")
    return NodeConfig(
        id=node_id,
        host=_typed(item, "host", str, path, "127.0.0.1"),
        raft_port=_port(item, "raft_port", path),
        client_port=_port(item, "client_port", path),
        data_dir=path.parent / (data_dir or node_id),  # a relative dir: beside cluster.toml
        max_machine_version=cap,
        peer_addresses=dict(peers),
        metrics_port=_port(item, "metrics_port", path) if "metrics_port" in item else None,
        http_port=_port(item, "http_port", path) if "http_port" in item else None,
        amqp_port=_port(item, "amqp_port", path) if "amqp_port" in item else None,
    )


def _typed(table: dict[str, Any], key: str, kind: type, path: Path, default: Any) -> Any:
    value = table.get(key, default)
    if value is None or not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
        raise ConfigError(f"{path}: {key!r} must be a {kind.__name__}, got {value!r}")
    return value


def _port(table: dict[str, Any], key: str, path: Path) -> int:
    port: int = _typed(table, key, int, path, None)
    if not 1 <= port <= 65535:
        raise ConfigError(f"{path}: {key} {port} is not a TCP port")
    return port


def dumps(config: ClusterConfig) -> str:
    """The TOML text of `config` (a small writer: tomllib only reads)."""
    lines = [
        "[cluster]",
        f"name = {_toml_str(config.name)}",
        f"created_ms = {config.created_ms}",
        f"fsync = {_toml_str(config.fsync)}",
        f"bind = {_toml_str(config.bind)}",
    ]
    if config.snapshot_every_entries != SNAPSHOT_EVERY_ENTRIES_DEFAULT:
        lines.append(f"snapshot_every_entries = {config.snapshot_every_entries}")
    if config.snapshot_every_s != SNAPSHOT_EVERY_S_DEFAULT:
        lines.append(f"snapshot_every_s = {config.snapshot_every_s}")
    if config.metrics_bind != "127.0.0.1":
        lines.append(f"metrics_bind = {_toml_str(config.metrics_bind)}")
    if config.tls:
        lines.append("tls = true")
    if config.http_bind != "127.0.0.1":
        lines.append(f"http_bind = {_toml_str(config.http_bind)}")
    if config.connections_max != CONNECTIONS_MAX_DEFAULT:
        lines.append(f"connections_max = {config.connections_max}")
    if config.connections_per_source_max != CONNECTIONS_PER_SOURCE_MAX_DEFAULT:
        lines.append(f"connections_per_source_max = {config.connections_per_source_max}")
    if config.log_file_bytes_max != LOG_FILE_BYTES_MAX_DEFAULT:
        lines.append(f"log_file_bytes_max = {config.log_file_bytes_max}")
    if config.log_files_kept != LOG_FILES_KEPT_DEFAULT:
        lines.append(f"log_files_kept = {config.log_files_kept}")
    if config.amqp_guest:
        lines.append("amqp_guest = true")
    if config.memory_high_watermark != MEMORY_HIGH_WATERMARK_DEFAULT:
        lines.append(f"memory_high_watermark = {config.memory_high_watermark!r}")
    if config.founders:
        lines.append(f"founders = [{', '.join(_toml_str(f) for f in config.founders)}]")
    for node in config.nodes:
        lines += [
            "",
            "[[nodes]]",
            f"id = {_toml_str(node.id)}",
            f"host = {_toml_str(node.host)}",
            f"raft_port = {node.raft_port}",
            f"client_port = {node.client_port}",
            f"data_dir = {_toml_str(str(node.data_dir))}",
        ]
        if node.max_machine_version is not None:
            lines.append(f"max_machine_version = {node.max_machine_version}")
        if node.metrics_port is not None:
            lines.append(f"metrics_port = {node.metrics_port}")
        if node.http_port is not None:
            lines.append(f"http_port = {node.http_port}")
        if node.amqp_port is not None:
            lines.append(f"amqp_port = {node.amqp_port}")
        if node.peer_addresses:
            pairs = ", ".join(
                f"{_toml_str(k)} = {_toml_str(v)}" for k, v in sorted(node.peer_addresses.items())
            )
            lines.append(f"peer_addresses = {{ {pairs} }}")
    for user in config.users:
        lines += [
            "",
            "[[users]]",
            f"name = {_toml_str(user.name)}",
            f"password_hash = {_toml_str(user.password_hash)}",
            f"rights = {_toml_str(user.rights)}",
        ]
    return "\n".join(lines) + "\n"


def with_member_added(
    config: ClusterConfig, node_id: str, raft_address: str, client_address: str, data_dir: Path
) -> ClusterConfig:
    """`config` with a node added (after `member add` committed); founders recorded."""
    if node_id in config.node_ids():
        raise ConfigError(f"node {node_id!r} is already in the cluster config")
    node = NodeConfig(
        id=node_id,
        host=_host(raft_address),
        raft_port=int(raft_address.rpartition(":")[2]),
        client_port=int(client_address.rpartition(":")[2]),
        data_dir=Path(data_dir) / node_id,
    )
    if _host(client_address) != node.host:
        raise ConfigError(
            f"{node_id}: raft and client addresses must share a host in cluster.toml "
            f"({raft_address}, {client_address})"
        )
    return replace(config, nodes=(*config.nodes, node), founders=tuple(config.founder_ids()))


def with_member_removed(config: ClusterConfig, node_id: str) -> ClusterConfig:
    """`config` without a node (after `member remove` committed); founders recorded."""
    nodes = tuple(node for node in config.nodes if node.id != node_id)
    if len(nodes) == len(config.nodes):
        raise ConfigError(f"no node {node_id!r} in the cluster config")
    if not nodes:
        raise ConfigError("a cluster config needs at least one node")
    return replace(config, nodes=nodes, founders=tuple(config.founder_ids()))


def _host(address: str) -> str:
    return address.rpartition(":")[0]


def _toml_str(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    if any(ord(char) < 0x20 for char in escaped):
        raise ConfigError(f"control characters are not allowed in config strings: {value!r}")
    return f'"{escaped}"'


def write(data_dir: Path, config: ClusterConfig) -> Path:
    """Write `data_dir/cluster.toml` atomically (tmp file + fsync + rename); returns its path."""
    path = Path(data_dir) / CONFIG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, dumps(config).encode("utf-8"), mode=0o644)
    return path


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def create_secret(data_dir: Path) -> bytes:
    """Generate the cluster secret into `data_dir/secret` (0600) and write `client.key`."""
    secret = secrets.token_hex(SECRET_BYTES).encode("ascii")
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    _write_atomic(Path(data_dir) / SECRET_FILE, secret + b"\n", mode=0o600)
    _write_atomic(Path(data_dir) / CLIENT_KEY_FILE, client_key(secret) + b"\n", mode=0o600)
    return secret


def read_secret(data_dir: Path) -> bytes:
    """The cluster secret (hex ascii bytes); ConfigError when it is missing or malformed."""
    return _read_hex(Path(data_dir) / SECRET_FILE, "cluster secret")


def client_key(secret: bytes) -> bytes:
    """The client credential derived from the secret: HMAC-SHA256(secret, label), hex ascii."""
    return hmac.new(secret, CLIENT_KEY_LABEL, hashlib.sha256).hexdigest().encode("ascii")


def read_client_key(path: Path) -> bytes:
    """A client key file (hex ascii bytes, as written by `create_secret`)."""
    return _read_hex(Path(path), "client key")


def _read_hex(path: Path, what: str) -> bytes:
    try:
        value = path.read_bytes().strip()
    except FileNotFoundError as err:
        raise ConfigMissing(f"{what} file {path} not found") from err
    except OSError as err:
        raise ConfigError(f"cannot read {what} file {path}: {err}") from err
    try:
        bytes.fromhex(value.decode("ascii"))
    except (UnicodeDecodeError, ValueError) as err:
        raise ConfigError(f"{what} file {path} is not hex") from err
    if len(value) < 32:
        raise ConfigError(f"{what} file {path} is too short ({len(value)} hex chars)")
    return value
