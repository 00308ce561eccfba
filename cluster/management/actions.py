"""The write API: declare, delete and purge a queue, publish a message, get (ack or requeue).

Each action is a fifo command proposed through this node's replica, exactly as a client's would
be (and counted by the same metrics). A get holds a connection of this node for its duration,
and gives back what it took bound to that connection, as a client would (machine v4 accepts a
settle only from the consumer's own connection, issue 31). No action here settles or requeues
another connection's deliveries.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import json
from typing import Any

from aiohttp import web

from cluster.management.jsonable import body_json, to_json
from cluster.management.node import ManagedNode
from cluster.node.session import PUBLISH_BODY_BYTES_MAX, bind_owner
from fifo.commands import (
    Checkout,
    ConsumerId,
    DeclareQueue,
    DeleteQueue,
    Dequeue,
    Enqueue,
    Purge,
    QueueConfig,
    Return,
)
from fifo.replies import DequeuedMessage, DequeueOk, Error
from raft.errors import SubmitError
from raft.replica import Reply
from raft.replicated import InternalFailure

REQUEST_BYTES_MAX = 2 * PUBLISH_BODY_BYTES_MAX  # a base64 body and its JSON around it
GET_COUNT_MAX = 100
COMMAND_TIMEOUT_S = 10.0
CONFIG_FIELDS = {f.name: f.type for f in dataclasses.fields(QueueConfig)}


def json_error(status: int, message: str) -> web.Response:
    """A JSON error answer."""
    return web.json_response({"error": message}, status=status)


class ActionError(Exception):
    """Raised for a write the caller got wrong (400) or the cluster refused (409/503)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Actions:
    """The handlers of the POST and DELETE endpoints."""

    def __init__(self, node: ManagedNode) -> None:
        self.node = node

    async def _command(self, command: Any) -> Reply:
        refusal = self.node.unavailable_reason(for_read=False)
        if refusal is not None:
            raise ActionError(503, f"{refusal}; nothing was submitted")
        done: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()

        def settle(reply: Reply) -> None:
            if not done.done():
                done.set_result(reply)

        self.node.replica.propose(command, self.node.metrics.count(command, settle))
        try:
            reply = await asyncio.wait_for(done, COMMAND_TIMEOUT_S)
        except TimeoutError as err:
            raise ActionError(503, "no answer from the cluster in time") from err
        if isinstance(reply, SubmitError):
            raise ActionError(503, reply.message)
        if isinstance(reply, InternalFailure):
            raise ActionError(500, reply.message)
        if isinstance(reply, Error):
            raise ActionError(409, f"{reply.code}: {reply.message}")
        return reply

    async def declare(self, request: web.Request) -> web.Response:
        """Declare the queue in the path with the config in the body (QueueConfig fields)."""
        body = await _json_body(request)
        config = QueueConfig(**_config_fields(body.get("config", {})))
        reply = await self._command(DeclareQueue(request.match_info["name"], config))
        return web.json_response(to_json(reply))

    async def delete(self, request: web.Request) -> web.Response:
        """Delete the queue in the path, with everything in it."""
        reply = await self._command(DeleteQueue(request.match_info["name"]))
        return web.json_response(to_json(reply))

    async def purge(self, request: web.Request) -> web.Response:
        """Drop every waiting message of the queue in the path."""
        reply = await self._command(Purge(request.match_info["name"]))
        return web.json_response(to_json(reply))

    async def publish(self, request: web.Request) -> web.Response:
        """Publish one message: `{"body": text}` or `{"body_base64": ...}`, `ttl_ms`."""
        body = await _json_body(request)
        payload = _payload(body)
        ttl = body.get("ttl_ms")
        if ttl is not None and (not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0):
            raise ActionError(400, "ttl_ms must be a non-negative integer")
        enqueue = Enqueue(request.match_info["name"], payload, None, None, None, ttl)
        reply = await self._command(enqueue)
        return web.json_response(to_json(reply))

    async def get(self, request: web.Request) -> web.Response:
        """Take up to `count` messages; `mode` "requeue" (default: each returned at once, a
        redelivery) or "ack" (removed)."""
        body = await _json_body(request)
        count, mode = body.get("count", 1), body.get("mode", "requeue")
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= GET_COUNT_MAX:
            raise ActionError(400, f"count must be an integer in 1..{GET_COUNT_MAX}")
        if mode not in ("requeue", "ack"):
            raise ActionError(400, "mode must be 'requeue' or 'ack'")
        connection = self.node.new_connection()
        self.node.router.register(connection, _ignore)
        taken: list[tuple[Any, DequeuedMessage]] = []
        queue = request.match_info["name"]
        try:
            for number in range(count):
                consumer = ConsumerId(f"management-get-{number}", connection)
                reply = await self._command(Checkout(queue, consumer, Dequeue(mode == "ack")))
                if not isinstance(reply, DequeueOk) or reply.message is None:
                    break
                key = reply.consumer_key if reply.consumer_key is not None else consumer
                taken.append((key, reply.message))
        finally:
            if mode == "requeue":  # all held first, so that `count` gets distinct messages
                version = self.node.replica.read(lambda view: view.meta.effective_version)
                for key, message in taken:  # bound like a client's: the get owns them
                    give_back = Return(queue, key, (message.msg_id,))
                    await self._command(bind_owner(give_back, connection, int(version)))
            self.node.router.unregister(connection)  # the node closes it through the log
        return web.json_response({"messages": [_message_json(m) for _key, m in taken]})


def _message_json(message: DequeuedMessage) -> dict[str, Any]:
    return {"msg_id": message.msg_id, "redelivered": message.redelivered,
            "delivery_count": message.delivery_count, "body": body_json(message.body)}  # fmt: skip


def _ignore(_message: dict[str, Any]) -> None:
    """A get's connection receives no pushed deliveries (a dequeue answers in its reply)."""


async def _json_body(request: web.Request) -> dict[str, Any]:
    if request.content_length is not None and request.content_length > REQUEST_BYTES_MAX:
        raise ActionError(413, f"a request body of at most {REQUEST_BYTES_MAX} bytes")
    raw = await request.content.read(REQUEST_BYTES_MAX + 1)
    if len(raw) > REQUEST_BYTES_MAX:
        raise ActionError(413, f"a request body of at most {REQUEST_BYTES_MAX} bytes")
    if not raw:
        return {}
    try:
        found = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise ActionError(400, f"the body is not JSON: {err}") from err
    if not isinstance(found, dict):
        raise ActionError(400, "the body must be a JSON object")
    return found


def _config_fields(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ActionError(400, "config must be an object of QueueConfig fields")
    unknown = sorted(set(raw) - set(CONFIG_FIELDS))
    if unknown:
        raise ActionError(400, f"unknown config fields {unknown}; known: {sorted(CONFIG_FIELDS)}")
    for name, value in raw.items():
        if value is not None and not isinstance(value, (bool, int, str)):
            raise ActionError(400, f"config field {name} must be a boolean, integer or string")
    return dict(raw)


def _payload(body: dict[str, Any]) -> bytes:
    if isinstance(body.get("body"), str):
        payload = str(body["body"]).encode("utf-8")
    elif isinstance(body.get("body_base64"), str):
        try:
            payload = base64.b64decode(str(body["body_base64"]), validate=True)
        except binascii.Error as err:
            raise ActionError(400, f"body_base64 does not decode: {err}") from err
    else:
        raise ActionError(400, "give the message as 'body' (text) or 'body_base64'")
    if len(payload) > PUBLISH_BODY_BYTES_MAX:
        raise ActionError(400, f"a body of at most {PUBLISH_BODY_BYTES_MAX} bytes")
    return payload
