"""The management HTTP API and web UI of one node (aiohttp, on the node's event loop).

`ManagementServer` serves `/api/...` (JSON), `/metrics` (the node's Prometheus registry) and the
web UI (`/`, static files shipped in `cluster/management/static`). See docs/management.md.
"""

from cluster.management.app import ManagementServer

__all__ = ["ManagementServer"]
