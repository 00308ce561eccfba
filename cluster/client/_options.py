"""The connection options of both clients, spelled out once.

`Client(...)`, `AsyncClient(...)` and their `from_data_dir(...)` take these as keyword
arguments (`ClientOptions`, checked by mypy through `Unpack`); the shells keep them as one
`Settings` value, read through `ShellView` by the handles and the user.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from cluster import config as cluster_config
from cluster.client.sansio import ClientProtocol
from cluster.client.tls import TlsOption, data_dir_ca


class DataDirOptions(TypedDict, total=False):
    """The options `from_data_dir` takes (endpoints, key and CA come from the data dir)."""

    name: str
    connect_timeout_s: float
    request_timeout_s: float
    reconnect_timeout_s: float
    reconnect: bool
    silence_timeout_s: float
    connect_retry_s: float | None
    prefer_leader: bool
    tls: TlsOption


class ClientOptions(DataDirOptions, total=False):
    """The options a client takes besides its endpoints and key."""

    no_leader_fail_s: float | None


@dataclass(frozen=True)
class Settings:
    """A client's options with their defaults (the meaning of each: `Client`'s docstring)."""

    name: str = "quorumq-client"
    connect_timeout_s: float = 2.0
    request_timeout_s: float = 30.0
    reconnect_timeout_s: float = 30.0
    reconnect: bool = True
    silence_timeout_s: float = 5.0
    connect_retry_s: float | None = None
    prefer_leader: bool = True
    tls: TlsOption = None
    no_leader_fail_s: float | None = None

    @property
    def retry_s(self) -> float:
        """How long the first connect keeps trying (`connect_retry_s`, else one timeout)."""
        return self.connect_timeout_s if self.connect_retry_s is None else self.connect_retry_s


def data_dir_connection(
    data_dir: Path, options: DataDirOptions
) -> tuple[list[str], bytes, DataDirOptions]:
    """The endpoints of `D/cluster.toml`, the key in `D/client.key` and the options, over TLS
    with `D/tls/ca.crt` when cluster.toml says `tls = true` (an explicit `tls` overrides it)."""
    config = cluster_config.load(Path(data_dir))
    key = cluster_config.read_client_key(Path(data_dir) / cluster_config.CLIENT_KEY_FILE)
    chosen: DataDirOptions = {**options}
    if chosen.get("tls") is None:
        chosen["tls"] = data_dir_ca(Path(data_dir), config.tls)
    return list(config.endpoints().values()), key, chosen


class ShellView:
    """A shell's options (from its `settings`) and connection (from its `core`), read-only."""

    settings: Settings
    core: ClientProtocol

    @property
    def name(self) -> str:
        """The client's name, shown by the nodes."""
        return self.settings.name

    @property
    def connect_timeout_s(self) -> float:
        """How long one connection attempt may take."""
        return self.settings.connect_timeout_s

    @property
    def request_timeout_s(self) -> float:
        """How long a request waits for its answer."""
        return self.settings.request_timeout_s

    @property
    def reconnect_timeout_s(self) -> float:
        """How long a reconnect keeps trying."""
        return self.settings.reconnect_timeout_s

    @property
    def silence_timeout_s(self) -> float:
        """How long a node may stay silent while requests wait."""
        return self.settings.silence_timeout_s

    @property
    def prefer_leader(self) -> bool:
        """Whether the first connection moves to the leader."""
        return self.settings.prefer_leader

    @property
    def reconnects(self) -> int:
        """How many times the client connected again after losing a connection."""
        return self.core.reconnects

    @property
    def node(self) -> str | None:
        """The node this client is connected to now (None while reconnecting)."""
        welcome = self.core.welcome
        return welcome.node if welcome else None

    @property
    def endpoints(self) -> list[str]:
        """The endpoints known to this client (those given plus those learnt from nodes)."""
        return list(self.core.endpoints)


class PublishOptions(TypedDict, total=False):
    """The options of one publish: `ttl_ms` (the message's time to live), `group` (its message
    group: a grouped queue, machine v3), `timeout_s` (how long to wait for room or a confirm;
    default: the client's request timeout)."""

    ttl_ms: int | None
    group: str | None
    timeout_s: float | None


def publish_options(
    options: PublishOptions, default_timeout_s: float
) -> tuple[int | None, str | None, float]:
    """`options` spelled out: ttl_ms, group and the timeout (`default_timeout_s` when unset)."""
    timeout_s = options.get("timeout_s")
    timeout = default_timeout_s if timeout_s is None else timeout_s
    return options.get("ttl_ms"), options.get("group"), timeout


class ConsumeOptions(TypedDict, total=False):
    """The options of `consume(...)` (their defaults and checks: `ClientProtocol.add_consumer`)."""

    prefetch: int
    credited: bool
    priority: int
    timeout_ms: int | None
    auto_ack: bool


class ConsumerOptions(ConsumeOptions, total=False):
    """The options of a consumer handle: `consume`'s plus its ack batch and tag."""

    ack_batch: int | None
    tag: str | None
