"""What one node lets its clients hold: client connections (per node and per source address),
and the open-file limit they count against.

A node raises its soft open-file limit at start (to OPEN_FILES_WANTED, at most the hard limit:
1,024 is the usual default and too few) and keeps FD_RESERVE descriptors for itself (journal,
snapshots, meta files, peers, logs), so a crowd of clients can never make its own writes fail.
A connection past a cap is told why (`connection_limit`, a retryable refusal: the client tries
another node) and closed; refusals are logged once per source per REFUSAL_LOG_INTERVAL_S with
their count, never once each.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

log = structlog.get_logger("cluster.limits")

OPEN_FILES_WANTED = 65536
FD_RESERVE = 256  # descriptors no client connection may take
REFUSAL_LOG_INTERVAL_S = 10.0
REFUSAL_SOURCES_TRACKED_MAX = 10_000


def source_address(writer: asyncio.StreamWriter) -> str:
    """The address (host, without the port) a client connection comes from."""
    peer = writer.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) else str(peer)


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE towards OPEN_FILES_WANTED (never above the hard limit);
    the (soft, hard) limits in force afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES_WANTED)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as err:  # a container that forbids it: keep what we have
            log.warning("open_files_limit_kept", soft=soft, hard=hard, error=str(err))
    return soft, hard


def effective_connections_max(configured: int, open_files_soft: int) -> int:
    """`configured`, lowered so that the node keeps FD_RESERVE descriptors for itself."""
    return max(1, min(configured, open_files_soft - FD_RESERVE))


@dataclass
class RefusalLog:
    """Logs a refusal of a stranger (an unauthenticated client, one past a cap) once per
    event and source per REFUSAL_LOG_INTERVAL_S, with how many it stands for: an attacker
    must not be able to fill the disk with our log lines."""

    clock: Callable[[], float] = time.monotonic
    _counts: dict[tuple[str, str], int] = field(default_factory=dict)  # since the last line
    _logged_at: dict[tuple[str, str], float] = field(default_factory=dict)

    def note(self, event: str, source: str, **context: object) -> None:
        """Count one refusal of `source`; log it (with the count) if that is due."""
        key = (event, source)
        self._counts[key] = self._counts.get(key, 0) + 1
        now = self.clock()
        if now - self._logged_at.get(key, -REFUSAL_LOG_INTERVAL_S) < REFUSAL_LOG_INTERVAL_S:
            return
        log.warning(event, source=source, refused=self._counts.pop(key), **context)
        self._logged_at[key] = now
        if len(self._logged_at) > REFUSAL_SOURCES_TRACKED_MAX:  # forget the oldest sources
            for stale in list(self._logged_at)[: REFUSAL_SOURCES_TRACKED_MAX // 2]:
                del self._logged_at[stale]
                self._counts.pop(stale, None)


@dataclass
class ConnectionCaps:
    """Counts the client connections a node serves, in all and per source address."""

    total_max: int
    per_source_max: int
    refusals: RefusalLog = field(default_factory=RefusalLog)
    total: int = 0
    by_source: dict[str, int] = field(default_factory=dict)

    def admit(self, source: str) -> str | None:
        """Count a new connection from `source`; or, past a cap, the reason it is refused
        (nothing counted)."""
        reason = None
        if self.total >= self.total_max:
            reason = f"it serves {self.total} client connections, its cap (connections_max)"
        elif self.by_source.get(source, 0) >= self.per_source_max:
            reason = (
                f"{source} holds {self.by_source[source]} connections to it, the cap per "
                "source address (connections_per_source_max)"
            )
        if reason is not None:
            self.refusals.note("client_connections_refused", source, reason=reason)
            return reason
        self.total += 1
        self.by_source[source] = self.by_source.get(source, 0) + 1
        return None

    def release(self, source: str) -> None:
        """A connection `admit` counted has closed."""
        self.total -= 1
        left = self.by_source[source] - 1
        if left:
            self.by_source[source] = left
        else:
            del self.by_source[source]
