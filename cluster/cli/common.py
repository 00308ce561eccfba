"""Shared pieces of the client-side commands: connecting, output rendering, error translation."""

from __future__ import annotations

import functools
import json
import logging
import ssl
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ParamSpec, Protocol, TypeVar

import click

from cluster import config as cluster_config
from cluster import protocol
from cluster.cli.exits import (
    CANT_CREATE,
    CONFIG,
    DATA,
    NO_INPUT,
    NO_PERMISSION,
    SOFTWARE,
    TEMPORARY,
    UNAVAILABLE,
    USAGE,
    CliError,
)
from cluster.client import Client
from cluster.client.errors import (
    AuthError,
    ClusterError,
    CommandRefused,
    ConfigError,
    NoQuorum,
    RequestTimeout,
    TlsError,
    Unavailable,
)
from cluster.client.tls import client_context, data_dir_ca
from cluster.config import ClusterConfig
from cluster.errors import ConfigMissing
from cluster.launcher import DataDirTaken, LauncherError, LaunchRefused, NoLeader

P = ParamSpec("P")
CONNECT_RETRY_S = 1.0
NO_LEADER_FAIL_S = 4.0
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"
R = TypeVar("R")


# Library exception class -> (exit code, message prefix): the one table the CLI exits by.
# Looked up along the exception's MRO, so a subclass listed here wins over its base class.
EXIT_CODES: dict[type[BaseException], tuple[int, str]] = {
    AuthError: (NO_PERMISSION, ""),  # (its text says it: the node's "authentication failed")
    TlsError: (CONFIG, "TLS: "),
    RequestTimeout: (TEMPORARY, "timed out: "),
    NoQuorum: (UNAVAILABLE, "no quorum: "),
    Unavailable: (UNAVAILABLE, "cluster unavailable: "),
    CommandRefused: (DATA, ""),
    ConfigMissing: (NO_INPUT, ""),
    ConfigError: (CONFIG, ""),
    LaunchRefused: (USAGE, ""),
    DataDirTaken: (CANT_CREATE, ""),
    NoLeader: (UNAVAILABLE, ""),
    LauncherError: (SOFTWARE, ""),
    ClusterError: (SOFTWARE, ""),
}


def cli_error(err: ClusterError) -> CliError:
    """The CliError (message and exit code, from EXIT_CODES) for a library error."""
    cls = next(c for c in type(err).__mro__ if c in EXIT_CODES)
    code, prefix = EXIT_CODES[cls]
    if isinstance(err, AuthError):
        message = (
            f"{prefix}{err}. Check --credentials (or the data dir's client.key): it must be "
            "the key of this cluster."
        )
    elif isinstance(err, NoQuorum):
        message = f"{prefix}{_who_answers()}: nothing commits until a majority is back; {err}"
    elif isinstance(err, CommandRefused):
        message = f"refused ({err.code}): {err.message}"
    elif cls is ClusterError:
        message = f"{type(err).__name__}: {err}"
    else:
        message = f"{prefix}{err}"
    return CliError(message, code)


def _who_answers() -> str:
    """Which nodes answer (probed now), for a no-quorum error."""
    from cluster.cli.reachability import reachability  # (it imports this module)

    ctx = click.get_current_context(silent=True)
    found = reachability(ctx) if ctx is not None else None
    return found or "the nodes reached have no leader"


def translate_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn library errors into CliError with a message and a BSD sysexits code."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except ClusterError as err:
            raise cli_error(err) from err

    return wrapper


class Options(Protocol):
    """The global options (`cluster.cli.main.CliContext`; not imported: main imports us)."""

    output: str
    data_dir: Path | None
    endpoints: str | None
    credentials: str | None
    tls_ca: str | None


def cli_context(ctx: click.Context) -> Options:
    """The global options of the root group."""
    obj: Options = ctx.find_root().obj
    return obj


def _override(field: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None:
            setattr(cli_context(ctx), field, value)
        return value

    return callback


def stale_ok_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """`--stale-ok`: read a node's state even when it has no leader (a warning on stderr)."""
    return click.option(
        "--stale-ok",
        is_flag=True,
        help="Print the connected node's state even when it has no leader/quorum (it may be "
        "stale; a warning on stderr names the node and why). Without it such a node answers "
        "`unavailable` and the client asks another node; when none has a leader: exit 69.",
    )(func)


def read_query(
    client: Client, name: str, args: dict[str, Any] | None = None, stale_ok: bool = False
) -> Any:
    """The result of query `name`; with `stale_ok`, a node without a leader answers anyway and
    the reason its answer may be stale is printed to stderr."""
    query_args = dict(args or {})
    if stale_ok:
        query_args[protocol.STALE_OK] = True
    answer = client.call(protocol.query(0, name, query_args))
    stale = answer.get(protocol.STALE)
    if stale:
        click.echo(f"warning: this answer may be stale: {stale}", err=True)
    return answer.get("result")


def output_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """`-o/--output` after the command name too (overrides the global one)."""
    return click.option(
        "-o",
        "--output",
        type=click.Choice(["table", "json", "jsonl"]),
        default=None,
        expose_value=False,
        callback=_override("output"),
        help="Output format (same as the global -o).",
    )(func)


def connection_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """`-o`, `--data-dir`, `--endpoints`, `--credentials`, `--tls-ca` after the command name
    too."""
    func = click.option(
        "--tls-ca",
        default=None,
        metavar="FILE",
        expose_value=False,
        callback=_override("tls_ca"),
        help="Cluster CA file of a tls = true cluster (same as the global option).",
    )(func)
    func = click.option(
        "--credentials",
        default=None,
        expose_value=False,
        callback=_override("credentials"),
        help="Client key file (same as the global option).",
    )(func)
    func = click.option(
        "--endpoints",
        default=None,
        expose_value=False,
        callback=_override("endpoints"),
        help="host:port,... (same as the global option).",
    )(func)
    func = click.option(
        "--data-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        expose_value=False,
        callback=_override("data_dir"),
        help="Cluster data dir (same as the global option).",
    )(func)
    return output_option(func)


def data_dir_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """A local `--data-dir` that falls back to the global one."""
    return click.option(
        "--data-dir",
        "local_data_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Cluster data dir (default: the global --data-dir).",
    )(func)


def max_machine_version_option(
    help_text: str,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--max-machine-version N`: cap the machine version a node supports (emulates older code)."""
    return click.option(
        "--max-machine-version", type=click.IntRange(1, None), default=None, help=help_text
    )


def grace_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """`--grace S`: seconds between SIGTERM and SIGKILL when stopping a node."""
    return click.option(
        "--grace",
        "grace_s",
        type=click.FloatRange(0, None),
        default=5.0,
        show_default=True,
        help="Seconds between SIGTERM and SIGKILL.",
    )(func)


def wait_timeout_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--timeout S`: how long to wait for nodes (at least 1 s, default 30 s)."""
    return click.option(
        "--timeout",
        "timeout_s",
        type=click.FloatRange(1, None),
        default=30.0,
        show_default=True,
        help=help_text,
    )


def resolve_data_dir(ctx: click.Context, local: Path | None) -> Path:
    """The data dir from the command's or the global option; a usage error when neither."""
    data_dir = local or cli_context(ctx).data_dir
    if data_dir is None:
        raise CliError("--data-dir is required for this command", USAGE)
    return data_dir


def load_config(data_dir: Path) -> ClusterConfig:
    """`D/cluster.toml`, with clear errors for a missing dir or file."""
    if not data_dir.exists():
        raise CliError(f"data dir {data_dir} does not exist", NO_INPUT)
    try:
        return cluster_config.load(data_dir)
    except ConfigError as err:
        raise cli_error(err) from err


def connection_args(ctx: click.Context) -> tuple[list[str], bytes]:
    """Endpoints and client key from --endpoints + --credentials, or from --data-dir."""
    options = cli_context(ctx)
    if options.endpoints:
        endpoints = [item.strip() for item in options.endpoints.split(",") if item.strip()]
        for endpoint in endpoints:
            host, sep, port = endpoint.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise CliError(f"bad endpoint {endpoint!r}: expected host:port", USAGE)
        if not options.credentials:
            raise CliError("--endpoints needs --credentials FILE (a client key file)", USAGE)
        try:
            key = cluster_config.read_client_key(Path(options.credentials))
        except ConfigError as err:
            raise cli_error(err) from err
        return endpoints, key
    if options.data_dir is None:
        raise CliError("give --data-dir D, or --endpoints h:p,... with --credentials FILE", USAGE)
    config = load_config(options.data_dir)
    credentials = options.credentials
    key_path = Path(credentials) if credentials else options.data_dir / "client.key"
    try:
        key = cluster_config.read_client_key(key_path)
    except ConfigError as err:
        raise cli_error(err) from err
    return list(config.endpoints().values()), key


def tls_context(
    ctx: click.Context, data_dir: Path | None = None, config: ClusterConfig | None = None
) -> ssl.SSLContext | None:
    """The client TLS context: --tls-ca FILE; else, for a data dir (`data_dir`, or the global
    one without --endpoints) whose cluster.toml says tls = true, its D/tls/ca.crt; else None
    (plaintext). A CA file that cannot be read is a config error (exit 78), before any dial."""
    options = cli_context(ctx)
    path: Path | None = Path(options.tls_ca) if options.tls_ca else None
    if path is None:
        if data_dir is None and not options.endpoints:
            data_dir = options.data_dir
        if data_dir is not None:
            config = config if config is not None else load_config(data_dir)
            path = data_dir_ca(data_dir, config.tls)
    try:
        return client_context(path)
    except ConfigError as err:
        raise cli_error(err) from err


def connect(ctx: click.Context, **kwargs: Any) -> Client:
    """A client for the cluster named by the global options (validated before connecting)."""
    endpoints, key = connection_args(ctx)
    tls = tls_context(ctx)
    if not logging.getLogger().handlers:  # the client's WARNING records, on stderr, one line each
        logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format=LOG_FORMAT)
    kwargs.setdefault("connect_timeout_s", 5.0)
    # one-shot commands: a stopped cluster is told at once (a node restarting gets a second),
    # and no quorum within seconds (an election takes one or two), not at the request timeout
    kwargs.setdefault("connect_retry_s", CONNECT_RETRY_S)
    kwargs.setdefault("no_leader_fail_s", NO_LEADER_FAIL_S)
    return Client(endpoints, key, name="quorumq-cli", tls=tls, **kwargs)


# --- output --------------------------------------------------------------------------------


def output_format(ctx: click.Context) -> str:
    """table | json | jsonl."""
    return cli_context(ctx).output


def emit(ctx: click.Context, data: Any, columns: Sequence[str] | None = None) -> None:
    """Print rows (a list of maps) or one map as a table, JSON or JSON lines."""
    fmt = output_format(ctx)
    if fmt == "json":
        click.echo(json.dumps(plain(data), indent=2, sort_keys=False))
    elif fmt == "jsonl":
        for row in data if isinstance(data, list) else [data]:
            click.echo(json.dumps(plain(row)))
    elif isinstance(data, list):
        click.echo(table(data, columns))
    elif isinstance(data, dict):
        click.echo(table([{"field": k, "value": v} for k, v in data.items()], ["field", "value"]))
    else:
        click.echo(str(data))


def table(rows: list[Any], columns: Sequence[str] | None = None) -> str:
    """A plain aligned text table (stable across terminals, easy to grep)."""
    dict_rows = [row if isinstance(row, dict) else {"value": row} for row in rows]
    if columns is None:
        columns = list(dict.fromkeys(key for row in dict_rows for key in row))
    if not columns:
        return "(none)"
    cells = [[cell(row.get(column)) for column in columns] for row in dict_rows]
    widths = [max([len(c)] + [len(line[i]) for line in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in cells
    ]
    return "\n".join(lines) if cells else lines[0] + "\n(none)"


def cell(value: Any) -> str:
    """One table cell: None as '-', containers as compact JSON."""
    if value is None:
        return "-"
    if isinstance(value, dict | list | tuple):
        return json.dumps(plain(value), separators=(",", ":"))
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def plain(value: Any) -> Any:
    """JSON-able data: bytes as text (or hex), tuples as lists, other objects via repr."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value.hex()
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return repr(value)


def untyped(value: Any) -> Any:
    """Drop the `type` tags the node adds to query results (noise in tables and JSON)."""
    if isinstance(value, dict):
        return {k: untyped(v) for k, v in value.items() if k != "type"}
    if isinstance(value, list):
        return [untyped(v) for v in value]
    return value
