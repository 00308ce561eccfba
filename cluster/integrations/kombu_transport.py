"""A kombu transport over quorumq: `quorumq://host:port,host:port/?credentials=PATH`.

Importing this module registers the `quorumq` scheme in kombu's transport aliases, so a Celery
app needs two lines (see docs/celery.md):

    import cluster.integrations.kombu_transport  # registers quorumq://
    app.conf.broker_url = "quorumq://127.0.0.1:5701,127.0.0.1:5702/?credentials=/D/client.key"

`credentials` is the path of the cluster's `client.key` (`data_dir=D` reads `D/cluster.toml` and
`D/client.key` instead, and the cluster CA `D/tls/ca.crt` when cluster.toml says `tls = true`).
Against a `tls = true` cluster given by endpoints, `tls_ca=PATH` names the cluster CA file.
Mapping onto quorumq:

- a kombu queue is a quorumq queue, declared on first use (declare, publish or get) with what
  the queue arguments can express: `x-dead-letter-routing-key` (or the one queue bound to
  `x-dead-letter-exchange`) as the dead-letter queue, `x-max-length`, `x-max-length-bytes`,
  `x-overflow`, `x-message-ttl`, `x-delivery-limit`, `x-single-active-consumer`,
  `x-consumer-timeout`, and quorumq's `x-disconnected-timeout` (ms). Others (`x-expires`,
  `x-max-priority`, ...) are not expressible and are ignored. Declaring an existing queue
  with another configuration raises PRECONDITION_FAILED.
- exchanges and bindings are kombu's in-process (virtual) ones, as with kombu's other virtual
  transports: direct and topic exchanges route to the queues bound in this process; the
  default exchange ("") routes to the queue named by the routing key. No fanout.
- every publish waits for its confirm (the message is committed in the replicated log); the
  message's `expiration` property becomes its per-message TTL.
- `basic_consume` attaches a quorumq consumer whose credit is the channel's prefetch count
  (`basic_qos`; 0 means the transport option `unlimited_prefetch`, default 1000); deliveries are
  pushed by the node into a queue that `drain_events` blocks on (no polling).
- `basic_ack` settles, `basic_reject(requeue=True)` returns the message, `requeue=False`
  discards it (dead-lettered when the queue has a dead-letter queue). Closing a channel returns
  its unacked messages (and deletes the `auto_delete` queues it declared, if no consumer is
  left); when the connection goes down (the worker died), the cluster returns every message the
  connection had checked out.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.metadata
import itertools
import queue as queue_lib
import threading
import uuid
import weakref
from collections import OrderedDict
from pathlib import Path
from time import monotonic
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from amqp.protocol import queue_declare_ok_t
from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, virtual
from kombu.transport.base import to_rabbitmq_queue_arguments
from kombu.utils.json import dumps, loads

from cluster import config as cluster_config
from cluster.client import (
    Client,
    ClientClosed,
    ClusterError,
    CommandRefused,
    Consumer,
    Publisher,
    RequestTimeout,
    Unavailable,
)
from cluster.client import Message as Delivered
from cluster.client._log import get_logger
from cluster.client.tls import data_dir_ca
from cluster.errors import ConfigError
from fifo import limits as fifo_limits
from fifo.commands import QueueConfig

log = get_logger("quorumq.kombu")

SCHEME = "quorumq"
UNLIMITED_PREFETCH_DEFAULT = 1000  # credit for prefetch_count=0 (quorumq credit is finite)
PREFETCH_MAX = fifo_limits.prefetch_max  # what a checkout accepts
PUBLISHERS_PER_CHANNEL_MAX = 256  # confirmed publishers kept per channel (one per queue)
HEALTH_CHECK_S = 1.0  # while drain_events waits, check the client this often
PLAIN_CONTENT_TYPE = "application/data"
_OVERFLOW = {"drop-head": "drop_head", "reject-publish": "reject_publish"}
_IGNORED_ARGUMENTS = frozenset({"x-expires", "x-max-priority", "x-queue-type", "x-queue-mode"})


def parse_url(url: str) -> tuple[list[str], dict[str, str]]:
    """`quorumq://h:p,h:p/?k=v` -> (["h:p", "h:p"], {"k": "v"}); ValueError when malformed."""
    parts = urlsplit(url)
    if parts.scheme != SCHEME:
        raise ValueError(f"not a {SCHEME}:// URL: {url!r}")
    endpoints = [unquote(e.strip()) for e in parts.netloc.split(",") if e.strip()]
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"endpoint {endpoint!r} in {url!r} is not host:port")
    return endpoints, dict(parse_qsl(parts.query))


# query keys whose values are masked when the URL is shown (credentials= is a path, not a secret)
_SECRET_QUERY_KEYS = ("password", "secret", "token", "key")


def masked_url(url: str, mask: str = "**") -> str:
    """`url` with the password of its user part and secret-looking query values replaced by
    `mask`; anything else (endpoints, paths, option names) exactly as given."""
    parts = urlsplit(url)
    netloc = parts.netloc
    user, at, hosts = netloc.rpartition("@")
    if at and ":" in user:
        netloc = f"{user.partition(':')[0]}:{mask}@{hosts}"
    pairs = []
    for pair in parts.query.split("&") if parts.query else []:
        name, eq, value = pair.partition("=")
        secret = any(word in name.lower() for word in _SECRET_QUERY_KEYS)
        pairs.append(f"{name}={mask}" if eq and secret and value else pair)
    return urlunsplit(parts._replace(netloc=netloc, query="&".join(pairs)))


def queue_config(arguments: dict[str, Any] | None, resolve_dlx: Any = None) -> QueueConfig:
    """The QueueConfig that AMQP-style queue `arguments` express (see the module doc)."""
    args = dict(arguments or {})
    fields: dict[str, Any] = {}
    dlq = args.pop("x-dead-letter-routing-key", None)
    dlx = args.pop("x-dead-letter-exchange", None)
    if dlq is None and dlx:
        dlq = resolve_dlx(dlx) if resolve_dlx is not None else None
        if dlq is None:
            raise ChannelError(
                f"quorumq dead-letters to a queue: exchange {dlx!r} has no bound queue here; "
                "set x-dead-letter-routing-key (kombu: dead_letter_routing_key) to the queue"
            )
    if dlq:
        fields["dead_letter_queue"] = str(dlq)
    for name, field in (
        ("x-max-length", "max_length"),
        ("x-max-length-bytes", "max_bytes"),
        ("x-message-ttl", "message_ttl_ms"),
        ("x-delivery-limit", "delivery_limit"),
        ("x-consumer-timeout", "consumer_timeout_ms"),
        ("x-disconnected-timeout", "disconnected_timeout_ms"),  # quorumq's own
    ):
        if name in args:
            fields[field] = int(args.pop(name))
    if "x-overflow" in args:
        overflow = str(args.pop("x-overflow"))
        if overflow not in _OVERFLOW:
            raise ChannelError(f"x-overflow {overflow!r}: quorumq supports {sorted(_OVERFLOW)}")
        fields["overflow"] = _OVERFLOW[overflow]
    if "x-single-active-consumer" in args:
        fields["single_active_consumer"] = bool(args.pop("x-single-active-consumer"))
    unknown = sorted(set(args) - _IGNORED_ARGUMENTS)
    if unknown:
        log.warning("queue_arguments_ignored", arguments=unknown)
    return QueueConfig(**fields)


def _field(value: Any, name: str) -> int:
    """A counter of an overview, whether the client returns a map or a typed object."""
    found = value.get(name, 0) if isinstance(value, dict) else getattr(value, name, 0)
    return int(found or 0)


class _Subscription:
    """One `basic_consume`: a quorumq consumer feeding the transport's inbox."""

    def __init__(
        self, channel: Channel, queue: str, tag: str, no_ack: bool, callback: Any, prefetch: int
    ) -> None:
        self.channel = channel
        self.queue = queue
        self.tag = tag
        self.no_ack = no_ack
        self.callback = callback
        self.cancelled = False
        self.prefetch = prefetch
        self._inbox = channel.connection.inbox  # kept: the channel drops its transport on close
        self.consumer: Consumer = self.channel.qq.consume(
            queue, prefetch=prefetch, auto_ack=no_ack, on_message=self._push
        )

    def _push(self, message: Delivered) -> None:
        """Consumer thread: hand the delivery to whoever drains events."""
        if self.cancelled:
            self._give_back(message)
            return
        self._inbox.put((self, message))

    def _give_back(self, message: Delivered) -> None:
        if not self.no_ack:
            with contextlib.suppress(ClusterError, ValueError):
                message.nack(requeue=True)

    def set_prefetch(self, prefetch: int) -> None:
        """A new credit: the same consumer checks out again with the new prefetch (the
        machine updates it in place: credit = prefetch - checked out)."""
        if prefetch == self.prefetch or self.cancelled:
            return
        self.prefetch = prefetch
        self.consumer.set_prefetch(prefetch)

    def cancel(self) -> None:
        self.cancelled = True
        with contextlib.suppress(ClusterError):
            self.consumer.cancel()
        self.consumer.close()


class Channel(virtual.Channel):  # type: ignore[misc]
    """A kombu channel on the transport's quorumq client."""

    do_restore = False  # unacked messages stay checked out in the cluster, not in this process
    supports_fanout = False
    connection: Transport

    def __init__(self, connection: Transport, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self._lock = threading.RLock()
        self._tags = itertools.count(1)
        self._unacked: OrderedDict[str, tuple[_Subscription | None, Delivered]] = OrderedDict()
        self._subscriptions: dict[str, _Subscription] = {}
        self._publishers: OrderedDict[str, Publisher] = OrderedDict()
        self._prefetch = 0
        self._auto_delete: set[str] = set()  # auto_delete queues declared on this channel

    @property
    def qq(self) -> Client:
        """The connection's quorumq client."""
        return self.connection.require_client()

    # --- queues -----------------------------------------------------------------------------

    def _declare(self, queue: str, config: QueueConfig, explicit: bool) -> None:
        try:
            self.qq.declare_queue(queue, config)
        except CommandRefused as err:
            if err.code != "queue_exists":
                raise ChannelError(f"declaring queue {queue!r}: {err}") from err
            if explicit:
                raise ChannelError(
                    f"PRECONDITION_FAILED - queue {queue!r} exists with another configuration "
                    f"({err.message})",
                    (50, 10),
                    "Channel.queue_declare",
                    "406",
                ) from err
        self.connection.declared.add(queue)

    def _ensure_declared(self, queue: str) -> None:
        if queue not in self.connection.declared:
            self._declare(queue, QueueConfig(), explicit=False)

    def _bound_queue(self, exchange: str) -> str | None:
        queues = {q for q, *_ in self.state.exchanges.get(exchange, {}).get("table", [])}
        return queues.pop() if len(queues) == 1 else None

    def queue_declare(
        self,
        queue: str | None = None,
        passive: bool = False,
        arguments: dict[str, Any] | None = None,
        auto_delete: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Declare (create if missing) a quorumq queue; `passive` only checks it exists.

        An `auto_delete` queue is deleted when this channel closes if no consumer is left on
        it (AMQP deletes it as its last consumer leaves; Celery's RPC result backend cancels
        and consumes its reply queue again around every result, so the channel's end is the
        safe point); e.g. the RPC backend's reply queues go with their client."""
        queue = queue or f"amq.gen-{uuid.uuid4()}"
        if passive:
            if not self._has_queue(queue):
                raise ChannelError(
                    f"NOT_FOUND - no queue {queue!r}", (50, 10), "Channel.queue_declare", "404"
                )
        else:
            config = queue_config(arguments, self._bound_queue)
            if config.dead_letter_queue:
                self._ensure_declared(config.dead_letter_queue)
            self._declare(queue, config, explicit=True)
            if auto_delete:
                self._auto_delete.add(queue)
        overview = self.qq.overview(queue)
        ready = _field(overview, "ready") + _field(overview, "returned")
        return queue_declare_ok_t(queue, ready, _field(overview, "consumers"))

    def prepare_queue_arguments(self, arguments: dict[str, Any], **kwargs: Any) -> Any:
        """kombu's Queue(message_ttl=, max_length=, expires=...) as x-arguments."""
        return to_rabbitmq_queue_arguments(arguments, **kwargs)

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        return queue in list(self.qq.queues())

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        self._ensure_declared(queue)

    def _size(self, queue: str) -> int:
        overview = self.qq.overview(queue)
        return _field(overview, "ready") + _field(overview, "returned")

    def _purge(self, queue: str) -> int:
        return int(self.qq.purge_queue(queue).count)

    def queue_delete(
        self, queue: str, if_unused: bool = False, if_empty: bool = False, **kwargs: Any
    ) -> int:
        """Delete the quorumq queue (unless `if_unused`/`if_empty` say to keep it)."""
        if if_unused or if_empty:
            overview = self.qq.overview(queue)
            if if_empty and _field(overview, "total"):
                return 0
            if if_unused and _field(overview, "consumers"):
                return 0
        try:
            deleted = int(self.qq.delete_queue(queue).messages)
        except CommandRefused as err:
            if err.code != "unknown_queue":
                raise
            deleted = 0
        self.state.queue_bindings_delete(queue)
        self.connection.declared.discard(queue)
        return deleted

    # --- publishing -------------------------------------------------------------------------

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        """Publish and wait for the confirm (declaring the queue on first use)."""
        body = dumps(message).encode("utf-8")
        expiration = message.get("properties", {}).get("expiration")
        ttl_ms = int(expiration) if expiration not in (None, "") else None
        with self._lock:
            self._ensure_declared(queue)
            for attempt in (1, 2):
                publisher = self._publisher(queue)
                try:
                    publisher.publish(body, ttl_ms=ttl_ms)
                    publisher.wait_for_confirms()
                    return
                except CommandRefused as err:
                    self._drop_publisher(queue)
                    if err.code != "unknown_queue" or attempt == 2:
                        raise ChannelError(f"publish to {queue!r} refused: {err}") from err
                    self.connection.declared.discard(queue)  # deleted meanwhile: declare again
                    self._ensure_declared(queue)
                except ClusterError:
                    self._drop_publisher(queue)
                    raise

    def _publisher(self, queue: str) -> Publisher:
        publisher = self._publishers.pop(queue, None) or self.qq.publisher(queue, window=1)
        self._publishers[queue] = publisher  # most recently used last
        while len(self._publishers) > PUBLISHERS_PER_CHANNEL_MAX:
            _, oldest = self._publishers.popitem(last=False)
            oldest.close()
        return publisher

    def _drop_publisher(self, queue: str) -> None:
        publisher = self._publishers.pop(queue, None)
        if publisher is not None:
            publisher.close()

    # --- consuming --------------------------------------------------------------------------

    def _credit(self) -> int:
        return min(self._prefetch or self.connection.unlimited_prefetch, PREFETCH_MAX)

    def basic_qos(
        self, prefetch_size: int = 0, prefetch_count: int = 0, apply_global: bool = False
    ) -> None:
        """The prefetch count becomes the credit of this channel's consumers."""
        self._prefetch = int(prefetch_count or 0)
        for subscription in list(self._subscriptions.values()):
            subscription.set_prefetch(self._credit())

    def basic_consume(
        self, queue: str, no_ack: bool, callback: Any, consumer_tag: str, **kwargs: Any
    ) -> str:
        """Attach a quorumq consumer; its deliveries reach `callback` through drain_events."""
        self._ensure_declared(queue)
        subscription = _Subscription(self, queue, consumer_tag, no_ack, callback, self._credit())
        self._subscriptions[consumer_tag] = subscription
        self._tag_to_queue[consumer_tag] = queue
        self._consumers.add(consumer_tag)
        return consumer_tag

    def basic_cancel(self, consumer_tag: str) -> None:
        """Stop delivering to `consumer_tag`; its unacked messages stay unacked."""
        subscription = self._subscriptions.pop(consumer_tag, None)
        self._consumers.discard(consumer_tag)
        self._tag_to_queue.pop(consumer_tag, None)
        if subscription is not None:
            subscription.cancel()

    def _delete_if_unused(self, queue: str) -> None:
        try:
            overview = self.qq.overview(queue)
            if overview is not None and not _field(overview, "consumers"):
                self.queue_delete(queue)
        except ClusterError as err:  # best effort: the queue stays
            log.info("auto_delete_failed", queue=queue, error=str(err))

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        """Take one ready message (None when the queue is empty)."""
        try:
            found = self.qq.get(queue, settled=no_ack)
        except CommandRefused as err:
            raise ChannelError(f"basic_get from {queue!r}: {err}") from err
        return None if found is None else self._to_kombu(found, None, queue)

    def deliver(self, subscription: _Subscription, found: Delivered) -> bool:
        """drain_events: call the consumer's callback (False if it was cancelled meanwhile)."""
        if subscription.cancelled or self.closed:
            subscription._give_back(found)
            return False
        subscription.callback(self._to_kombu(found, subscription, subscription.queue))
        return True

    def _to_kombu(self, found: Delivered, subscription: _Subscription | None, queue: str) -> Any:
        try:
            payload = loads(found.body)
            if not isinstance(payload, dict) or "properties" not in payload:
                raise ValueError("not a kombu message")
        except ValueError:  # published by a plain quorumq client: hand over the raw bytes
            payload = {
                "body": found.body,
                "content-type": PLAIN_CONTENT_TYPE,
                "content-encoding": "binary",
                "headers": {},
                "properties": {"body_encoding": None},
            }
        properties = payload["properties"]
        tag = f"{self.channel_id}.{next(self._tags)}"
        properties["delivery_tag"] = tag
        info = dict(properties.get("delivery_info") or {})
        info.setdefault("routing_key", queue)
        info.setdefault("exchange", "")
        info["redelivered"] = found.redelivered
        if subscription is not None:
            info["consumer_tag"] = subscription.tag
        properties["delivery_info"] = info
        no_ack = subscription.no_ack if subscription is not None else found.consumer is None
        if not no_ack:
            with self._lock:
                self._unacked[tag] = (subscription, found)
        return self.Message(payload, channel=self)

    # --- settling ---------------------------------------------------------------------------

    def _take(self, delivery_tag: str, multiple: bool) -> list[tuple[_Subscription | None, Any]]:
        with self._lock:
            if not multiple:
                item = self._unacked.pop(delivery_tag, None)
                if item is None:
                    log.warning("unknown_delivery_tag", tag=delivery_tag)
                return [] if item is None else [item]
            if delivery_tag not in self._unacked:
                log.warning("unknown_delivery_tag", tag=delivery_tag)
                return []
            taken = []
            while self._unacked:
                tag, item = self._unacked.popitem(last=False)
                taken.append(item)
                if tag == delivery_tag:
                    break
            return taken

    def basic_ack(self, delivery_tag: str, multiple: bool = False) -> None:
        """Settle: the message is done."""
        taken = self._take(delivery_tag, multiple)
        owners: dict[int, Consumer] = {}
        for _, found in taken:
            found.ack()
            if isinstance(found.consumer, Consumer):
                owners[id(found.consumer)] = found.consumer
        for consumer in owners.values():
            consumer.flush_acks()  # acks are batched by the client: send them now

    def basic_reject(self, delivery_tag: str, requeue: bool = False) -> None:
        """`requeue`: return the message; else discard it (dead-lettered if configured)."""
        for _, found in self._take(delivery_tag, False):
            if requeue:
                found.nack(requeue=True)
            else:
                found.reject()

    def basic_recover(self, requeue: bool = False) -> None:
        """Return every unacked message of this channel."""
        if not requeue:
            raise NotImplementedError("quorumq channels support recover(requeue=True) only")
        self._return_unacked()

    def _return_unacked(self) -> None:
        with self._lock:
            items, self._unacked = list(self._unacked.values()), OrderedDict()
        for _, found in items:
            with contextlib.suppress(ClusterError, ValueError):
                found.nack(requeue=True)

    def close(self) -> None:
        """Cancel the consumers, return the unacked messages, drop the publishers."""
        if self.closed:
            return
        for tag in list(self._subscriptions):
            with contextlib.suppress(ClusterError):
                self.basic_cancel(tag)
        if self.connection is not None and self.connection.client_alive():
            self._return_unacked()
            for queue in sorted(self._auto_delete):
                self._delete_if_unused(queue)
        for queue in list(self._publishers):
            self._drop_publisher(queue)
        super().close()


class Transport(virtual.Transport):  # type: ignore[misc]
    """kombu transport `quorumq://host:port,host:port/?credentials=PATH`."""

    Channel = Channel
    can_parse_url = True
    driver_type = SCHEME
    driver_name = "quorumq"
    implements = virtual.Transport.implements.extend(
        asynchronous=False, exchange_type=frozenset(["direct", "topic"]), heartbeats=False
    )
    connection_errors = (
        *virtual.Transport.connection_errors,
        Unavailable,
        ClientClosed,
        RequestTimeout,
    )  # not AuthError nor ConfigError: retrying cannot fix a wrong key or URL
    channel_errors = (*virtual.Transport.channel_errors, CommandRefused)

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self.inbox: queue_lib.Queue[tuple[_Subscription, Delivered]] = queue_lib.Queue()
        self.declared: set[str] = set()
        self._qq: Client | None = None
        # registered while the client lives; a weak reference, so a dropped transport can go
        self._at_exit = functools.partial(_close_transport_at_exit, weakref.ref(self))
        options = dict(client.transport_options or {})
        self.unlimited_prefetch = int(options.get("unlimited_prefetch", UNLIMITED_PREFETCH_DEFAULT))

    # --- the quorumq client ---------------------------------------------------------------------

    def _client_arguments(self) -> tuple[list[str], bytes, dict[str, Any]]:
        conninfo = self.client
        options: dict[str, Any] = dict(conninfo.transport_options or {})
        hostname = str(conninfo.hostname or "")
        if "://" in hostname:
            endpoints, query = parse_url(hostname)
            options = {**query, **options}
        else:
            port = conninfo.port
            endpoints = [
                e if ":" in e or port is None else f"{e}:{port}" for e in hostname.split(",") if e
            ]
        data_dir = options.get("data_dir")
        cluster = cluster_config.load(Path(data_dir)) if data_dir else None
        if cluster is not None and not endpoints:
            endpoints = list(cluster.endpoints().values())
        if not endpoints:
            raise ConfigError(f"{SCHEME}:// needs at least one host:port endpoint")
        if options.get("credentials"):
            key = cluster_config.read_client_key(Path(options["credentials"]))
        elif data_dir:
            key = cluster_config.read_client_key(Path(data_dir) / cluster_config.CLIENT_KEY_FILE)
        else:
            raise ConfigError(
                f"{SCHEME}:// needs ?credentials=PATH (the cluster's client.key) or ?data_dir=D"
            )
        kwargs: dict[str, Any] = {"name": str(options.get("name", "kombu"))}
        for option in ("connect_timeout_s", "request_timeout_s", "reconnect_timeout_s"):
            if option in options:
                kwargs[option] = float(options[option])
        if options.get("tls_ca"):
            kwargs["tls"] = str(options["tls_ca"])
        elif cluster is not None:
            kwargs["tls"] = data_dir_ca(Path(str(data_dir)), cluster.tls)
        return endpoints, key, kwargs

    def establish_connection(self) -> Any:
        """Connect the quorumq client (kombu calls this once per connection)."""
        if self._qq is None:
            endpoints, key, kwargs = self._client_arguments()
            self._qq = Client(endpoints, key, **kwargs)
            atexit.register(self._at_exit)
        return super().establish_connection()

    def _close_at_exit(self) -> None:
        """At interpreter exit, a connection the application did not close: close its channels
        (their auto_delete queues, e.g. Celery's RPC reply queues, go with them; unacked
        messages go back) and the client."""
        if self._qq is None:
            return
        for channel in list(self.channels):
            with contextlib.suppress(Exception):  # exiting anyway: one failure must not stop
                channel.close()
        client, self._qq = self._qq, None
        client.close()

    def require_client(self) -> Client:
        """The live client; a connection error when there is none."""
        if self._qq is None:
            raise ClientClosed("the quorumq connection is closed")
        return self._qq

    def client_alive(self) -> bool:
        """Whether the client is connected (or reconnecting) rather than closed or failed."""
        if self._qq is None:
            return False
        try:
            self._qq.connection_id  # noqa: B018 - raises when the client has failed
        except ClusterError:
            return False
        return True

    def close_connection(self, connection: Any) -> None:
        """Close the channels (returning their unacked messages), then the client."""
        atexit.unregister(self._at_exit)
        try:
            super().close_connection(connection)
        finally:
            client, self._qq = self._qq, None
            if client is not None:
                client.close()

    # --- receiving --------------------------------------------------------------------------

    def drain_events(self, connection: Any, timeout: float | None = None) -> None:
        """Block until one delivery was handed to its consumer (socket.timeout at `timeout`)."""
        deadline = None if timeout is None else monotonic() + timeout
        while True:
            left = HEALTH_CHECK_S if deadline is None else deadline - monotonic()
            try:
                subscription, found = self.inbox.get(timeout=max(0.0, min(left, HEALTH_CHECK_S)))
            except queue_lib.Empty:
                self.require_client().connection_id  # noqa: B018 - raises a connection error
                if deadline is not None and monotonic() >= deadline:
                    raise TimeoutError() from None  # socket.timeout, as kombu expects
                continue
            if subscription.channel.deliver(subscription, found):
                return

    def as_uri(self, uri: str, include_password: bool = False, mask: str = "**") -> str:
        """The URL as given, for banners and logs (kombu's parser would choke on the
        comma-separated endpoints), with a password and secret-looking query values masked
        unless `include_password`."""
        return uri if include_password else masked_url(uri, mask)

    def driver_version(self) -> str:
        """The installed quorumq version."""
        try:
            return importlib.metadata.version("quorumq")
        except importlib.metadata.PackageNotFoundError:
            return "unknown"


def _close_transport_at_exit(ref: weakref.ReferenceType[Transport]) -> None:
    transport = ref()
    if transport is not None:
        transport._close_at_exit()


TRANSPORT_ALIASES.setdefault(SCHEME, f"{__name__}:Transport")
