"""Errors raised by the client library, on top of those of `cluster.errors`.

`cluster.errors` (owned by the node side) defines `ClusterError`, `ConfigError`, `ProtocolError`
and `AuthError`; the client adds the request-level failures below, all `ClusterError`s.
"""

from __future__ import annotations

from cluster.errors import AuthError, ClusterError, ConfigError, ProtocolError

__all__ = [
    "AuthError",
    "ClientClosed",
    "ClusterError",
    "CommandRefused",
    "ConfigError",
    "NoQuorum",
    "ProtocolError",
    "RequestTimeout",
    "TlsError",
    "Unavailable",
]


class Unavailable(ClusterError):
    """Raised when no node can be reached, or the cluster has no leader to commit a command."""


class NoQuorum(Unavailable):
    """Raised when the nodes reached answered that there is no leader (no majority of the
    cluster is up and connected): nothing can be committed until a quorum is back."""


class RequestTimeout(Unavailable):
    """Raised when a request got no answer within its timeout (the outcome is unknown)."""


class ClientClosed(ClusterError):
    """Raised by calls made on (or pending in) a client that was closed."""


class CommandRefused(ClusterError):
    """Raised when the state machine answered a command with an error reply (state unchanged).

    `code` is the machine's error code (`unknown_queue`, `queue_exists`, ...) or a protocol
    error code (`bad_command`, ...) when the node refused the frame.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class TlsError(ClusterError):
    """Raised when the client's TLS setting does not match the node's: a plaintext client on a
    TLS port, a TLS client on a plaintext port, or a node certificate that does not verify
    against the CA given as `tls=` (or not for the host dialed). Not retried on other nodes:
    it is a configuration to fix, and the message says how."""
