"""Errors raised by the cluster layer (configuration, wire protocol, node server)."""

from __future__ import annotations


class ClusterError(Exception):
    """Base class of every error raised by `cluster`."""


class ConfigError(ClusterError):
    """Raised when `cluster.toml`, the secret or a key file is missing, unreadable or invalid."""


class ConfigMissing(ConfigError):
    """Raised when `cluster.toml`, the secret or a key file does not exist."""


class ProtocolError(ClusterError):
    """Raised when a frame cannot be decoded or breaks the wire protocol.

    `code` is one of the protocol error codes (`bad_frame`, `frame_too_large`, ...).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class AuthError(ClusterError):
    """Raised when the handshake fails: wrong credentials or an unexpected first frame."""
