"""Every limit of the AMQP listener, named with its unit (the values RabbitMQ uses by default
where it has one)."""

from __future__ import annotations

from cluster.node.session import PUBLISH_BODY_BYTES_MAX

frame_bytes_max = 131_072  # offered in connection.tune (RabbitMQ's default frame_max)
frame_bytes_min = 4_096  # the specification's minimum frame size
channels_per_connection_max = 2_047  # offered channel_max (RabbitMQ's default)
connections_per_node_max = 1_000  # more are refused with 530 NOT_ALLOWED
heartbeat_s_default = 60  # offered heartbeat interval (RabbitMQ's default)
handshake_timeout_s = 10.0  # protocol header to connection.open (RabbitMQ: 10 s)
body_bytes_max = PUBLISH_BODY_BYTES_MAX  # a larger publish closes the channel with 406
properties_bytes_max = 64 * 1024  # the encoded properties of one message (headers included)
publishes_in_flight_max = 10_000  # unconfirmed publishes of one connection: reading pauses
consumers_per_channel_max = 1_000
prefetch_unlimited = 65_535  # prefetch 0 (unlimited in AMQP) is this many (fifo's maximum)
read_bytes = 256 * 1024
write_buffer_bytes_max = 64 * 1024 * 1024  # a client that reads slower than this is closed
