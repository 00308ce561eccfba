"""Exceptions of the fifo package (apply never raises; these are for codecs and callers)."""

from __future__ import annotations


class FifoError(Exception):
    """Base class of every exception raised by `fifo`."""


class CodecError(FifoError):
    """Raised by `decode` / `restore` when the bytes are not a valid encoding of a fifo object."""


class UnsupportedVersionError(FifoError):
    """Raised by `machine_for`, `init_state` and `convert` for a machine version we do not ship."""
