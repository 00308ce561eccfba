"""The listener at the frame level (a raw socket speaking through pamqp): negotiation limits,
heartbeats, connection exceptions with RabbitMQ's reply codes."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pamqp import commands, frame, heartbeat

from cluster.amqp import frames, limits
from tests.amqp.conftest import AmqpCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]


class RawAmqp:
    """A minimal AMQP client: send pamqp frames, read the next one."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buffer = b""

    def send(self, channel: int, value: Any) -> None:
        self.sock.sendall(frame.marshal(value, channel))

    def next_frame(self) -> tuple[int, Any]:
        """(channel, frame) of the next frame; EOFError when the server closed."""
        while True:
            if len(self.buffer) >= 7:
                try:
                    used, channel, value = frame.unmarshal(self.buffer)
                except Exception:
                    used = 0
                if used:
                    self.buffer = self.buffer[used:]
                    return channel, value
            data = self.sock.recv(65536)
            if not data:
                raise EOFError
            self.buffer += data

    def open(self, password: str, heartbeat_s: int = 0, channel_max: int = 0) -> None:
        """Protocol header, PLAIN login, tune, connection.open."""
        self.sock.sendall(frames.PROTOCOL_HEADER)
        assert isinstance(self.next_frame()[1], commands.Connection.Start)
        response = "\x00quorumq\x00" + password
        self.send(0, commands.Connection.StartOk(response=response, mechanism="PLAIN"))
        tune = self.next_frame()[1]
        assert isinstance(tune, commands.Connection.Tune)
        assert (tune.frame_max, tune.channel_max) == (
            limits.frame_bytes_max, limits.channels_per_connection_max
        )  # fmt: skip
        self.send(0, commands.Connection.TuneOk(
            channel_max=channel_max, frame_max=tune.frame_max, heartbeat=heartbeat_s
        ))  # fmt: skip
        self.send(0, commands.Connection.Open(virtual_host="/"))
        assert isinstance(self.next_frame()[1], commands.Connection.OpenOk)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(amqp_cluster: AmqpCluster) -> Iterator[RawAmqp]:
    client = RawAmqp(amqp_cluster.port(0))
    try:
        yield client
    finally:
        client.close()


def _connection_close(raw: RawAmqp) -> commands.Connection.Close:
    while True:
        _channel, value = raw.next_frame()
        if isinstance(value, commands.Connection.Close):
            return value


def test_a_wrong_protocol_header_gets_ours_back(raw: RawAmqp) -> None:
    """The specification's answer to another protocol version: our header, then close."""
    raw.sock.sendall(b"AMQP\x00\x00\x09\x00")
    assert raw.sock.recv(8) == frames.PROTOCOL_HEADER


def test_heartbeats_are_sent_and_a_silent_client_is_closed(
    raw: RawAmqp, amqp_cluster: AmqpCluster
) -> None:
    """With heartbeat 1 s the node sends heartbeats, and closes after 2 s without a byte."""
    raw.open(amqp_cluster.password, heartbeat_s=1)
    started = time.monotonic()
    assert isinstance(raw.next_frame()[1], heartbeat.Heartbeat)
    with pytest.raises((EOFError, ConnectionError)):
        while True:
            raw.next_frame()
    assert 1.5 <= time.monotonic() - started <= 8


def test_a_channel_above_channel_max_is_504(raw: RawAmqp, amqp_cluster: AmqpCluster) -> None:
    """channel_max negotiated down to 2: channel 3 is a CHANNEL_ERROR closing the connection."""
    raw.open(amqp_cluster.password, channel_max=2)
    raw.send(3, commands.Channel.Open())
    assert _connection_close(raw).reply_code == 504


def test_a_method_on_a_channel_never_opened_is_504(raw: RawAmqp, amqp_cluster: AmqpCluster) -> None:
    """RabbitMQ's CHANNEL_ERROR - expected 'channel.open'."""
    raw.open(amqp_cluster.password)
    raw.send(5, commands.Basic.Qos(prefetch_count=1))
    close = _connection_close(raw)
    assert close.reply_code == 504 and "channel.open" in close.reply_text


def test_a_frame_over_frame_max_is_501(raw: RawAmqp, amqp_cluster: AmqpCluster) -> None:
    """A body frame larger than the negotiated frame_max: FRAME_ERROR."""
    raw.open(amqp_cluster.password)
    raw.send(1, commands.Channel.Open())
    assert isinstance(raw.next_frame()[1], commands.Channel.OpenOk)
    raw.send(1, commands.Basic.Publish(exchange="", routing_key="q"))
    big = limits.frame_bytes_max
    raw.sock.sendall(b"\x03\x00\x01" + big.to_bytes(4, "big") + bytes(big) + b"\xce")
    assert _connection_close(raw).reply_code == 501


def test_content_sent_to_a_closing_channel_is_dropped(
    raw: RawAmqp, amqp_cluster: AmqpCluster
) -> None:
    """A publish already on its way when the node closes the channel (404 here) is ignored, as
    RabbitMQ does; the connection lives on."""
    from pamqp import body, header

    raw.open(amqp_cluster.password)
    raw.send(1, commands.Channel.Open())
    assert isinstance(raw.next_frame()[1], commands.Channel.OpenOk)
    raw.send(1, commands.Queue.Declare(queue="never-declared", passive=True))
    raw.send(1, commands.Basic.Publish(exchange="", routing_key="never-declared"))
    raw.send(1, header.ContentHeader(body_size=2))
    raw.send(1, body.ContentBody(b"hi"))
    channel, close = raw.next_frame()
    assert channel == 1 and isinstance(close, commands.Channel.Close)
    assert close.reply_code == 404
    raw.send(1, commands.Channel.CloseOk())
    raw.send(2, commands.Channel.Open())
    channel, opened = raw.next_frame()
    assert channel == 2 and isinstance(opened, commands.Channel.OpenOk)


def test_a_message_over_the_size_limit_is_406_at_its_header(
    raw: RawAmqp, amqp_cluster: AmqpCluster
) -> None:
    """A content header announcing more than the limit closes the channel (RabbitMQ's 406
    text) before any body is buffered; the connection lives on."""
    from pamqp import header

    raw.open(amqp_cluster.password)
    raw.send(1, commands.Channel.Open())
    assert isinstance(raw.next_frame()[1], commands.Channel.OpenOk)
    raw.send(1, commands.Basic.Publish(exchange="", routing_key="q"))
    raw.send(1, header.ContentHeader(body_size=limits.body_bytes_max + 1))
    channel, close = raw.next_frame()
    assert channel == 1 and isinstance(close, commands.Channel.Close)
    assert close.reply_code == 406 and "larger than configured max size" in close.reply_text
    raw.send(1, commands.Channel.CloseOk())
    raw.send(2, commands.Channel.Open())
    assert raw.next_frame()[0] == 2
