"""Errors raised by the replication layer."""

from __future__ import annotations


class RaftError(Exception):
    """Base class of every error raised by `raft`."""


class EntryError(RaftError):
    """Raised when a log entry blob cannot be decoded (it is then applied as a no-op)."""


class VersionTooOldError(RaftError):
    """Raised inside apply when an entry needs a machine version this node's code lacks.

    The node stops applying (its log is kept) until it is restarted with newer code.
    """

    def __init__(self, needed: int, supported: int, index: int) -> None:
        super().__init__(
            f"machine version {needed} is effective from index {index}; this node supports "
            f"only up to {supported}: restart it with newer code"
        )
        self.needed = needed
        self.supported = supported
        self.index = index


class SubmitError(RaftError):
    """Raised (or passed to callbacks) when a batch could not be committed.

    `code` is a protocol error code: `unavailable` or `not_leader_timeout`.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class StorageError(RaftError):
    """Raised when a journal, meta or snapshot file is damaged beyond a torn tail: at start
    (the node refuses to start), or when a journal record is read back while the node runs (it
    stops). The message names the file, the offset and the recovery command."""

    def __init__(self, message: str, path: str, offset: int) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset


class DiskFullError(RaftError):
    """Raised when a journal write fails with ENOSPC: the write was undone, nothing was added."""


class EntryGoneError(RaftError):
    """Raised by `read_entry` when the journal holds no entry blob at a Raft index: it was
    compacted away and not retained (no snapshot named it live), it lies past the log's end, or
    it is one of pysyncobj's own entries (no-op, membership). Damage is a StorageError instead."""

    def __init__(self, index: int, why: str) -> None:
        super().__init__(f"no entry at raft index {index}: {why}")
        self.index = index
