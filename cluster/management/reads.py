"""The read-only API: cluster, nodes, queues, message groups, consumer groups, connections.

Every answer comes from this node's replica (a follower's may be a little behind: `stale` says
when this node cannot vouch for it) and from the counters `/metrics` exports.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

import fifo
from cluster.management.jsonable import to_json
from cluster.management.node import ManagedNode
from cluster.management.peers import PeerStatuses
from cluster.management.samples import SAMPLES_KEPT, TOTALS, Sampler, queue_counters
from cluster.node.queries import GROUPS_LIMIT_MAX, MESSAGES_LIMIT_MAX, machine_status, with_bodies
from raft.replica import ReplicaView

PEEK_DEFAULT = 20
PEEK_MAX = 500  # bodies travel as JSON: a page of them, not a backlog
GROUPS_DEFAULT = 200
# a peek at a grouped queue sorts all its waiting messages (fifo.messages): refused past this
PEEK_GROUPED_MESSAGES_MAX = 200_000
QUEUES_LISTED_MAX = 2000  # /api/queues answers the first ones by name, and says how many exist
CONSUMERS_LISTED_MAX = 1000  # a queue's page lists at most these (the count is exact)


class Reads:
    """The handlers of the GET endpoints."""

    def __init__(self, node: ManagedNode, sampler: Sampler, peers: PeerStatuses) -> None:
        self.node = node
        self.sampler = sampler
        self.peers = peers

    def _read(self, view_fn: Any) -> Any:
        return self.node.replica.read(view_fn)

    def _stale(self) -> str | None:
        return self.node.unavailable_reason(for_read=True)

    async def overview(self, request: web.Request) -> web.Response:
        """The overview page: this node's view of the cluster, totals and rates."""
        status = self.node.replica.status(with_digest=False)
        totals = self.sampler.series(TOTALS, 1)
        return web.json_response({
            "cluster": self.node.cluster.name,
            "node": self.node.node_id,
            "leader": status["leader"],
            "term": status["term"],
            "machine_version": status["effective_machine_version"],
            "nodes": self._node_rows(status),
            "queues": len(self._read(lambda view: fifo.list_queues(view.state))),
            "messages": {name: (totals[name] or [None])[-1] for name in ("ready", "unacked",
                                                                        "total", "bytes")},
            "rates": self.sampler.latest_rates(TOTALS),
            "connections": len(self.node.client_connections()),
            "stale": self._stale(),
        })  # fmt: skip

    def _node_rows(self, status: dict[str, Any]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for config in self.node.cluster.nodes:
            me = config.id == self.node.node_id
            up = me or self.node.replica.peer_connected(config.id)
            role = (
                status["role"] if me else "leader" if status["leader"] == config.id else "follower"
            )
            rows.append({
                "id": config.id,
                "address": config.client_address,
                "http_port": config.http_port,
                "up": up,
                "role": role if up else "unreachable",
                "this_node": me,
            })  # fmt: skip
        return rows

    async def cluster(self, request: web.Request) -> web.Response:
        """Every node's status (role, term, indexes, digest, versions) and the machine."""
        statuses = await self.peers.fetch(list(self.node.cluster.nodes))
        supported = self.node.replica.settings.supported_version
        machine = self._read(lambda view: machine_status(view, supported))
        nodes = []
        for config in self.node.cluster.nodes:
            found = statuses.get(config.id)
            row: dict[str, Any] = dict(found) if found is not None else {"role": "unreachable"}
            row.update({"id": config.id, "address": config.client_address,
                        "http_port": config.http_port, "up": found is not None})  # fmt: skip
            nodes.append(row)
        return web.json_response(
            to_json({"nodes": nodes, "machine": machine, "this_node": self.node.node_id})
        )

    async def queues(self, request: web.Request) -> web.Response:
        """Every queue: config, depth, bytes, consumers, counters and rates."""
        counters = queue_counters(self.node.metrics)
        rows, count = self._read(_overviews)
        for row in rows:
            row["counters"] = counters.get(row["name"], {})
            row["rates"] = self.sampler.latest_rates(row["name"])
        return web.json_response({"queues": rows, "count": count, "stale": self._stale()})

    async def queue(self, request: web.Request) -> web.Response:
        """One queue, with its consumers (and its single-active-consumer state)."""
        name = request.match_info["name"]
        found = self._read(lambda view: _queue_detail(view, name))
        if found is None:
            raise web.HTTPNotFound(text=f'{{"error": "no queue {name!r}"}}',
                                   content_type="application/json")  # fmt: skip
        found["counters"] = queue_counters(self.node.metrics).get(name, {})
        found["rates"] = self.sampler.latest_rates(name)
        found["stale"] = self._stale()
        return web.json_response(found)

    async def samples(self, request: web.Request) -> web.Response:
        """The chart series of one queue (`queue` in the path) or of all queues together."""
        last = _int_arg(request, "last", SAMPLES_KEPT, SAMPLES_KEPT)
        return web.json_response(self.sampler.series(request.match_info.get("name", TOTALS), last))

    async def messages(self, request: web.Request) -> web.Response:
        """Peek: the first `limit` waiting messages, nothing consumed."""
        name = request.match_info["name"]
        limit = _int_arg(request, "limit", PEEK_DEFAULT, min(PEEK_MAX, MESSAGES_LIMIT_MAX))
        found = self._read(lambda view: _peek(view, name, limit))
        if isinstance(found, str):
            return web.json_response({"error": found}, status=409)
        found = with_bodies(self.node.replica, found)  # machine v4: bodies kept in the log
        return web.json_response({"messages": to_json(found), "stale": self._stale()})

    async def groups(self, request: web.Request) -> web.Response:
        """Message groups of a grouped queue: owner, waiting count, age of the head."""
        name = request.match_info["name"]
        limit = _int_arg(request, "limit", GROUPS_DEFAULT, GROUPS_LIMIT_MAX)
        found = self._read(lambda view: _message_groups(view, name, limit))
        return web.json_response({"groups": to_json(found), "stale": self._stale()})

    async def consumer_groups(self, request: web.Request) -> web.Response:
        """Every consumer group: queue, partitions, members, epoch, last rebalance."""
        found = self._read(_consumer_groups)
        return web.json_response({"groups": to_json(found), "stale": self._stale()})

    async def consumer_group(self, request: web.Request) -> web.Response:
        """One consumer group: assignment, per-partition backlog, epochs, recent rebalances."""
        name = request.match_info["name"]
        found = self._read(
            lambda view: fifo.consumer_group(view.state, name)
            if fifo.state_version(view.state) >= 3 else None
        )  # fmt: skip
        if found is None:
            raise web.HTTPNotFound(text=f'{{"error": "no consumer group {name!r}"}}',
                                   content_type="application/json")  # fmt: skip
        track = self.sampler.groups.get(name)
        body = to_json(found)
        body["rebalances"] = list(track.rebalances) if track is not None else []
        body["stale"] = self._stale()
        return web.json_response(body)

    async def connections(self, request: web.Request) -> web.Response:
        """The client connections of this node."""
        return web.json_response({"node": self.node.node_id,
                                  "connections": self.node.client_connections()})  # fmt: skip


def _int_arg(request: web.Request, name: str, default: int, maximum: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= maximum:
        raise web.HTTPBadRequest(text=f'{{"error": "{name} must be an integer in 0..{maximum}"}}',
                                 content_type="application/json")  # fmt: skip
    return value


def _overview_row(view: ReplicaView, name: str) -> dict[str, Any] | None:
    o = fifo.overview(view.state, name)
    if o is None:
        return None
    row: dict[str, Any] = to_json(o)
    row.pop("type", None)
    # the numbers of /metrics: ready counts returned messages too
    row["ready"], row["unacked"] = o.ready + o.returned, o.checked_out
    row["grouped"] = fifo.state_version(view.state) >= 3 and (
        fifo.group_config(view.state, name) is not None
    )
    return row


def _overviews(view: ReplicaView) -> tuple[list[dict[str, Any]], int]:
    names = fifo.list_queues(view.state)
    rows = (_overview_row(view, name) for name in sorted(names)[:QUEUES_LISTED_MAX])
    return [row for row in rows if row is not None], len(names)


def _queue_detail(view: ReplicaView, name: str) -> dict[str, Any] | None:
    row = _overview_row(view, name)
    if row is not None:
        row["consumers_list"] = to_json(fifo.consumers(view.state, name)[:CONSUMERS_LISTED_MAX])
    return row


def _peek(view: ReplicaView, name: str, limit: int) -> list[fifo.MessageInfo] | str:
    """The first `limit` waiting messages, or why a peek is refused."""
    grouped = fifo.state_version(view.state) >= 3 and fifo.group_config(view.state, name)
    o = fifo.overview(view.state, name)
    if grouped and o is not None and o.ready + o.returned > PEEK_GROUPED_MESSAGES_MAX:
        waiting = o.ready + o.returned
        return (f"a peek at the grouped queue {name} sorts its {waiting} waiting messages "
                f"on the node's loop: refused above {PEEK_GROUPED_MESSAGES_MAX}")  # fmt: skip
    return list(fifo.messages(view.state, name, limit))


def _message_groups(view: ReplicaView, name: str, limit: int) -> list[Any]:
    if fifo.state_version(view.state) < 3 or fifo.group_config(view.state, name) is None:
        return []
    return list(fifo.groups(view.state, name, limit))


def _consumer_groups(view: ReplicaView) -> list[Any]:
    if fifo.state_version(view.state) < 3:
        return []
    return list(fifo.consumer_groups(view.state))
