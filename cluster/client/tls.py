"""TLS on the client port: the `tls=` option of every client, and what its failures mean.

A cluster with `tls = true` in cluster.toml serves its client port over TLS (1.2 at least, 1.3
when both sides have it) with each node's certificate from `D/tls` (cluster/tls.py). A client
verifies that certificate against the cluster CA (`D/tls/ca.crt`) and the host it dials; it
presents no certificate of its own: it still authenticates with its client key inside TLS.

`tls=` (Client, AsyncClient, RawClient) is one of:
- None: plaintext (a cluster without `tls = true`);
- a path (str or os.PathLike) to the cluster CA file: a context that trusts only that CA;
- an `ssl.SSLContext` made by the caller (its own CA bundle, client certificate, ciphers...).
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import TypeAlias

from cluster.client.errors import ClusterError, ConfigError, TlsError, Unavailable

TlsOption: TypeAlias = ssl.SSLContext | str | os.PathLike[str] | None

# where `quorumq cluster start` puts the cluster CA (cluster.tls.node_files(...).ca_cert)
CA_CERT_IN_DATA_DIR = Path("tls") / "ca.crt"
# OpenSSL's reasons when the first bytes of the node's answer are not a TLS record: the node
# speaks the plaintext protocol (its challenge frame starts with a 4-byte length)
_NOT_TLS_REASONS = frozenset(
    {"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST"}
)


def client_context(tls: TlsOption) -> ssl.SSLContext | None:
    """The SSL context for `tls=`: None (plaintext), the caller's context as is, or one that
    trusts only the CA file at the given path (ConfigError when it cannot be read)."""
    if tls is None or isinstance(tls, ssl.SSLContext):
        return tls
    if not isinstance(tls, str | os.PathLike):
        raise TypeError(f"tls= takes an ssl.SSLContext or the path of a CA file, not {tls!r}")
    path = Path(tls)
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(path))
    except (OSError, ssl.SSLError) as err:
        raise ConfigError(
            f"cannot read the cluster CA file {path}: {err} (it is the cluster's "
            f"D/{CA_CERT_IN_DATA_DIR}, written by `quorumq cluster start` with tls = true)"
        ) from err
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def data_dir_ca(data_dir: Path, tls: bool) -> Path | None:
    """The cluster CA of a data dir whose cluster.toml says `tls = true` (`tls`), else None."""
    return Path(data_dir) / CA_CERT_IN_DATA_DIR if tls else None


def server_hostname(address: str) -> str:
    """The host part of `host:port`: the name the node's certificate must carry."""
    host = address.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


# the same setting where the user may have given it: the library, the CLI, a kombu URL
CA_OPTION_ELSEWHERE = "--tls-ca FILE on the command line, ?tls_ca=FILE in a quorumq:// URL"
NO_CA = "no tls= in Python, no --tls-ca on the command line, no ?tls_ca= in a quorumq:// URL"


def handshake_failed(address: str, err: ssl.SSLError | OSError) -> ClusterError:
    """The error for a TLS handshake with `address` that failed with `err`: a certificate that
    does not verify, a node that does not speak TLS (both `TlsError`: a setting to fix), a
    handshake the node cut short (`Unavailable`: retried), or another TLS failure."""
    if isinstance(err, ssl.SSLEOFError | ssl.SSLZeroReturnError | ConnectionError):
        # a busy node closes its slowest pending handshakes first (cluster/node/client_tls.py)
        return Unavailable(
            f"the TLS handshake with {address} was cut short by the node ({err}): it closes "
            "the slowest pending handshakes when too many are open at once; retrying"
        )
    if isinstance(err, ssl.SSLCertVerificationError):
        return TlsError(
            f"the TLS certificate of {address} does not verify: "
            f"{str(err.verify_message).rstrip('.')}. Pass "
            f"tls=<that cluster's CA, D/{CA_CERT_IN_DATA_DIR}> ({CA_OPTION_ELSEWHERE}) "
            "and dial the host name or IP its certificate was issued for (its cluster.toml host)"
        )
    reason = getattr(err, "reason", None)
    if isinstance(err, ssl.SSLError) and reason in _NOT_TLS_REASONS:
        return TlsError(
            f"{address} does not speak TLS (the TLS handshake failed: {reason}): its cluster "
            f"runs without tls = true; connect without a CA ({NO_CA})"
        )
    return TlsError(
        f"the TLS handshake with {address} failed: {err}. If that cluster runs without "
        f"tls = true, connect without a CA ({NO_CA})"
    )
