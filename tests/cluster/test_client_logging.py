"""The client library logs like a library: through `logging`, once per event, never on stdout.

A leader change under a publishing client (the client sits on the leader, which is killed) is
one WARNING record of the `quorumq.client` logger, whatever number of frames the nodes refused
meanwhile; nothing is printed on stdout, and below WARNING nothing reaches stderr either (the
application's logging configuration decides). Both shells (threaded and asyncio).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from cluster.launcher import LocalCluster, local_cluster
from tests.cluster.kill_midway import kill_when_confirmed
from tests.cluster.shells import Shells


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("logging") / "D", 3) as running:
        yield running


@pytest.mark.cluster
def test_a_leader_change_under_a_publisher_is_one_warning_record_and_nothing_on_stdout(
    cluster: LocalCluster,
    shells: Shells,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    leader = cluster.leader()
    total = 1500
    with shells.client(cluster, leader, reconnect_timeout_s=20.0) as client:
        client.declare_queue("logged")
        with (
            client.publisher("logged", window=100) as publisher,
            kill_when_confirmed(cluster, leader, publisher, total // 3) as killed,
        ):
            publisher.publish_many((b"m%d" % i for i in range(total)), timeout_s=30.0)
            publisher.wait_for_confirms(timeout_s=30.0)
            assert killed.wait(10.0)
        assert publisher.confirmed == total
        assert client.reconnects >= 1
    out = capfd.readouterr().out
    assert out == "", f"the client printed on stdout: {out[:500]!r}"
    records = [r for r in caplog.records if r.name.startswith("quorumq")]
    assert len(records) == 1, [r.getMessage() for r in records]
    (record,) = records
    assert record.levelno == logging.WARNING
    assert record.name == "quorumq.client"
    assert "reconnected" in record.getMessage() and leader in record.getMessage()


def test_a_client_logger_goes_through_logging_with_its_event_and_context(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    from cluster.client._log import get_logger

    caplog.set_level(logging.INFO, logger="quorumq.client")
    log = get_logger("quorumq.client")
    log.debug("hidden_below_the_level", queue="q")
    log.info("something_happened", queue="q", count=3)
    (record,) = [r for r in caplog.records if r.name == "quorumq.client"]
    assert record.levelno == logging.INFO
    assert record.getMessage() == "something_happened queue='q' count=3"
    assert record.__dict__["quorumq_event"] == "something_happened"
    assert record.__dict__["quorumq_context"] == {"queue": "q", "count": 3}
    assert capfd.readouterr().out == ""
