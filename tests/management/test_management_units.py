"""The management pieces without a cluster: password hashes, users in cluster.toml, sessions
and CSRF tokens, and the samples' rates (the counters of /metrics, differenced)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import fifo
from cluster import config as cluster_config
from cluster.config import UserConfig
from cluster.errors import ConfigError
from cluster.launcher import init_cluster
from cluster.management.auth import Authenticator, Principal, Refused
from cluster.management.passwords import BadPasswordHash, hash_password, verify_password
from cluster.management.samples import Sampler
from cluster.node.metrics import NodeMetrics
from fifo.commands import DeclareQueue, Enqueue
from fifo.replies import Ok

KEY = b"ab" * 32


def test_a_password_hash_verifies_its_password_only() -> None:
    """Salted: two hashes of one password differ; a wrong password or a broken hash fails."""
    encoded = hash_password("s3cret")
    assert encoded != hash_password("s3cret")
    assert verify_password("s3cret", encoded)
    assert not verify_password("s3cret!", encoded)
    with pytest.raises(BadPasswordHash):
        verify_password("s3cret", "md5$abc")
    with pytest.raises(BadPasswordHash):
        verify_password("s3cret", "scrypt$1048576$8$64$00$00")  # asks for 64 GiB


def test_users_round_trip_through_cluster_toml_and_bad_ones_are_refused(tmp_path: Path) -> None:
    """[[users]] and http_port are written and read back; admin, duplicates, unknown rights
    are refused with the file named."""
    config = init_cluster(tmp_path, 1, http_base_port=18000)
    user = UserConfig("ops", hash_password("pw"), "read")
    cluster_config.write(tmp_path, dataclasses.replace(config, users=(user,)))
    loaded = cluster_config.load(tmp_path)
    assert loaded.users == (user,) and loaded.nodes[0].http_port == 18000
    text = (tmp_path / "cluster.toml").read_text()
    for bad in ('name = "admin"', 'name = "quorumq"', 'rights = "root"'):
        broken = text.replace('name = "ops"', bad) if "name" in bad else text.replace(
            'rights = "read"', bad)  # fmt: skip
        (tmp_path / "cluster.toml").write_text(broken)
        with pytest.raises(ConfigError, match=r"cluster\.toml"):
            cluster_config.load(tmp_path)


def test_sessions_are_signed_and_a_tampered_or_foreign_one_is_refused() -> None:
    """A session names its user; changing one byte, or another cluster's key, voids it; its
    CSRF token is stable for it and differs between sessions."""
    user = UserConfig("ops", hash_password("pw"), "read")
    auth = Authenticator(KEY, (user,), "cookie")
    principal = asyncio.run(auth.check_password("ops", "pw"))
    assert principal == Principal("ops", "read")
    token = auth.new_session(principal)
    assert auth.from_session(token) == Principal("ops", "read", token)
    assert auth.csrf_token(token) == auth.csrf_token(token) != auth.csrf_token(
        auth.new_session(principal))  # fmt: skip
    flipped = token[:5] + ("A" if token[5] != "A" else "B") + token[6:]
    assert auth.from_session(flipped) is None
    assert Authenticator(b"cd" * 32, (user,), "cookie").from_session(token) is None
    assert asyncio.run(auth.check_password("admin", KEY.decode())) == Principal("admin", "admin")
    quorumq = asyncio.run(auth.check_password("quorumq", KEY.decode()))  # AMQP's name for it
    assert quorumq == Principal("quorumq", "admin")
    with pytest.raises(Refused):
        asyncio.run(auth.check_password("ops", "wrong"))
    gone = Authenticator(KEY, (), "cookie")  # the user was removed from cluster.toml
    assert gone.from_session(token) is None


class FakeReplica:
    """Just `read`, over a fifo state this test drives."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def read(self, query: Callable[[Any], Any]) -> Any:
        return query(self)


def test_rates_are_the_differences_of_the_metrics_counters_over_the_interval() -> None:
    """10 publishes counted between two samples 5 s apart: 2.0/s and depth 10, the counter
    that /metrics exports; the queue, first seen after its publishes, shows them as a rate."""
    state = fifo.init_state(3)
    replica = FakeReplica(state)
    metrics = NodeMetrics("n1", lambda: replica, lambda: 0, None)  # type: ignore[arg-type,return-value]
    wall = [1_000_000]
    sampler = Sampler(lambda: replica, metrics, wall_ms=lambda: wall[0])  # type: ignore[arg-type,return-value]
    index = iter(range(1, 100))

    def apply(command: Any) -> None:
        reply, _ = fifo.apply(fifo.Meta(next(index), 1, 1000, 3), command, state)
        assert reply == Ok() or type(reply).__name__ == "DeclareOk"
        metrics.count(command, lambda _reply: None)(reply)

    sampler.sample()
    apply(DeclareQueue("jobs"))
    for n in range(10):
        apply(Enqueue("jobs", f"m{n}".encode(), None, None, None, None))
    wall[0] += 5000
    sampler.sample()
    series = sampler.series("jobs")
    assert series["t"] == [1_000_000, 1_005_000]
    assert series["published"] == [0, 10] and series["total"] == [0, 10]
    assert series["publish_rate"] == [None, 2.0]
    assert sampler.latest_rates("jobs")["publish_rate"] == 2.0
    assert sampler.series()["published"][-1] == 10  # the totals
