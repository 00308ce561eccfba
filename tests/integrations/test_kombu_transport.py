"""The kombu transport against a real 3-node cluster: declare, confirm, credit, settle outcomes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kombu")

from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.exceptions import ChannelError

from cluster.client import AuthError, Client, TlsError
from cluster.errors import ConfigError
from cluster.integrations import kombu_transport
from cluster.launcher import LocalCluster, start_cluster, wait_until
from tests.must import must

ROOT = Path(__file__).resolve().parents[2]  # the checkout

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    started = start_cluster(tmp_path_factory.mktemp("kombu") / "D", nodes=3)
    try:
        yield started
    finally:
        started.stop()


def _url(cluster: LocalCluster) -> str:
    endpoints = ",".join(node.client_address for node in cluster.config.nodes)
    return f"quorumq://{endpoints}/?credentials={cluster.data_dir / 'client.key'}"


def _client(cluster: LocalCluster) -> Client:
    return Client([n.client_address for n in cluster.config.nodes], cluster.key)


def _drain(connection: Connection, received: list[Any], count: int) -> None:
    while len(received) < count:
        connection.drain_events(timeout=10)


def test_url_parsing_and_alias() -> None:
    from kombu.transport import TRANSPORT_ALIASES

    assert TRANSPORT_ALIASES["quorumq"] == "cluster.integrations.kombu_transport:Transport"
    endpoints, query = kombu_transport.parse_url("quorumq://a:1,b:2/?credentials=/k")
    assert endpoints == ["a:1", "b:2"]
    assert query == {"credentials": "/k"}
    for bad in ("quorumq://a/", "quorumq://a:x/", "amqp://a:1/"):
        with pytest.raises(ValueError):
            kombu_transport.parse_url(bad)


def test_the_url_is_shown_with_its_secrets_masked() -> None:
    """Celery prints the broker URL in its banner and logs (kombu's `Connection.as_uri`): a
    password in the URL, or a secret-looking query value, never appears unless asked for."""
    url = "quorumq://ops:hunter2@a:1,b:2/?credentials=/k&token=s3cr3t&name=w1"
    shown = Connection(url).as_uri()
    assert "hunter2" not in shown and "s3cr3t" not in shown
    assert shown == "quorumq://ops:**@a:1,b:2/?credentials=/k&token=**&name=w1"
    assert Connection(url).as_uri(include_password=True) == url
    plain = "quorumq://a:1/?credentials=/k"
    assert Connection(plain).as_uri() == plain


def test_queue_arguments_map_to_queue_config() -> None:
    config = kombu_transport.queue_config(
        {
            "x-dead-letter-exchange": "dlx",
            "x-dead-letter-routing-key": "dead",
            "x-max-length": 10,
            "x-max-length-bytes": 1000,
            "x-overflow": "reject-publish",
            "x-message-ttl": 5000,
            "x-delivery-limit": 3,
            "x-expires": 1000,
            "x-disconnected-timeout": 2000,
        }
    )
    assert config.disconnected_timeout_ms == 2000
    assert config.dead_letter_queue == "dead"
    assert (config.max_length, config.max_bytes, config.overflow) == (10, 1000, "reject_publish")
    assert (config.message_ttl_ms, config.delivery_limit) == (5000, 3)
    with pytest.raises(ChannelError, match="x-dead-letter-routing-key"):
        kombu_transport.queue_config({"x-dead-letter-exchange": "nowhere"})
    with pytest.raises(ChannelError, match="x-overflow"):
        kombu_transport.queue_config({"x-overflow": "reject-publish-dlx"})


def test_bad_credentials_fail_at_once(cluster: LocalCluster, tmp_path: Path) -> None:
    endpoints = cluster.config.nodes[0].client_address
    with (
        Connection(f"quorumq://{endpoints}/") as connection,
        pytest.raises(ConfigError, match=r"needs \?credentials=PATH"),
    ):
        connection.connect()
    wrong = tmp_path / "wrong.key"
    wrong.write_text("00" * 32 + "\n")
    wrong.chmod(0o600)
    with (
        Connection(f"quorumq://{endpoints}/?credentials={wrong}") as connection,
        pytest.raises(AuthError),
    ):
        connection.connect()


def test_publish_declares_with_arguments_and_is_confirmed(cluster: LocalCluster) -> None:
    queue = Queue(
        "k-args",
        Exchange("k-args", type="direct"),
        "k-args",
        queue_arguments={"x-dead-letter-routing-key": "k-args-dead", "x-max-length": 50},
        message_ttl=60,
    )
    with Connection(_url(cluster)) as connection:
        producer = Producer(connection.channel())
        for number in range(20):
            producer.publish(
                {"n": number}, exchange=queue.exchange, routing_key="k-args", declare=[queue]
            )
    with _client(cluster) as client:  # every publish returned only once committed
        overview = must(client.overview("k-args"))
        assert overview.ready == 20
        config = overview.config
        assert config.dead_letter_queue == "k-args-dead"
        assert (config.max_length, config.message_ttl_ms) == (50, 60_000)
        assert "k-args-dead" in client.queues()
    with Connection(_url(cluster)) as connection:  # same queue, other config: refused
        other = Queue("k-args", queue_arguments={"x-max-length": 7})
        with pytest.raises(ChannelError, match="PRECONDITION_FAILED"):
            other(connection.channel()).declare()


def test_credit_ack_reject_requeue(cluster: LocalCluster) -> None:
    queue = Queue("k-settle", queue_arguments={"x-dead-letter-routing-key": "k-settle-dead"})
    with Connection(_url(cluster)) as connection:
        channel = connection.channel()
        producer = Producer(channel)
        for number in range(30):
            producer.publish({"n": number}, routing_key="k-settle", declare=[queue])
        channel.basic_qos(0, 4, False)
        held: list[Any] = []
        with Consumer(channel, [queue], callbacks=[lambda body, m: held.append((body, m))]):
            _drain(connection, held, 4)
            with pytest.raises(TimeoutError):  # credit is 4: nothing more until we settle
                connection.drain_events(timeout=1.0)
            with _client(cluster) as client:
                assert must(client.overview("k-settle")).checked_out == 4
            outcomes: dict[int, int] = {}
            while len(outcomes) < 30:
                body, message = held.pop(0)
                number = body["n"]
                if number % 10 == 3 and not message.delivery_info["redelivered"]:
                    message.requeue()  # comes back, redelivered
                elif number % 10 == 7:
                    message.reject()  # dead-lettered
                    outcomes[number] = -1
                else:
                    message.ack()
                    outcomes[number] = 1
                if not held and len(outcomes) < 30:
                    _drain(connection, held, 1)
    with _client(cluster) as client:
        wait_until(lambda: must(client.overview("k-settle")).total == 0, 10, "k-settle settled")
        assert must(client.overview("k-settle-dead")).ready == 3


def _killed_consumer(cluster: LocalCluster, tmp_path: Path, queue: str) -> None:
    """A separate process takes 3 messages without acking, then gets SIGKILL."""
    script = tmp_path / "consumer.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys, time
            import cluster.integrations.kombu_transport
            from kombu import Connection, Consumer, Queue
            held = []
            with Connection({_url(cluster)!r}) as connection:
                channel = connection.channel()
                channel.basic_qos(0, 3, False)
                with Consumer(channel, [Queue({queue!r})], callbacks=[lambda b, m: held.append(m)]):
                    while len(held) < 3:
                        connection.drain_events(timeout=10)
                    print("holding", flush=True)
                    time.sleep(60)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.strip() == b"holding", line + process.stdout.read()
    process.send_signal(signal.SIGKILL)
    process.wait(10)


def test_unacked_messages_come_back_after_the_consumer_dies(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    with Connection(_url(cluster)) as connection:
        producer = Producer(connection.channel())
        for number in range(5):
            producer.publish({"n": number}, routing_key="k-dies", declare=[Queue("k-dies")])
    _killed_consumer(cluster, tmp_path, "k-dies")
    with _client(cluster) as client:
        overview = wait_until(
            lambda: o if (o := must(client.overview("k-dies"))).checked_out == 0 else None,
            10,
            "returned",
        )
        assert (overview.returned, overview.ready) == (3, 2)
    with Connection(_url(cluster)) as connection:
        received: list[Any] = []
        channel = connection.channel()
        with Consumer(channel, [Queue("k-dies")], callbacks=[lambda b, m: received.append(m)]):
            _drain(connection, received, 5)
        assert sum(m.delivery_info["redelivered"] for m in received) == 3
        for message in received:
            message.ack()


def test_channel_close_returns_unacked(cluster: LocalCluster) -> None:
    with Connection(_url(cluster)) as connection:
        channel = connection.channel()
        Producer(channel).publish({"n": 1}, routing_key="k-close", declare=[Queue("k-close")])
        message = channel.basic_get("k-close")
        assert message is not None and message.payload == {"n": 1}
        with _client(cluster) as client:
            assert must(client.overview("k-close")).checked_out == 1
            channel.close()
            overview = must(client.overview("k-close"))
            assert (overview.checked_out, overview.returned) == (0, 1)


def test_prefetch_change_updates_the_same_consumer(cluster: LocalCluster) -> None:
    queue = Queue("k-qos")
    with Connection(_url(cluster)) as connection:
        channel = connection.channel()
        producer = Producer(channel)
        for number in range(10):
            producer.publish({"n": number}, routing_key="k-qos", declare=[queue])
        channel.basic_qos(0, 2, False)
        held: list[Any] = []
        with Consumer(channel, [queue], callbacks=[lambda body, m: held.append(m)]):
            _drain(connection, held, 2)
            with pytest.raises(TimeoutError):
                connection.drain_events(timeout=0.5)
            channel.basic_qos(0, 5, False)  # as Celery does for ETA tasks
            _drain(connection, held, 5)
            with pytest.raises(TimeoutError):
                connection.drain_events(timeout=0.5)
            with _client(cluster) as client:
                (consumer,) = client.consumers("k-qos")["k-qos"]
                assert (consumer.prefetch, consumer.num_checked_out) == (5, 5)
            for message in held:
                message.ack()
            _drain(connection, held, 10)
            for message in held[5:]:
                message.ack()
    with _client(cluster) as client:
        wait_until(lambda: must(client.overview("k-qos")).total == 0, 10, "k-qos settled")


def test_auto_delete_queue_goes_with_its_channel(cluster: LocalCluster) -> None:
    queue = Queue("k-reply", auto_delete=True)
    with Connection(_url(cluster)) as connection, _client(cluster) as client:
        channel = connection.channel()
        Producer(channel).publish({"n": 1}, routing_key="k-reply", declare=[queue])
        Producer(channel).publish({"n": 2}, routing_key="k-durable", declare=[Queue("k-durable")])
        received: list[Any] = []
        with Consumer(channel, [queue], callbacks=[lambda b, m: received.append(m)], no_ack=True):
            _drain(connection, received, 1)
        assert "k-reply" in client.queues()  # cancelled, but the channel still lives
        with Consumer(channel, [Queue("k-durable")], callbacks=[lambda b, m: m.ack()]):
            connection.drain_events(timeout=10)
        channel.close()
        assert "k-reply" not in client.queues()
        assert "k-durable" in client.queues()


def test_auto_delete_queues_go_when_the_process_exits_without_closing(
    cluster: LocalCluster,
) -> None:
    """A Celery client that ends normally (its reply queue is auto_delete) without closing its
    connection leaves no reply queue behind (issue 34)."""
    script = textwrap.dedent(
        f"""
        from kombu import Connection, Producer, Queue
        import cluster.integrations.kombu_transport
        connection = Connection({_url(cluster)!r})
        channel = connection.channel()
        queue = Queue("k-exit-reply", auto_delete=True)
        Producer(channel).publish({{"n": 1}}, routing_key="k-exit-reply", declare=[queue])
        print("declared")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and "declared" in done.stdout, done.stderr
    with _client(cluster) as client:
        assert "k-exit-reply" not in client.queues()


def test_consumer_goes_on_when_its_node_dies(cluster: LocalCluster) -> None:
    """The client moves to another node; what the dead node had checked out (acked there, the
    acks lost with it) comes back after the queue's disconnected timeout (2 s here) and is
    delivered again, so every message is seen and the queue ends empty. The consumer stays until
    the queue is empty: the last of the 60 may come before the returned ones do."""
    queue = Queue("k-failover", queue_arguments={"x-disconnected-timeout": 2000})
    with Connection(_url(cluster)) as connection, _client(cluster) as client:
        channel = connection.channel()
        producer = Producer(channel)
        for number in range(60):
            producer.publish({"n": number}, routing_key="k-failover", declare=[queue])
        channel.basic_qos(0, 10, False)
        seen: set[int] = set()

        def on_message(body: Any, message: Any) -> None:
            seen.add(body["n"])
            message.ack()

        killed = None
        deadline = time.monotonic() + 60
        try:
            with Consumer(channel, [queue], callbacks=[on_message]):
                while len(seen) < 60 or must(client.overview("k-failover")).total > 0:
                    assert time.monotonic() < deadline, f"seen {len(seen)}, queue not empty"
                    with contextlib.suppress(TimeoutError):
                        connection.drain_events(timeout=0.5)
                    if len(seen) >= 20 and killed is None:
                        killed = channel.qq.node  # the node this connection goes through
                        assert killed is not None
                        cluster.kill(killed)
            assert channel.qq.node != killed
        finally:
            if killed is not None:
                cluster.restart(killed)
                cluster.leader()


def test_plain_quorumq_messages_reach_kombu_as_bytes(cluster: LocalCluster) -> None:
    with _client(cluster) as client:
        client.declare_queue("k-plain")
        client.publish("k-plain", b"\xffraw bytes")
    with Connection(_url(cluster)) as connection:
        channel = connection.channel()
        message = channel.basic_get("k-plain")
        assert message is not None
        assert message.body == b"\xffraw bytes"
        assert message.content_type == "application/data"
        assert message.decode() == b"\xffraw bytes"
        message.ack()
        assert channel.basic_get("k-plain") is None


def test_a_tls_cluster_through_tls_ca_or_data_dir(tmp_path: Path) -> None:
    """`?tls_ca=PATH` (endpoints given) or `?data_dir=D` (the CA found from cluster.toml) reach
    a `tls = true` cluster; without either the transport fails at once, saying TLS."""
    tls_cluster = start_cluster(tmp_path / "D", nodes=3, tls=True)
    try:
        endpoints = ",".join(node.client_address for node in tls_cluster.config.nodes)
        key = tls_cluster.data_dir / "client.key"
        ca = tls_cluster.data_dir / "tls" / "ca.crt"
        urls = (
            f"quorumq://{endpoints}/?credentials={key}&tls_ca={ca}",
            f"quorumq:///?data_dir={tls_cluster.data_dir}",
        )
        for number, url in enumerate(urls):
            with Connection(url) as connection:
                queue = connection.SimpleQueue(f"k-tls-{number}")
                queue.put({"n": number})
                message = queue.get(timeout=10)
                assert message.payload == {"n": number}
                message.ack()
                queue.close()
        with (
            Connection(f"quorumq://{endpoints}/?credentials={key}") as connection,
            pytest.raises(TlsError, match="speaks TLS"),
        ):
            connection.connect()
    finally:
        tls_cluster.stop()
