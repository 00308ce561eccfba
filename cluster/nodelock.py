"""The lock a running node holds on its data dir for its whole life (issue 34).

A node takes an exclusive `flock` on `<node dir>/node.lock` before it writes anything (its
incarnation, node.pid, node.log), and writes its pid into that file. A second start of the same
node finds the lock taken and stops there, naming the running pid, with the node's files
untouched. The kernel drops the lock when the process dies, however it dies: a stale lock file
is never mistaken for a running node. The launcher asks the same lock who runs a node, so a node
whose node.pid was lost is still found.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

LOCK_FILE = "node.lock"
LOCK_FILE_MODE = 0o600
# a probe (`lock_holder`, from the launcher) holds a shared lock for a few microseconds: a
# starting node tries again for this long before it concludes another node holds the dir
TAKE_RETRY_S = 1.0
TAKE_RETRY_PAUSE_S = 0.02
PID_BYTES_MAX = 32
PID_UNKNOWN = 0  # the lock is held, its holder has not written its pid yet


class NodeDirLocked(Exception):
    """Raised when another process holds the node's data dir (`pid`: that process, if known)."""

    def __init__(self, node_dir: Path, pid: int | None) -> None:
        holder = f"pid {pid}" if pid is not None else "another process"
        super().__init__(f"{node_dir} is in use by a running node ({holder})")
        self.node_dir = node_dir
        self.pid = pid


def take(node_dir: Path) -> int:
    """Lock `node_dir` for this process's life and record its pid; returns the lock's file
    descriptor (keep it open: closing it releases the lock). NodeDirLocked if it is taken."""
    node_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(node_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, LOCK_FILE_MODE)
    deadline = time.monotonic() + TAKE_RETRY_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                pid = _read_pid(fd)
                os.close(fd)
                raise NodeDirLocked(node_dir, pid) from None
            time.sleep(TAKE_RETRY_PAUSE_S)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    return fd


def lock_holder(node_dir: Path) -> int | None:
    """The pid of the node process holding `node_dir`'s lock (PID_UNKNOWN while the holder has
    not written it yet), or None when nobody holds it (a dead node's lock file is not held)."""
    try:
        fd = os.open(node_dir / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)  # held exclusively: a node runs
            return PID_UNKNOWN if pid is None else pid
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(os.pread(fd, PID_BYTES_MAX, 0).decode("ascii").strip())
    return None
