"""The status of every node, asked over the client protocol (as `quorumq cluster status` does).

Asked only when a page wants it (the nodes page), with a bounded digest, answers kept for
TTL_S so that many open browsers cost one round per period.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from cluster.client.aio import AsyncClient
from cluster.client.errors import ClusterError
from cluster.config import NodeConfig

TTL_S = 2.0  # a status answered is reused this long
PEER_TIMEOUT_S = 1.5


class PeerStatuses:
    """Status maps of other nodes, fetched in parallel and cached briefly."""

    def __init__(self, client_key: bytes, ca: Path | None) -> None:
        self._key = client_key
        self._ca = ca
        self._cache: dict[str, tuple[float, dict[str, Any] | None]] = {}

    async def fetch(self, nodes: list[NodeConfig]) -> dict[str, dict[str, Any] | None]:
        """Each node's status map, None for a node that did not answer in time."""
        now = time.monotonic()
        stale = [n for n in nodes if now - self._cache.get(n.id, (-1e9, None))[0] > TTL_S]
        answers = await asyncio.gather(*(self._one(node) for node in stale))
        for node, answer in zip(stale, answers, strict=True):
            self._cache[node.id] = (time.monotonic(), answer)
        return {node.id: self._cache[node.id][1] for node in nodes}

    async def _one(self, node: NodeConfig) -> dict[str, Any] | None:
        client = AsyncClient(
            [node.client_address],
            self._key,
            name="quorumq-management",
            connect_timeout_s=PEER_TIMEOUT_S,
            request_timeout_s=PEER_TIMEOUT_S,
            reconnect=False,
            connect_retry_s=0.0,
            prefer_leader=False,
            tls=self._ca,
        )
        try:
            async with asyncio.timeout(PEER_TIMEOUT_S * 2):
                await client.connect()
                return dict(await client.status())
        except (ClusterError, OSError, TimeoutError):
            return None
        finally:
            await client.close()
