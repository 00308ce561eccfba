"""The management server: an aiohttp application on the node's own event loop.

Routes: the UI (`/`, `/static/...`, no credentials needed: it holds no data), `/api/login`,
`/api/logout`, `/api/whoami`, the reads of `reads.py`, the writes of `actions.py` and `/metrics`.
Every `/api/` route but login needs credentials (auth.py); every write passes the CSRF checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web

from cluster.client.tls import data_dir_ca
from cluster.management.actions import ActionError, Actions, json_error
from cluster.management.auth import (
    UI_HEADER,
    WRITE_METHODS,
    Authenticator,
    Principal,
    Refused,
    check_same_origin,
)
from cluster.management.node import ManagedNode
from cluster.management.peers import PeerStatuses
from cluster.management.reads import Reads
from cluster.management.samples import Sampler
from cluster.node.listening import log_address, socket_address
from cluster.node.metrics import MetricsUnavailable, NodeMetrics

if TYPE_CHECKING:
    from prometheus_client import Histogram

log = structlog.get_logger("cluster.management")

GROUP_TRACK_PERIOD_S = 1.0
CLIENT_MAX_SIZE = 4 * 1024 * 1024  # aiohttp's own bound on a request body
LOGIN_BYTES_MAX = 4096
PRINCIPAL = web.RequestKey("principal", Principal)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
STATIC = resources.files("cluster.management") / "static"
PUBLIC = frozenset({"/api/login"})
UNTIMED = frozenset({"/api/cluster", "/metrics"})  # the first waits for peers, the second scrapes
READ_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)


class ManagementServer:
    """The HTTP API and UI of one node: started and stopped by the node's `serve`."""

    def __init__(self, node: ManagedNode, data_dir: Path) -> None:
        self.node = node
        port = node.node.http_port
        assert port is not None, "a management server needs the node's http_port"
        self.port = port
        self.bind = node.cluster.http_bind
        self.auth = Authenticator(node.client_key, node.cluster.users, f"quorumq_session_{port}")
        self.sampler = Sampler(lambda: node.replica, node.metrics)
        self._read_seconds = _read_histogram(node.metrics)
        peers = PeerStatuses(node.client_key, data_dir_ca(data_dir, node.cluster.tls))
        self.reads = Reads(node, self.sampler, peers)
        self.actions = Actions(node)
        self._runner: web.AppRunner | None = None
        self._task: asyncio.Task[None] | None = None

    def application(self) -> web.Application:
        """The aiohttp application with every route."""
        app = web.Application(middlewares=[self._guard], client_max_size=CLIENT_MAX_SIZE)
        r, w = self.reads, self.actions
        app.router.add_get("/", _index)
        app.router.add_static("/static/", Path(str(STATIC)), follow_symlinks=False)
        app.router.add_post("/api/login", self._login)
        app.router.add_post("/api/logout", self._logout)
        app.router.add_get("/api/whoami", self._whoami)
        app.router.add_get("/api/overview", r.overview)
        app.router.add_get("/api/cluster", r.cluster)
        app.router.add_get("/api/samples", r.samples)
        app.router.add_get("/api/queues", r.queues)
        app.router.add_get("/api/queues/{name}", r.queue)
        app.router.add_get("/api/queues/{name}/samples", r.samples)
        app.router.add_get("/api/queues/{name}/messages", r.messages)
        app.router.add_get("/api/queues/{name}/groups", r.groups)
        app.router.add_get("/api/consumer-groups", r.consumer_groups)
        app.router.add_get("/api/consumer-groups/{name}", r.consumer_group)
        app.router.add_get("/api/connections", r.connections)
        app.router.add_put("/api/queues/{name}", w.declare)
        app.router.add_delete("/api/queues/{name}", w.delete)
        app.router.add_post("/api/queues/{name}/purge", w.purge)
        app.router.add_post("/api/queues/{name}/publish", w.publish)
        app.router.add_post("/api/queues/{name}/get", w.get)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def start(self) -> None:
        """Listen on `http_bind:http_port` and start sampling; MetricsUnavailable when the port
        cannot be bound (the node exits 69 and says so)."""
        self._runner = web.AppRunner(self.application(), access_log=None, handle_signals=False)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.bind, self.port).start()
        except OSError as err:
            await self._runner.cleanup()
            raise MetricsUnavailable(
                f"cannot serve the management API on {self.bind}:{self.port}: {err}"
            ) from err
        self._task = asyncio.create_task(self._sample_forever())
        log.info("management_started", url=f"http://{self.bind}:{self.port}/")
        for address in self._runner.addresses:
            log_address("http", socket_address(address), tls=False)

    async def stop(self) -> None:
        """Stop sampling and serving."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._runner is not None:
            await self._runner.cleanup()

    async def _sample_forever(self) -> None:
        while True:
            try:
                self.sampler.tick()
            except Exception:
                log.exception("management_sample_failed")
            await asyncio.sleep(GROUP_TRACK_PERIOD_S)

    # --- middleware: credentials, rights, CSRF, errors ---------------------------------------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        try:
            if (path.startswith("/api/") or path == "/metrics") and path not in PUBLIC:
                principal = await self.auth.authenticate(request)
                if request.method in WRITE_METHODS and path != "/api/logout":
                    self.auth.check_write(request, principal)
                request[PRINCIPAL] = principal
            if self._read_seconds is None or request.method != "GET" or path in UNTIMED:
                return await handler(request)
            started = time.perf_counter()  # these handlers never await: this is loop time
            response = await handler(request)
            self._read_seconds.observe(time.perf_counter() - started)
            return response
        except Refused as err:
            response = json_error(err.status, err.message)
            if err.status == 401 and UI_HEADER not in request.headers:
                response.headers["WWW-Authenticate"] = 'Basic realm="quorumq"'
            return response
        except ActionError as err:
            return json_error(err.status, err.message)

    # --- login ----------------------------------------------------------------------------

    async def _login(self, request: web.Request) -> web.Response:
        check_same_origin(request)
        raw = await request.content.read(LOGIN_BYTES_MAX)
        try:
            found = _login_fields(raw)
        except ValueError as err:
            return json_error(400, str(err))
        principal = await self.auth.check_password(*found)
        token = self.auth.new_session(principal)
        response = web.json_response(self._who(principal, token))
        response.set_cookie(self.auth.cookie, token, httponly=True, samesite="Strict", path="/")
        return response

    async def _logout(self, request: web.Request) -> web.Response:
        response = web.json_response({"logged_out": True})
        response.del_cookie(self.auth.cookie, path="/")
        return response

    async def _whoami(self, request: web.Request) -> web.Response:
        principal = request[PRINCIPAL]
        return web.json_response(self._who(principal, principal.session))

    def _who(self, principal: Principal, session: str | None) -> dict[str, Any]:
        return {
            "user": principal.name,
            "rights": principal.rights,
            "csrf": self.auth.csrf_token(session) if session is not None else None,
            "node": self.node.node_id,
            "cluster": self.node.cluster.name,
        }

    async def _metrics(self, request: web.Request) -> web.Response:
        """The node's Prometheus registry: the very counters the API and the UI show."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        metrics = self.node.metrics
        if not isinstance(metrics, NodeMetrics):
            return json_error(404, "this node counts nothing (no metrics)")
        response = web.Response(body=generate_latest(metrics.registry))
        response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
        return response


def _read_histogram(metrics: object) -> Histogram | None:
    """The histogram of the loop time one API read takes, in the node's registry (/metrics)."""
    if not isinstance(metrics, NodeMetrics):
        return None
    from prometheus_client import Histogram

    return Histogram(
        "quorumq_management_read_seconds",
        "Time the node's loop spends answering one read of the management API (GET; not "
        "/api/cluster, which waits for the other nodes, nor /metrics).",
        buckets=READ_BUCKETS,
        registry=metrics.registry,
    )


async def _index(request: web.Request) -> web.Response:
    return web.Response(
        body=(STATIC / "index.html").read_bytes(),
        content_type="text/html",
        headers={"Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
                 "X-Frame-Options": "DENY"},
    )  # fmt: skip


def _login_fields(raw: bytes) -> tuple[str, str]:
    if len(raw) >= LOGIN_BYTES_MAX:
        raise ValueError(f"a login body of less than {LOGIN_BYTES_MAX} bytes")
    try:
        found = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"the body is not JSON: {err}") from err
    if not isinstance(found, dict):
        raise ValueError("the body must be {'user': ..., 'password': ...}")
    user, password = found.get("user"), found.get("password")
    if not isinstance(user, str) or not isinstance(password, str):
        raise ValueError("the body must be {'user': ..., 'password': ...}")
    return user, password
